"""Every command against bad input: exit status 2, exactly one ``error:`` line, no traceback, nothing destroyed.

Each case names its arguments (placeholders in capitals are files the case sets up in a temporary folder) and a
piece of the message. Cheap problems must be caught before expensive work: the cases that would otherwise
load a model or decode run with a model path that does not load, so a late check shows up as the wrong message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tqdm.auto import tqdm

from stabledrl_bench.cli import main
from stabledrl_bench.errors import UserError, comma_list


@pytest.fixture
def checkpoint(small_checkpoint: Path) -> Path:
    return small_checkpoint


def _damaged(root: Path, checkpoint: Path, how: str) -> Path:
    """A copy of the tiny checkpoint broken in one way."""
    folder = root / f"damaged-{how}"
    folder.mkdir()
    for item in checkpoint.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    weights = folder / "model.safetensors"
    if how == "empty":
        weights.write_bytes(b"")
    elif how == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif how == "noweights":
        weights.unlink()
    elif how == "tokenizer":
        (folder / "tokenizer.json").write_text('{"version": ')
    elif how == "config":
        (folder / "config.json").write_text("{")
    elif how == "vocab":  # a token the model has no embedding row for (an added token, embeddings not resized)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
        rows = json.loads((folder / "config.json").read_text())["vocab_size"]
        tokenizer.add_tokens([f"<beyond{i}>" for i in range(rows - len(tokenizer) + 1)])
        tokenizer.save_pretrained(folder)
    return folder


def _files(root: Path, checkpoint: Path) -> dict[str, str]:
    """The placeholders a case may use, each a path in ``root``."""
    configs = {
        "NONUTF8": b"task: sudoku\n\xff\xfe bad bytes\n",
        "ZEROPROMPTS": b"per_device_prompts: 0\n",
        "NEGSAVE": b"save_every: -3\n",
        "ZEROSTEPS": b"budget:\n  max_steps: 0\n",
        "BUDGETTYPE": b"budget: 5\n",
        "ZEROMICRO": b"estimator_micro_batch: 0\n",
        "SFTBATCH": b"batch_size: 0\n",
        "SFTCANVAS": b"max_completion_length: 0\n",
        "INFLR": b"optim:\n  learning_rate: .inf\n",
        "NANLR": b"optim:\n  learning_rate: .nan\n",
        "NANCLIP": b"optim:\n  max_grad_norm: .nan\n",
        "NANTEMP": b"budget:\n  temperature: .nan\n",
        "BETA": b"optim:\n  adam_beta2: 1.0\n",
        "HUGESEED": b"seed: 9223372036854775808\n",
        # a few hundred bytes that share nodes: 9 levels of 9 aliases expand to 9**9 values when walked
        "BOMB": (
            "a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
            + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
            + "generator_options: {pool: *a8}\n"
        ).encode(),
    }
    paths = {}
    for name, data in configs.items():
        path = root / f"{name.lower()}.yaml"
        path.write_bytes(data)
        paths[name] = str(path)
    for how in ("empty", "truncated", "noweights", "tokenizer", "config", "vocab"):
        paths[f"DAMAGED_{how.upper()}"] = str(_damaged(root, checkpoint, how))
    a_file = root / "a-file.txt"
    a_file.write_text("keep me\n")
    paths["FILE"] = str(a_file)
    paths["UNDERFILE"] = str(a_file / "sub")
    a_dir = root / "a-dir"
    a_dir.mkdir()
    (a_dir / "keep.txt").write_text("keep me\n")
    paths["DIR"] = str(a_dir)
    runs = {
        "GARBLEDRUN": "{not json",
        "NOBUDGETRUN": json.dumps({"config": {}}),
        "JUNKRUN": json.dumps({"budget": {"max_steps": 1, "made_up": 2}}),
        "HUGEINTRUN": '{"budget": ' + "9" * 5000 + "}",
    }
    for name, content in runs.items():
        run = root / name.lower()
        run.mkdir()
        (run / "run.json").write_text(content)
        paths[name] = str(run)
    paths["CKPT"] = str(checkpoint)
    paths["MISSING"] = str(root / "does-not-exist")
    (root / "dangling").symlink_to(root / "nowhere")
    paths["DANGLING"] = str(root / "dangling")
    for name, text in {"HUGEINT": '{"n": ' + "7" * 5000 + "}", "DEEP": "[" * 100_000 + "]" * 100_000}.items():
        results = root / name.lower()
        results.mkdir()
        (results / "r.json").write_text(text)
        paths[name] = str(results)
    return paths


CASES = [
    # train
    (["train", "--config", "NONUTF8"], "not UTF-8"),
    (["train", "--config", "ZEROPROMPTS"], "per_device_prompts must be positive"),
    (["train", "--config", "NEGSAVE"], "save_every must be >= 0"),
    (["train", "--config", "ZEROSTEPS"], "budget.max_steps must be positive"),
    (["train", "--config", "BUDGETTYPE"], "expected a mapping"),
    (["train", "--config", "ZEROMICRO"], "estimator_micro_batch must be positive"),
    # a budget under which the method cannot learn: its advantage rule compares the completions of a prompt
    (["train", "--set", "budget.num_generations=1"], "which needs at least 2 per prompt; with fewer every advantage"),
    # non-finite and out-of-range numbers: refused where they are read, naming the field
    (["train", "--config", "INFLR"], "learning_rate must be a finite number, got inf"),
    (["train", "--config", "NANLR"], "optim.learning_rate: expected a number, got nan"),
    (["train", "--config", "NANCLIP"], "optim.max_grad_norm: expected a number, got nan"),
    (["train", "--config", "NANTEMP"], "budget.temperature: expected a number, got nan"),
    (["train", "--config", "BETA"], "adam_beta1 and adam_beta2 must lie in [0, 1)"),
    (["train", "--config", "HUGESEED"], "seed: 9223372036854775808 does not fit in 64 bits"),
    (["train", "--seed", "1e30"], "--seed: must be an integer from 0 to 2**63 - 1"),
    (["eval", "--model", "CKPT", "--task", "sudoku", "--seed", "-1"], "--seed: must be an integer from 0"),
    (["reproduce", "table1", "--seeds", "0,99999999999999999999"], "--seeds: expected integers from 0 to 2**63"),
    (["grade", "--task", "countdown", "--input", "FILE", "--output", "FILE"], "is the input file"),
    # bounded parsing and output folders checked before the work
    (["train", "--config", "BOMB"], "more than 100,000 values once YAML aliases are expanded"),
    (["leaderboard", "--results", "HUGEINT"], "not readable JSON (ValueError"),
    (["leaderboard", "--results", "DEEP"], "not readable JSON (RecursionError"),
    (["verify", "--results", "HUGEINT", "--no-weights"], "1 of 1 result records and 0 stability records do not add up"),
    (["train", "--model", "DAMAGED_EMPTY", "--output-dir", "DANGLING"], "is a link to nothing"),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--results", "DANGLING"], "is a link to nothing"),
    (["train", "--max-steps", "0"], "--max-steps: must be a positive integer"),
    (["train", "--max-steps", "-1"], "--max-steps: must be a positive integer"),
    (["train", "--max-steps", "two"], "--max-steps: must be a positive integer"),
    (["train", "--stop-after", "0"], "--stop-after: must be a positive integer"),
    (["train", "--stop-after", "-1"], "--stop-after: must be a positive integer"),
    (["train", "--model", "MISSING"], "model path does not exist"),
    (["train", "--model", "DAMAGED_EMPTY"], "cannot load the weights"),
    (["train", "--model", "DAMAGED_TRUNCATED"], "cannot load the weights"),
    (["train", "--model", "DAMAGED_NOWEIGHTS"], "cannot load the model"),
    (["train", "--model", "DAMAGED_TOKENIZER"], "cannot load the tokenizer"),
    (["train", "--model", "DAMAGED_CONFIG"], "cannot load the config"),
    (["eval", "--model", "DAMAGED_VOCAB", "--task", "sudoku"], "do not belong together"),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "nonesuch"], "unknown task 'nonesuch'"),
    (["train", "--model", "DAMAGED_EMPTY", "--output-dir", "FILE"], "output_dir FILE is a file"),
    (["train", "--model", "DAMAGED_EMPTY", "--output-dir", "UNDERFILE"], "is a file"),
    (["train", "--baseline", "nope", "--model", "DAMAGED_EMPTY"], "unknown baseline"),
    (["train", "--task", "nope", "--model", "DAMAGED_EMPTY"], "unknown task"),
    # sft
    (["sft", "--config", "NONUTF8"], "not UTF-8"),
    (["sft", "--config", "SFTBATCH"], "batch_size must be positive"),
    (["sft", "--config", "SFTCANVAS"], "max_completion_length must be positive"),
    (["sft", "--max-steps", "0"], "--max-steps: must be a positive integer"),
    (["sft", "--max-steps", "-5"], "--max-steps: must be a positive integer"),
    (["sft", "--model", "DAMAGED_TRUNCATED"], "cannot load the weights"),
    (["sft", "--model", "DAMAGED_EMPTY", "--output-dir", "FILE"], "output_dir FILE is a file"),
    # eval: cheap checks first (the model would not load, so a late check would give another message)
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--length", "0"], "--length: must be a positive"),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--limit", "0"], "--limit: must be a positive"),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--batch-size", "0"], "--batch-size: must be"),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--batch-size", "-1"], "--batch-size: must be"),
    (
        ["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--max-completion-length", "0"],
        "--max-completion-length: must be",
    ),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--length", "16"], "table1 reports lengths"),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "nope"], "unknown task"),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--protocol", "nope"], "unknown evaluation protocol"),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--baseline", "nope"], "unknown baseline"),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--baseline", "grpo"], "need --run"),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--results", "FILE"], "--results FILE is a file"),
    (
        ["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--baseline", "grpo", "--run", "GARBLEDRUN"],
        "not readable JSON",
    ),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--baseline", "grpo", "--run", "NOBUDGETRUN"], "budget"),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--baseline", "grpo", "--run", "DIR"], "no run.json"),
    (
        ["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--baseline", "grpo", "--run", "JUNKRUN"],
        "made_up",
    ),
    (["eval", "--model", "DAMAGED_EMPTY", "--task", "sudoku", "--baseline", "grpo", "--run", "HUGEINTRUN"], "readable"),
    (["eval", "--model", "DAMAGED_NOWEIGHTS", "--task", "sudoku"], "cannot load the model"),
    (["eval", "--model", "CKPT", "--task", "sudoku", "--batch-size", "x"], "--batch-size: must be"),
    # reproduce
    (["reproduce", "table1", "--limit", "0"], "--limit: must be a positive"),
    (["reproduce", "table1", "--preset", "paper", "--model", "MISSING"], "model path does not exist"),
    (["reproduce", "table1", "--preset", "smoke", "--results", "FILE"], "--results FILE is a file"),
    (["reproduce", "table3"], "invalid choice"),
    # check-model, leaderboard, grade, list, unknown commands
    (["check-model", "--model", "DAMAGED_TOKENIZER"], "cannot load the tokenizer"),
    (["check-model", "--model", "CKPT", "--processes", "0"], "--processes: must be a positive"),
    (
        ["eval", "--model", "CKPT", "--task", "sudoku", "--max-completion-length", "4096"],
        "--max-completion-length 4096 does not fit the model's 2048 positions",
    ),
    (["leaderboard", "--out", "DIR"], "--out DIR is a directory"),
    (["leaderboard", "--results", "FILE"], "--results FILE is a file"),
    (["grade", "--task", "countdown", "--input", "MISSING"], "not found"),
    (["grade", "--task", "countdown", "--input", "DIR"], "is a directory"),
    (["grade", "--task", "nope", "--input", "FILE"], "invalid choice"),
    (["list", "nope"], "invalid choice"),
    (["nope"], "invalid choice"),
    (["eval", "--task", "sudoku"], "required"),
    (["stress", "drift", "--rollouts", "0"], "--rollouts: must be a positive integer"),
    (["stress", "exploding", "--steps", "-2"], "--steps: must be a positive integer"),
    (["stress", "hull", "--trials", "x"], "--trials: must be a positive integer"),
    (["stress", "nope"], "invalid choice"),
]


if not torch.cuda.is_available():  # only a machine without CUDA can show this one
    CASES.append(
        (["check-model", "--model", "CKPT", "--device", "cuda:0"], "--device cuda:0: this machine has no CUDA")
    )


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_error_line_and_destroys_nothing(
    argv, message, checkpoint, tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a case whose check regressed writes its default outputs here, never into the repo
    paths = _files(tmp_path, checkpoint)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    resolved = [paths.get(arg, arg) for arg in argv]
    assert main(resolved) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    shown = message.replace("FILE", paths["FILE"]).replace("DIR", paths["DIR"])
    assert shown in lines[0], lines[0]
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert {p: after.get(p) for p in before} == before  # nothing overwritten or deleted


def test_an_error_during_a_progress_bar_starts_its_own_line(monkeypatch, capsys) -> None:
    import stabledrl_bench.cli as cli

    def fail(args) -> int:
        bar = tqdm(total=10, desc="working")
        bar.update(3)
        raise UserError("something went wrong")

    monkeypatch.setitem(cli.COMMANDS, "leaderboard", fail)
    assert main(["leaderboard"]) == 2
    err = capsys.readouterr().err
    assert "\nerror: something went wrong" in err or err.startswith("error: something went wrong")


def test_a_bom_does_not_break_the_first_line_of_a_grade_input(tmp_path, capsys) -> None:
    path = tmp_path / "in.jsonl"
    row = {"prediction": "<answer>3+4-5</answer>", "numbers": [3, 4, 5], "target": 2}
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(row).encode() + b"\n")
    out = tmp_path / "out.jsonl"
    assert main(["grade", "--task", "countdown", "--input", str(path), "--output", str(out)]) == 0
    assert json.loads(out.read_text().splitlines()[0])["correct"] is True


@pytest.mark.parametrize(
    ("text", "kwargs", "expected"),
    [
        ("0, 1,1 ,2,", {"kind": int}, [0, 1, 2]),
        ("grpo,spg,grpo", {"choices": ("grpo", "spg", "espo")}, ["grpo", "spg"]),
        ("0.5,1e-3", {"kind": float}, [0.5, 1e-3]),
    ],
)
def test_comma_list_keeps_order_and_drops_repeats(text, kwargs, expected):
    assert comma_list(text, "--opt", **kwargs) == expected


@pytest.mark.parametrize(
    ("text", "kwargs", "message"),
    [
        (" , ", {}, "--opt: no value given in ' , '"),
        ("1,x", {"kind": int}, "--opt: expected comma-separated int values, got '1,x'"),
        ("grpo,nope,zap", {"choices": ("grpo", "spg"), "what": "baseline"},
         "--opt: unknown baseline(s) nope, zap; choose from grpo, spg"),
    ],
)  # fmt: skip
def test_comma_list_rejects_bad_input_in_one_line(text, kwargs, message):
    with pytest.raises(UserError) as info:
        comma_list(text, "--opt", **kwargs)
    assert str(info.value) == message


def test_eval_refuses_a_model_with_non_finite_weights(checkpoint, tmp_path, capsys) -> None:
    from safetensors.torch import load_file, save_file

    broken = _damaged(tmp_path, checkpoint, "copy")
    tensors = load_file(str(broken / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name][0] = float("nan")
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    results = tmp_path / "results"
    argv = ["eval", "--model", str(broken), "--task", "sudoku", "--limit", "1", "--results", str(results)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has non-finite weights in 1 tensor(s)" in err[0] and "refusing" in err[0]
    assert not results.exists() or not any(results.rglob("*.json"))


def test_a_second_run_into_a_locked_folder_refuses(checkpoint, tmp_path, capsys) -> None:
    from stabledrl_bench.training.checkpoint import exclusive

    out = tmp_path / "run"
    with exclusive(out, "training run"):  # as a running `train` holds it
        assert main(["train", "--model", str(checkpoint), "--task", "sudoku", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is in use by another training run" in err[0], err
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written by the refused run


class _Canary:
    """A pickle that, when loaded by a loader that runs code, creates the file it names."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_resuming_a_run_folder_from_elsewhere_runs_none_of_its_pickles(checkpoint, tmp_path, capsys) -> None:
    """A run folder someone sends you: ``train`` resumes it, so its ``state.pt`` must be read as data only."""
    ran = tmp_path / "RAN"
    run = tmp_path / "run"
    step = run / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    torch.save({"state": {"step": 2, "budget_hash": _Canary(ran)}}, step / "state.pt")
    argv = ["train", "--model", str(checkpoint), "--task", "sudoku", "--output-dir", str(run), "--resume"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read checkpoint" in err[0] and "UnpicklingError" in err[0]
    assert not ran.exists()


def test_restoring_optimizer_state_runs_none_of_its_pickles(tmp_path) -> None:
    """The optimizer, scheduler and RNG files come through accelerate's loader, which must read them as data too."""
    from accelerate import Accelerator

    from stabledrl_bench.training.checkpoint import load_checkpoint

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    model, _optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.save_state(str(tmp_path / "ckpt" / "accelerate"))
    ran = tmp_path / "RAN"
    torch.save({"state": _Canary(ran)}, tmp_path / "ckpt" / "accelerate" / "optimizer.bin")
    with pytest.raises(UserError, match=r"cannot read checkpoint .*ckpt: UnpicklingError"):
        load_checkpoint(accelerator, tmp_path / "ckpt")
    assert not ran.exists()
