"""The one experiment runner: every experiment is a set of declared jobs run by these few functions.

The Table 1/2 reproduction (:mod:`.reproduce`) and the stability experiments (:mod:`.stress`) differ in what they
train and what they measure, not in how: both build a warm start, train runs from it, compare each run with a frozen
control, and write records. So they share

* one warm start: :class:`WarmStart` (an optional fresh tiny model, then masked-diffusion SFT), built once by
  :func:`ensure_warm_start` into a folder that remembers the spec it was built from;
* one rollout path: every run is an :class:`~stabledrl_bench.training.trainer.RLTrainer` run, and experiments that
  need rollouts without training take them from :meth:`RLTrainer.sample_rollout` (same prompts, same random streams);
* one frozen control: :func:`control_config`, the same run with learning rate 0 (its parameters never change, and it
  draws the same prompts with the same random numbers as every run of its seed);
* one cache: a run's folder remembers the hash of its :class:`TrainJob` (:meth:`TrainJob.key`); a finished run with the
  same hash is reused, an interrupted one resumes, and a folder holding another configuration is never overwritten
  silently;
* one record writer: :func:`stabledrl_bench.reporting.results.write_json_record` (evaluation results add their own
  validation on top, :func:`~stabledrl_bench.reporting.results.write_result`).

Adding an experiment means declaring its jobs (a :class:`WarmStart`, :class:`TrainJob` s built from a
``TrainConfig``) and writing its report; nothing here changes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.config import NOT_IDENTITY, stable_hash, to_dict
from stabledrl_bench.core.baseline import build_baseline
from stabledrl_bench.core.models import build_tiny, save_diffusion_lm
from stabledrl_bench.errors import UserError
from stabledrl_bench.experiments.starts import copy_start, find_start
from stabledrl_bench.experiments.workers import Progress, Stage, run_graph
from stabledrl_bench.processes import barrier, is_main_process
from stabledrl_bench.reporting.provenance import environment_info, git_state
from stabledrl_bench.training.checkpoint import latest_checkpoint
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.runlog import read_log
from stabledrl_bench.training.sft import SFTConfig, run_sft
from stabledrl_bench.training.trainer import OldEstimateHook, RLTrainer, TrainingDiverged
from stabledrl_bench.training.validation import ValidationConfig

WARM_START_FILE = "warm_start.json"
JOB_FILE = "job.json"  # a run folder's identity, written before training starts
SUMMARY_FILE = "summary.json"  # written when the run has finished (or stopped on non-finite steps)
# The frozen control trains with learning rate 0, so the loss it computes is irrelevant; GRPO is the cheapest
# estimator-driven loss that every task supports.
CONTROL_BASELINE = "grpo"
REF_SYNC_FIELDS = ("sync_ref_model", "ref_model_sync_steps", "ref_model_mixup_alpha")


def _identity(config: Any, *drop: str) -> dict[str, Any]:
    return {k: _hashable(v) for k, v in to_dict(config).items() if k not in (*NOT_IDENTITY, *drop)}


def _hashable(value: Any) -> Any:
    """``value`` with non-finite floats spelled as strings (``inf`` is a real setting, e.g. "never clip", and the
    canonical JSON that :func:`stable_hash` hashes has no number for it)."""
    if isinstance(value, dict):
        return {k: _hashable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_hashable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


# ------------------------------------------------------------------------------------------------ warm start
@dataclass(frozen=True)
class WarmStart:
    """A starting point for RL: optionally a freshly initialised tiny model of shape ``init``, then SFT ``sft``.

    ``init`` holds :func:`~stabledrl_bench.core.models.build_tiny` arguments (e.g. a smaller stress model); when it
    is None, SFT starts from ``sft.model`` (a tiny preset name or a checkpoint).
    """

    sft: SFTConfig
    init: Mapping[str, Any] | None = None

    def identity(self) -> dict[str, Any]:
        sft = _identity(self.sft, *(("model",) if self.init is not None else ()))
        return {"init": None if self.init is None else dict(self.init), "sft": sft}

    def hash(self) -> str:
        return stable_hash(self.identity())


def ensure_warm_start(
    spec: WarmStart,
    folder: Path | str,
    *,
    force: bool = False,
    override: str | None = None,
    starts: Path | None = None,
) -> tuple[Path, dict[str, Any]]:
    """The warm start's model folder (``folder/final``) and a description of it; built now unless cached.

    ``override`` uses an existing model folder instead (``--warm-start PATH``). ``starts``: a folder of committed
    starts (:mod:`.starts`); one trained with this spec is copied instead of training. A folder built from another
    spec is an error naming it (``force`` rebuilds it); an interrupted build resumes from its last SFT checkpoint.
    """
    if override is not None:
        path = Path(override)
        if not (path / "config.json").is_file():
            raise UserError(f"--warm-start {override}: not a model folder (no config.json)")
        return path, {"path": str(path), "source": "user"}
    folder = Path(folder)
    final, info_path = folder / "final", folder / WARM_START_FILE
    info = {"path": str(final), "source": "built", "spec": spec.identity(), "spec_hash": spec.hash()}
    if force:
        if is_main_process():
            shutil.rmtree(folder, ignore_errors=True)
    elif folder.is_dir() and any(folder.iterdir()):
        cached = json.loads(info_path.read_text()) if info_path.is_file() else {}
        if cached.get("spec_hash") != spec.hash():
            raise UserError(
                f"{folder} holds a warm start built with other settings ({cached.get('spec_hash', 'unknown')} != "
                f"{spec.hash()}); delete it or pass --force"
            )
        if final.is_dir() and "sft_cpu_seconds" in cached:
            print(f"warm start: done ({final})")
            kept = {k: cached[k] for k in ("source", "committed", "sft_seconds", "sft_cpu_seconds") if k in cached}
            return final, {**info, **kept, "built_now": False}
    barrier()  # every process has looked at the folder before the main process writes into it
    committed = find_start(spec.hash(), starts) if starts is not None else None
    if committed is not None:
        return final, {**info, **_copy_committed(spec, folder, committed), "built_now": False, "copied_now": True}
    return final, {**info, **_build_warm_start(spec, folder), "built_now": True}


def _copy_committed(spec: WarmStart, folder: Path, committed: Path) -> dict[str, Any]:
    """Copy the committed start into ``folder/final`` and record where it came from (the main process copies)."""
    record = {"spec": spec.identity(), "spec_hash": spec.hash(), "source": "committed", "committed": str(committed)}
    if is_main_process():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / WARM_START_FILE, json.dumps(record))  # first: a half-copied folder is still ours
        start = copy_start(committed, folder / "final")
        cost = {k: start.get(k) for k in ("sft_seconds", "sft_cpu_seconds")}  # what training it cost, where it was
        record.update(cost, weights_sha256=start.get("weights_sha256"), trained=start.get("trained"))
        atomic_write_text(folder / WARM_START_FILE, json.dumps(record))
    barrier()
    return json.loads((folder / WARM_START_FILE).read_text())


def _build_warm_start(spec: WarmStart, folder: Path) -> dict[str, float]:
    """Initialise (if asked), SFT (resuming an interrupted one), and record the spec; returns the SFT wall and CPU
    seconds (of this call: a resumed build counts what it ran)."""

    # the machine and code that train it: a start is the same bit for bit only on the kind of CPU that trained it
    record = {"spec": spec.identity(), "spec_hash": spec.hash(), "environment": environment_info()}
    if is_main_process():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / WARM_START_FILE, json.dumps(record))  # first: a half-built folder is still ours
        if spec.init is not None and not (folder / "init" / "config.json").is_file():
            save_diffusion_lm(build_tiny(**spec.init), folder / "init")
    barrier()
    sft = dataclasses.replace(spec.sft, output_dir=str(folder))
    if spec.init is not None:
        sft = dataclasses.replace(sft, model=str(folder / "init"))
    print(f"warm start: {sft.max_steps} SFT steps on {sft.task} -> {folder / 'final'}")
    start, cpu_start = time.perf_counter(), time.process_time()
    run_sft(sft)
    cost = {"sft_seconds": time.perf_counter() - start, "sft_cpu_seconds": time.process_time() - cpu_start}
    if is_main_process():
        atomic_write_text(folder / WARM_START_FILE, json.dumps({**record, **cost}))
    barrier()
    return cost


# ----------------------------------------------------------------------------------------------- training runs
@dataclass(frozen=True)
class TrainJob:
    """One RL run: a trainer config and, optionally, a hook on its rollout-policy estimates (a picklable dataclass,
    e.g. the stress test's noise). Its identity is everything that changes what it computes."""

    config: TrainConfig
    hook: OldEstimateHook | None = None

    def identity(self) -> dict[str, Any]:
        hook = None
        if self.hook is not None:
            hook = _hashable({"type": type(self.hook).__qualname__, **dataclasses.asdict(self.hook)})  # type: ignore[call-overload]

        # the effective baseline settings instead of the options given: a changed default must not reuse runs
        # trained with the old one, and an option given at its default value is the same run
        effective = _identity(build_baseline(self.config.baseline, **self.config.baseline_options).config)
        if not effective["sync_ref_model"]:  # a frozen reference (the default) keeps the keys of earlier runs
            effective = {k: v for k, v in effective.items() if k not in REF_SYNC_FIELDS}
        # no anchor and no validation (the defaults) are left out, so runs cached before either existed keep their keys
        defaults = (() if self.config.anchor_beta else ("anchor_beta",)) + (
            () if self.config.validation.every else ("validation",)
        )
        config = _identity(self.config, "baseline_options", *defaults)
        config["budget"] = _hashable(self.config.budget.to_dict())  # what the budget hash covers, nothing else
        return {"config": config, "baseline_config": effective, "hook": hook}

    def key(self) -> str:
        return stable_hash(self.identity())

    @property
    def folder(self) -> Path:
        return Path(self.config.output_dir)


def _differences(old: Any, new: Any, path: str = "") -> list[str]:
    """``path: old -> new`` for every leaf where two run identities differ, so a refused run says what changed."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            d
            for key in sorted(old.keys() | new.keys())
            for d in _differences(old.get(key), new.get(key), f"{path}.{key}".lstrip("."))
        ]
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def run_training(job: TrainJob, *, force: bool = False) -> dict[str, Any]:
    """Train ``job`` (or reuse it) and return its summary: final model folder (None if it stopped on non-finite
    steps), last step, step of the stop, wall and CPU seconds, and whether it was reused (``cached``)."""

    folder, key = job.folder, job.key()
    if force and is_main_process():
        shutil.rmtree(folder, ignore_errors=True)
    barrier()
    found = {name: json.loads(p.read_text()) for name in (SUMMARY_FILE, JOB_FILE) if (p := folder / name).is_file()}
    if any(record.get("key") != key for record in found.values()):
        stored = found.get(JOB_FILE, {}).get("identity")
        differ = _differences(stored, json.loads(json.dumps(job.identity(), default=str))) if stored else []
        detail = f" ({'; '.join(differ[:3])}{'; ...' if len(differ) > 3 else ''})" if differ else ""
        raise UserError(f"{folder} holds a run with other settings{detail}; delete it or pass --force")
    if SUMMARY_FILE in found:
        return {**found[SUMMARY_FILE], "cached": True}
    if latest_checkpoint(folder) is not None and JOB_FILE not in found:
        raise UserError(f"{folder} holds checkpoints of an unknown run; delete it or pass --force")
    if is_main_process():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / JOB_FILE, json.dumps({"key": key, "identity": job.identity()}, default=str))
    start, cpu_start = time.perf_counter(), time.process_time()
    final, stopped = None, None
    try:
        final = RLTrainer(job.config, old_estimate_hook=job.hook).train(resume=None)
    except TrainingDiverged as exc:
        stopped = str(exc)
    records = read_log(folder / "log.jsonl")
    last_step = records[-1]["step"] if records else 0
    summary = {
        "key": key,
        "folder": str(folder),
        "final": None if final is None else str(final),
        "last_step": last_step,
        "diverged_at": last_step if stopped else None,
        "stopped": stopped,
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu_start,
        "code": git_state(),  # the runner key does not cover the code: a cache may outlive it
    }
    if is_main_process():
        atomic_write_text(folder / SUMMARY_FILE, json.dumps(summary))
    return {**summary, "cached": False}


def control_config(config: TrainConfig, output_dir: Path | str) -> TrainConfig:
    """The frozen control of ``config``: the same start, prompts, budget and seed, trained with learning rate 0.

    Its parameters never change, and it draws the same prompts with the same random numbers as every run of the same
    seed, so the difference between a run's rollout rewards and the control's isolates what training changed.
    """
    return dataclasses.replace(
        config,
        baseline=CONTROL_BASELINE,
        baseline_options={},
        anchor_beta=0.0,
        validation=ValidationConfig(),  # nothing to select: its weights never change
        optim=dataclasses.replace(config.optim, learning_rate=0.0),
        output_dir=str(output_dir),
    )


class _Bar(Progress):
    """A progress bar over jobs."""

    def __init__(self, total: int, desc: str) -> None:
        self.bar = tqdm(total=total, desc=desc, dynamic_ncols=True)

    def end(self, key: str, result: Any) -> None:
        del key, result
        self.bar.update()


def run_jobs(jobs: Sequence[TrainJob], workers: int, desc: str) -> list[dict[str, Any]]:
    """Every job's summary, in job order (jobs with the same key run once); ``workers`` > 1 runs them side by side
    in worker processes with one thread each (:mod:`.workers`)."""
    unique = {job.key(): job for job in jobs}
    bar = _Bar(len(unique), desc)
    try:
        stages = [Stage(key, run_training, (job,)) for key, job in unique.items()]
        done = run_graph(stages, workers if len(unique) > 1 else 1, threads=1, progress=bar)
    finally:
        bar.bar.close()
    return [done[job.key()] for job in jobs]


def sample_rollouts(config: TrainConfig, count: int) -> tuple[Any, list[Any]]:
    """``count`` rollout batches of ``config``'s start model, without training: the trainer's own sampler with its
    prompts and random streams (the frozen control's rollouts). Returns the model (a ``DiffusionLM`` in eval mode)
    and one :class:`~stabledrl_bench.training.trainer.SampledBatch` per micro-batch."""

    trainer = RLTrainer(config)
    trainer.dlm.model.eval()
    return trainer.dlm, [batch for _ in range(count) for batch in trainer.sample_rollout()]
