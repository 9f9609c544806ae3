"""Every writer's storage failures are one line, whichever library raises them, and lose nothing.

The libraries that write for the harness do not all raise ``OSError`` when the disk is full, read-only or not
ours: safetensors raises ``SafetensorError``, tokenizers a plain ``Exception``, ``torch.save`` a ``RuntimeError``
without an errno. ``LIBRARY_ERRORS`` holds what each raised in that situation, recorded with safetensors 0.8,
tokenizers 0.23 and torch 2.13 writing into a full 64 KiB tmpfs (ENOSPC), a read-only tmpfs mount (EROFS) and, as
an unprivileged user, a folder owned by root (EACCES). The tests make each library's write function raise exactly
that, after writing part of its file as the real failure does, because the suite cannot count on mounting file
systems or on running as another user (it runs as root here, and root ignores permissions).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from stabledrl_bench import atomic
from stabledrl_bench.atomic import storage_failure
from stabledrl_bench.cli import COMMANDS, main
from stabledrl_bench.core.models import build_tiny, save_diffusion_lm
from stabledrl_bench.errors import UserError

ERRNOS = {"ENOSPC": errno.ENOSPC, "EROFS": errno.EROFS, "EACCES": errno.EACCES}
SMALL = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}


def library_error(library: str, number: int, path: str = "/x/.tmpEX4pSl") -> BaseException:
    """What ``library`` raised when the storage failed with ``number`` (recorded; see the module docstring)."""
    reason = os.strerror(number)
    at = "" if number == errno.ENOSPC else f' at path "{path}"'
    if library == "safetensors":
        return SafetensorError(f"Error while serializing: I/O error: {reason} (os error {number}){at}")
    if library == "tokenizers":
        return Exception(f"{reason} (os error {number})")
    if library == "torch":
        if number == errno.ENOSPC:
            return RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        return RuntimeError(f"[enforce fail at inline_container.cc:747] . open file failed with strerror: {reason}")
    return OSError(number, reason, path)


def failing(library: str, number: int) -> Callable[..., None]:
    """A stand-in for ``library``'s write function: part of the file, then the library's own error."""

    def write(obj, path, *args, **kwargs) -> None:
        path = path if isinstance(path, str | os.PathLike) else path.name  # torch.save takes a path or a file
        if number == errno.ENOSPC:
            Path(path).write_bytes(b"\x00" * 64)
        raise library_error(library, number, str(path))

    return write


REASON = {
    "ENOSPC": "No space left on device",
    "EROFS": "Read-only file system",
    "EACCES": "Permission denied",
}


def expected_reason(library: str, name: str) -> str:
    """The reason the error line gives, as a regular expression."""
    if library == "torch" and name == "ENOSPC":
        return re.escape("PyTorch's writer stopped part-way (is the disk full?)")
    return REASON[name]


def files(folder: Path) -> list[str]:
    """Every file under ``folder`` (folders created on the way do not count: they hold nothing)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(**SMALL)


# ------------------------------------------------------------------------------------------------- writers
@pytest.mark.parametrize("name", ERRNOS)
@pytest.mark.parametrize("library", ["safetensors", "tokenizers"])
def test_a_model_save_fails_in_one_line_and_keeps_the_previous_folder(tiny, tmp_path, monkeypatch, library, name):
    save_diffusion_lm(tiny, tmp_path / "final")
    before = files(tmp_path)
    if library == "safetensors":  # the weights, as transformers' save_pretrained writes them
        monkeypatch.setattr("transformers.modeling_utils.safe_save_file", failing(library, ERRNOS[name]))
    else:  # tokenizer.json, written by the tokenizers library (a Rust object: replaced by a stand-in here)
        backend = tiny.tokenizer._tokenizer

        class Backend:
            save = staticmethod(lambda path, *args: failing(library, ERRNOS[name])(None, path))

            def __getattr__(self, attribute):
                return getattr(backend, attribute)

        monkeypatch.setattr(tiny.tokenizer, "_tokenizer", Backend())
    with pytest.raises(UserError, match=rf"^cannot write {tmp_path / 'final'}: {expected_reason(library, name)}$"):
        save_diffusion_lm(tiny, tmp_path / "final")
    assert files(tmp_path) == before


@pytest.mark.parametrize("name", ERRNOS)
@pytest.mark.parametrize("library", ["safetensors", "torch"])
def test_a_checkpoint_fails_in_one_line_and_leaves_no_half_checkpoint(tmp_path, monkeypatch, library, name):
    """safetensors writes the model inside accelerate's save_state; torch.save the optimizer and the trainer state."""
    from accelerate import Accelerator

    from stabledrl_bench.training.checkpoint import latest_checkpoint, save_checkpoint

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    model, _optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    save_checkpoint(accelerator, tmp_path, 1, {"step": 1})
    before = files(tmp_path)
    target = "accelerate.utils.other.safe_save_file" if library == "safetensors" else "torch.save"
    monkeypatch.setattr(target, failing(library, ERRNOS[name]))
    step = tmp_path / "checkpoints" / "step_000002"
    with pytest.raises(UserError, match=rf"^cannot write {step}: {expected_reason(library, name)}$"):
        save_checkpoint(accelerator, tmp_path, 2, {"step": 2})
    assert files(tmp_path) == before and latest_checkpoint(tmp_path).name == "step_000001"


def os_failure(monkeypatch, name: str) -> None:
    """The file system failing under Python's own writes: a full disk when the data reach it (``fsync``), a
    read-only or forbidden folder when the temporary file is created (``os.open``)."""
    number = ERRNOS[name]
    if number == errno.ENOSPC:

        def full(descriptor: int) -> None:
            raise OSError(number, os.strerror(number))

        monkeypatch.setattr(atomic.os, "fsync", full)
        return
    opened = os.open

    def refused(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise OSError(number, os.strerror(number), path)
        return opened(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)


@pytest.mark.parametrize("name", ERRNOS)
def test_a_result_record_fails_in_one_line_and_writes_nothing(tmp_path, monkeypatch, name) -> None:
    from test_results import store

    os_failure(monkeypatch, name)
    with pytest.raises(UserError, match=rf"^cannot write {tmp_path}/.*\.jsonl?: {REASON[name]}$"):
        store(tmp_path, [True, False])
    assert files(tmp_path) == []


@pytest.mark.parametrize("name", ERRNOS)
def test_a_plot_fails_in_one_line_and_writes_nothing(tmp_path, monkeypatch, name) -> None:
    """matplotlib renders into memory; the PNG reaches the disk through the atomic writer."""
    from stabledrl_bench.plots import new_figure, save_png

    fig = new_figure(2, 2)
    os_failure(monkeypatch, name)
    with pytest.raises(UserError, match=rf"^cannot write {tmp_path / 'plot.png'}: {REASON[name]}$"):
        save_png(fig, tmp_path / "plot.png")
    assert files(tmp_path) == []


@pytest.mark.parametrize("name", ERRNOS)
def test_lm_evals_output_fails_in_one_line_after_the_table(tmp_path, monkeypatch, capsys, name) -> None:
    """lm-eval's tracker writes --output_path with pathlib and swallows what that raises; with the adapter imported,
    a storage failure ends the run with one line and status 2, the results table printed first."""
    from lm_eval.loggers.evaluation_tracker import EvaluationTracker

    import stabledrl_bench.evaluation.lmeval_adapter  # noqa: F401  (what importing the task YAMLs does)

    number = ERRNOS[name]

    def write_text(path, text, *args, **kwargs):
        if number == errno.ENOSPC:
            with open(path, "w") as handle:
                handle.write(text[:10])
        raise OSError(number, os.strerror(number), str(path))

    results = {
        "results": {"dllm_countdown": {"alias": "dllm_countdown", "acc,none": 0.25, "acc_stderr,none": 0.1}},
        "versions": {"dllm_countdown": 1},
        "n-shot": {"dllm_countdown": 0},
        "higher_is_better": {"dllm_countdown": {"acc": True}},
    }
    tracker = EvaluationTracker(output_path=str(tmp_path / "out"))
    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(SystemExit) as stopped:
        tracker.save_results_aggregated(results=results, samples=None)
    captured = capsys.readouterr()
    assert stopped.value.code == 2 and "dllm_countdown" in captured.out and "0.25" in captured.out
    assert (
        captured.err.splitlines()[-1]
        == f"error: cannot write lm-eval's results under {tmp_path / 'out'}: {REASON[name]}"
    )
    monkeypatch.undo()
    before = set((tmp_path / "out").rglob("results_*.json"))  # a full disk leaves lm-eval's part-written file
    tracker.save_results_aggregated(results=results, samples=None)  # a working disk: lm-eval's own behaviour
    assert len(set((tmp_path / "out").rglob("results_*.json")) - before) == 1


# ----------------------------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("name", ERRNOS)
@pytest.mark.parametrize("library", ["safetensors", "tokenizers", "torch", "os"])
def test_the_cli_prints_any_librarys_storage_failure_in_one_line(monkeypatch, capsys, library, name) -> None:
    """The backstop for a write that no writer above wrapped: one line, exit status 2."""

    def command(args) -> int:
        raise library_error(library, ERRNOS[name], "/results/x.json")

    monkeypatch.setitem(COMMANDS, "leaderboard", command)
    assert main(["leaderboard"]) == 2
    where = "/results/x.json" if library == "os" else f"a write ({type(library_error(library, 1)).__name__})"
    [line] = capsys.readouterr().err.splitlines()
    assert re.fullmatch(f"error: {re.escape(where)}: {expected_reason(library, name)}", line)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory"),
        FileNotFoundError(errno.ENOENT, "No such file or directory", "internal.txt"),
        SafetensorError("Error while deserializing header: HeaderTooLarge"),
        ValueError("a bug (os error 999)"),
    ],
)
def test_anything_else_keeps_its_traceback(monkeypatch, exc) -> None:
    def command(args) -> int:
        raise exc

    assert storage_failure(exc) is None
    monkeypatch.setitem(COMMANDS, "leaderboard", command)
    with pytest.raises(type(exc)):
        main(["leaderboard"])
