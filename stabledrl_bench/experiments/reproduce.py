"""``reproduce table1|table2``: warm start, train every baseline under one budget, evaluate, rebuild the board.

Presets (``--preset``):

* ``paper`` - the official StableDRL settings on real weights (``--model`` = LLaDA-8B-Instruct for Table 1,
  SDAR-8B for Table 2): full-parameter RL, 32 prompts x 16 completions per step, mu = 2, 2000 steps, lr 2e-6
  (GSM8K, MATH) / 1e-6 (Countdown, Sudoku), bf16, gradient checkpointing; launch under ``accelerate launch``
  with one of the configs in ``configs/accelerate/``. Evaluates with the d1 protocol at 128/256/512 (Table 1)
  or TraceRL's static/dynamic protocol (Table 2).
* ``tiny`` - the built-in tiny model on a laptop CPU: masked-diffusion SFT warm start, then RL for every
  baseline, on the tasks a tiny model can learn; lengths are scaled down and labelled as such.
* ``smoke`` - minutes: a few steps of everything, used by CI to prove the pipeline end to end.

The presets are declared in ``configs/presets/table1.yaml`` and ``table2.yaml`` (:mod:`.presets`); the command's
options become a :class:`~.comparison.Comparison`, and each task's training rewards are kept by :mod:`.summary`.

``--pass-k N`` adds a sampled evaluation of every checkpoint: each test problem decoded N times at
``--temperature`` under every protocol of the preset (protocol ``<name>-n<N>-t<T>``), reported as pass@k and maj@k
in their own leaderboard block with a pass@k plot.

``auto`` (the default) picks ``paper`` when a GPU and ``--model`` are present, else ``tiny``. Everything is
resumable: finished trainings and evaluations are skipped, interrupted trainings resume from their checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stabledrl_bench.core.baseline import build_baseline
from stabledrl_bench.core.models.backends import TINY_SPECS, load_model_spec
from stabledrl_bench.core.models.probes import require_conventions
from stabledrl_bench.errors import UserError, on_interrupt
from stabledrl_bench.evaluation.native import evaluate_and_record, model_record
from stabledrl_bench.evaluation.protocols import get_protocol
from stabledrl_bench.experiments.comparison import Comparison, Replicate
from stabledrl_bench.experiments.plan import Method, eval_work, sft_work, train_work
from stabledrl_bench.experiments.presets import warm_start_spec
from stabledrl_bench.experiments.runner import (
    CONTROL_BASELINE,
    TrainJob,
    control_config,
    ensure_warm_start,
    run_training,
)
from stabledrl_bench.experiments.stages import Planned, Stages
from stabledrl_bench.experiments.stress import stability_section
from stabledrl_bench.experiments.summary import training_summary
from stabledrl_bench.experiments.workers import Stage, run_graph
from stabledrl_bench.processes import barrier, intra_op_threads, is_main_process, require_shared_folder
from stabledrl_bench.reporting.leaderboard import write_leaderboard
from stabledrl_bench.reporting.training import CONTROL_RUN
from stabledrl_bench.tasks import get_task
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.trainer import VALIDATION_FILE, accumulation_steps
from stabledrl_bench.training.validation import ValidationConfig


def _banner(run: Comparison) -> None:
    preset = run.preset
    print(f"reproduce {run.table}: preset '{preset.name}' - {preset.description}")
    if preset.name != "paper":
        needs = "LLaDA-8B-Instruct" if run.table == "table1" else "SDAR-8B-Chat"
        print(
            f"  (the paper preset needs {needs} weights (--model PATH), GPUs, and `accelerate launch`; see docs/gpu.md)"
        )
    print(f"  model: {run.model}; tasks: {', '.join(run.tasks)}; budget {preset.budget.hash()}")
    print(
        f"  results: {run.results}, leaderboard: {run.leaderboard} (the repository's committed ones are rewritten "
        "only when named: --results results --leaderboard leaderboard.md)"
    )
    extra = [task for task in preset.tasks if task not in run.tasks]
    if extra:
        print(f"  (also in this preset, not run now: {', '.join(extra)}; name them with --tasks)")


def reproduce(run: Comparison) -> None:
    """Entry point of ``python -m stabledrl_bench reproduce`` (see the module docstring)."""
    _banner(run)
    require_shared_folder(run.results, "results")  # every node reads the records the main process writes
    accumulation_steps(run.preset.budget.prompts_per_step, run.preset.per_device_prompts)  # before the warm start
    plan, graph = _graph(run)
    if run.workers > 1:
        print(
            f"  workers: {run.workers} processes side by side, {run.threads} thread(s) each; each stage's output goes "
            f"to {run.runs / LOGS}/"
        )
    stages = Stages(plan, workers=run.workers)
    with on_interrupt(lambda: RERUN), intra_op_threads(run.threads):
        run_graph(graph, run.workers, run.threads, stages)
        for task in run.tasks:
            training_summary(run, task)

    if is_main_process():
        path = write_leaderboard(
            run.results, run.leaderboard, plots_dir=run.results / "plots", extra_sections=[stability_section]
        )
        print(f"leaderboard: {path}")
    barrier()


# What re-running an interrupted `reproduce` does (every stage is cached; the trainer adds where its run resumes).
RERUN = "re-run the same command to go on: finished warm starts, trainings and evaluations are reused"
LOGS = "logs"  # <runs>/<comparison>/logs/<stage>.log: what each stage printed, when it ran in a worker


@dataclass(frozen=True)
class Done:
    """What a stage hands on: its value (the path of the checkpoint it made), whether it only reused what was
    there (a reused stage says nothing about the cost of a real one), and the lines to print when it ends."""

    value: str | None = None
    reused: bool = False
    lines: tuple[str, ...] = ()


def _graph(run: Comparison) -> tuple[list[Planned], list[Stage]]:
    """Every stage of the comparison, in plan order: per task and seed the warm start, the start's evaluation, each
    baseline's training and evaluation (and its best checkpoint's, with ``--eval-every``), and the frozen control;
    with their work in token-forwards, from the budget (:mod:`.plan`; the overall progress line estimates from it
    after the first stage), and the stages each needs."""
    preset, budget = run.preset, run.preset.budget
    attention = get_protocol(preset.protocols[0]).attention
    prompt = budget.max_prompt_length

    def train(baseline: str) -> float:
        return train_work(budget, Method.of(baseline, budget, attention), recompute=preset.gradient_checkpointing)

    plan: list[Planned] = []
    graph: list[Stage] = []

    def add(replicate: Replicate, name: str, what: str, label: str, work: float, stage: Stage) -> None:
        key = f"{replicate.task}/s{replicate.seed}/{name}"
        after = tuple(f"{replicate.task}/s{replicate.seed}/{need}" for need in stage.after)
        plan.append(Planned(key, f"{replicate.task}:{what}", f"{replicate.where}: {label}", work, after))
        log = run.runs / LOGS / f"{replicate.task}-s{replicate.seed}-{name}.log"
        graph.append(dataclasses.replace(stage, key=key, after=after, log=log, work=work))

    for task in run.tasks:
        evaluation = eval_work(run.evaluations(), len(get_task(task).eval_docs(limit=run.eval_limit)), prompt)
        sft = preset.task_sft(task)
        for seed in run.seeds:
            replicate = Replicate(run, task, seed)
            start: tuple[str, ...] = ()
            if run.preset.sft is not None:
                work = sft_work(sft.max_steps, sft.batch_size, prompt + sft.max_completion_length) if sft else 1.0
                add(replicate, "sft", "sft", "warm start (SFT)", work, Stage("", _warm_start, (replicate,)))
                start = ("sft",)
            reference = "sft" if run.preset.sft is not None else "base"
            evaluate = Stage("", _evaluate_start, (replicate, reference), after=start)
            add(replicate, f"eval-{reference}", "eval", "evaluate the start", evaluation, evaluate)
            for baseline in run.baselines:
                trained = Stage("", _train_baseline, (replicate, baseline), after=start)
                add(replicate, f"train-{baseline}", "train", f"train {baseline}", train(baseline), trained)
                final = Stage("", _evaluate_final, (replicate, baseline), after=(f"train-{baseline}",))
                add(replicate, f"eval-{baseline}", "eval", f"evaluate {baseline}", evaluation, final)
                if run.eval_every:
                    best = Stage("", _evaluate_best, (replicate, baseline), after=(f"train-{baseline}",))
                    label = f"evaluate {baseline}'s best checkpoint on validation"
                    add(replicate, f"eval-best-{baseline}", "eval", label, evaluation, best)
            control = Stage("", _train_control, (replicate,), after=start)
            add(replicate, "control", "train", "frozen control (learning rate 0)", train(CONTROL_BASELINE), control)
    return plan, graph


def _start(replicate: Replicate, inputs: Sequence[Done]) -> str:
    """The RL start of a replicate: its warm start's checkpoint, else the comparison's model."""
    return inputs[0].value if inputs else replicate.comparison.model  # type: ignore[return-value]


def _warm_start(replicate: Replicate) -> Done:
    run = replicate.comparison
    spec = warm_start_spec(run.preset, replicate.task, run.model, replicate.seed)
    final, info = ensure_warm_start(spec, replicate.runs / "sft", force=run.force, starts=run.starts)
    how = "built" if info["built_now"] else "reused"
    if info.get("source") == "committed":  # the same weights on every machine: say which
        name = Path(info["committed"]).name
        how = f"copied from the committed start {name}" if info.get("copied_now") else f"reused, committed {name}"
    return Done(str(final), reused=not info["built_now"], lines=(f"  [{replicate.task}] warm start: {how} ({final})",))


def _evaluate_start(replicate: Replicate, reference: str, *inputs: Done) -> Done:
    return _evaluate_all(replicate, reference, _start(replicate, inputs))


def _train_baseline(replicate: Replicate, baseline: str, *inputs: Done) -> Done:
    return _train(_train_config(replicate, baseline, _start(replicate, inputs)), force=replicate.comparison.force)


def _train_control(replicate: Replicate, *inputs: Done) -> Done:
    config = _train_config(replicate, CONTROL_BASELINE, _start(replicate, inputs), folder=CONTROL_RUN)
    return _train(control_config(config, config.output_dir), force=replicate.comparison.force)


def _evaluate_final(replicate: Replicate, baseline: str, trained: Done) -> Done:
    return _evaluate_all(replicate, baseline, str(trained.value), trained=True)


def _evaluate_best(replicate: Replicate, baseline: str, trained: Done) -> Done:
    best, validation = _best_checkpoint(replicate.runs / baseline)
    done = _evaluate_all(replicate, baseline, best, trained=True, validation=validation)
    note = f"  [{replicate.task}] {baseline}: best checkpoint on validation at step {validation['step']}"
    return dataclasses.replace(done, lines=(note, *done.lines))


def _train_config(replicate: Replicate, baseline: str, start: str, folder: str | None = None) -> TrainConfig:
    """The RL run of ``baseline`` from ``start`` in ``replicate`` (its folder: ``folder``, else the baseline's)."""
    out = replicate.runs / (folder or baseline)
    return replicate.comparison.preset.train_config(
        replicate.task,
        baseline=baseline,
        model=start,
        seed=replicate.seed,
        output_dir=str(out),
        check_model=replicate.comparison.check_model,
        validation=_validation(replicate) if folder is None else ValidationConfig(),
    )


def _validation(replicate: Replicate) -> ValidationConfig:
    """The run's checkpoint selection (off unless ``--eval-every``): its task, at the preset's validation lengths,
    decoded by the comparison's first evaluation protocol."""
    run = replicate.comparison
    preset, chosen = run.preset, run.preset.validation
    return ValidationConfig(
        every=run.eval_every,
        tasks=[replicate.task],
        lengths=[preset.lengths[n] for n in chosen.lengths or preset.lengths],
        items=chosen.items,
        protocol=preset.protocols[0],
        batch_size=preset.eval_batch_size,
    )


def _best_checkpoint(folder: Path) -> tuple[str, dict[str, Any]]:
    """A finished run's best checkpoint and its record's ``validation`` field (settings, chosen step and score)."""
    stored = json.loads((folder / VALIDATION_FILE).read_text())
    best = stored["best"]
    settings = {key: stored[key] for key in ("every", "tasks", "lengths", "items", "protocol")}
    return str(folder / "best"), {**settings, "step": best["step"], "score": best["score"]}


def _train(config: TrainConfig, *, force: bool) -> Done:
    """Train (or reuse, or resume) one run through the experiment runner; a run that diverged stops the job.
    Hands on the final checkpoint."""
    out = Path(config.output_dir)
    summary = run_training(TrainJob(config), force=force)
    if summary["final"] is None:
        raise UserError(summary["stopped"] or f"{out}: the run stopped before its last step")
    how = f"trained, reused ({summary['final']})" if summary["cached"] else f"trained -> {summary['final']}"
    line = f"  [{config.task}] {out.name}: {config.budget.max_steps} steps, {how}"
    return Done(str(summary["final"]), reused=bool(summary["cached"]), lines=(line,))


def _eval_device() -> tuple[str | None, torch.dtype | None]:
    """This process's GPU (``LOCAL_RANK`` under ``accelerate launch``) in bf16, or the CPU as loaded."""
    if not torch.cuda.is_available():
        return None, None
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}", torch.bfloat16


def _evaluate_all(
    replicate: Replicate,
    baseline: str,
    checkpoint: str,
    *,
    trained: bool = False,
    validation: dict[str, Any] | None = None,
) -> Done:
    """Evaluate one checkpoint (``trained``: an RL run of ``baseline`` under the preset's budget, else the start)
    under every protocol and length (a run's best one when ``validation`` says how it was chosen); reused when every
    result was."""
    run = replicate.comparison
    budget = run.preset.budget.to_dict() if trained else None
    advantage = build_baseline(baseline).advantage_record() if trained else None
    reused, lines = True, []
    device, dtype = _eval_device() if run.preset.bf16 else (None, None)
    dlm = load_model_spec(checkpoint, seed=replicate.seed, device=device, dtype=dtype)
    if checkpoint not in TINY_SPECS and run.check_model:
        require_conventions(dlm, checkpoint, train=False)  # before any decoding: a broken call wastes GPU hours
    model = model_record(dlm, checkpoint)  # hashes the weights once per checkpoint
    for protocol, lengths in run.evaluations():
        for length, max_completion_length in lengths.items():
            recorded = evaluate_and_record(
                dlm,
                results_dir=run.results,
                key=replicate.result_key(baseline, protocol, length, model).to_dict(),
                max_completion_length=max_completion_length,
                budget=budget,
                advantage=advantage,
                limit=run.eval_limit,
                batch_size=run.preset.eval_batch_size,
                skip_existing=not run.force,
                selection="final" if validation is None else "best",
                validation=validation,
            )
            reused = reused and recorded.reused
            acc = json.loads(recorded.path.read_text())["metrics"]
            how = "reused: same weights and settings" if recorded.reused else f"measured ({recorded.note})"
            lines.append(
                f"  [{replicate.task}] {baseline}{'' if validation is None else ' (best)'} @ {length} "
                f"({max_completion_length} tokens, {protocol.name}): "
                f"accuracy {100 * acc['accuracy']:.1f}%, score {acc.get('score_mean', float('nan')):.3f} [{how}]"
            )
    return Done(checkpoint, reused=reused, lines=tuple(lines))
