"""Training sweeps of the stress test: ``exploding`` (methods x {normal, exploding} x seeds) and ``clip`` (StableDRL's
clip threshold C x conditions x seeds), declared as jobs of the experiment runner (:mod:`..runner`): every run a
real :class:`~stabledrl_bench.training.trainer.RLTrainer` run from the same warm start under the same budget,
learning rate and seeds.

A run is identified by its runner key (trainer config, effective baseline config, noise hook); its folder
``<runs>/train/<baseline>-<condition>-s<seed>-<key>`` holds the trainer's log and the runner's ``summary.json``. A
finished run is reused by every later command that needs the same configuration (e.g. StableDRL with C = 5 is shared
by both experiments); an interrupted one resumes. Runs are independent, so they execute in ``--jobs`` worker processes
with one intra-op thread each: for a 0.1 M-parameter model, process parallelism is what uses two cores well.

Methods without an importance ratio (SPG) are unaffected by the noise, so their ``exploding`` row is the ``normal``
run itself (marked ``shared_with_normal``), not a second identical run. Every seed also gets the runner's frozen
control (``<runs>/control/s<seed>-<key>``): the warm start trained with learning rate 0, which draws the same prompts
with the same random numbers as every run of that seed, so that a reward change is not confused with easier or
harder prompts later in the run.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stabledrl_bench.core.baseline import build_baseline
from stabledrl_bench.errors import UserError, comma_list
from stabledrl_bench.experiments.runner import CONTROL_BASELINE, TrainJob, control_config, ensure_warm_start, run_jobs
from stabledrl_bench.experiments.stress.common import (
    COLORS,
    CONDITIONS,
    LRSWEEP,
    STRESS_CANVAS,
    STRESS_GENERATOR,
    STRESS_PROTOCOL,
    STRESS_TASK,
    Definitions,
    ExplodingNoise,
    Series,
    band,
    chosen_lr,
    collapse_analysis,
    figure,
    finite,
    running_mean,
    runtime,
    save_figure,
    seed_band,
    spike_steps,
    stability_dir,
    stress_warm_start,
    write_record,
)
from stabledrl_bench.experiments.stress.observations import clip_claims, exploding_claims
from stabledrl_bench.experiments.stress.options import (
    EXPERIMENTS,
    Experiment,
    ModelOptions,
    StressOptions,
    SweepOptions,
    check_positive,
    option,
    recorded_settings,
)
from stabledrl_bench.experiments.stress.tables import training_block
from stabledrl_bench.training.budget import Budget
from stabledrl_bench.training.optim import OptimConfig
from stabledrl_bench.training.runlog import read_log
from stabledrl_bench.training.trainer import TrainConfig

# A checkpoint every 100 steps, so a 500-step run cut short resumes instead of starting again (not part of a run's
# identity: cached runs stay valid).
SAVE_EVERY = 100


def stress_budget(model: ModelOptions, steps: int, num_iterations: int = 2) -> Budget:
    """The stress budget: the tiny Table 1 canvas (L = 48, block 8, T = 0.9) and mu = 2, the official recipe's, with
    ``--prompts`` x ``--generations`` rollouts and ``--diffusion-steps`` (an experiment with a ``--num-iterations``
    option sets mu itself)."""
    return Budget(
        max_steps=steps,
        prompts_per_step=model.prompts,
        num_generations=model.generations,
        num_iterations=num_iterations,
        max_completion_length=STRESS_CANVAS,
        diffusion_steps=model.diffusion_steps,
        block_length=8,
        temperature=0.9,
        max_prompt_length=64,
    )


def preset(name: str, task: str | None) -> Any:
    """The Table 1 preset ``name``, checked to have ``task`` (one error line otherwise)."""
    from stabledrl_bench.experiments.reproduce import presets

    known = presets("table1")
    if name not in known:
        raise UserError(f"--preset {name}: unknown; choose from {', '.join(known)}")
    if task not in known[name].tasks:
        raise UserError(f"--preset {name} needs --task, one of {', '.join(known[name].tasks)}")
    return known[name]


def chosen_preset(model: ModelOptions) -> Any:
    """``--preset`` checked with its ``--task`` and, for a preset without a warm start of its own, ``--warm-start``
    (None: the stress settings, which take no ``--task``)."""
    if model.preset is None:
        if model.task is not None:
            raise UserError("--task needs --preset (the stress settings have their own task)")
        return None
    chosen = preset(model.preset, model.task)
    if chosen.task_sft(model.task) is None and model.warm_start is None:
        raise UserError(f"--preset {model.preset} trains a given model: pass --warm-start /path/to/model")
    return chosen


def warm_start(model: ModelOptions, runs: str) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Warm-start folder, its description and the model summary (parameter count etc.): ``--warm-start``, else the
    stress warm start, or with ``--preset`` that preset's warm start of ``--task`` (training seed 0), cached under
    ``runs``."""
    from stabledrl_bench.core.models.backends import load_diffusion_lm

    chosen = chosen_preset(model)
    if chosen is None:
        spec, folder = stress_warm_start(model.sft_steps), Path(runs) / "sft"
    else:
        from stabledrl_bench.experiments.reproduce import warm_start_spec

        spec = None if model.warm_start else warm_start_spec(chosen, model.task, chosen.model, seed=0)
        folder = Path(runs) / f"sft-{model.preset}-{model.task}"
    path, info = ensure_warm_start(spec, folder, override=model.warm_start)
    return path, info, load_diffusion_lm(path).config_summary()


@dataclass(frozen=True)
class TrainSettings:
    """What every run of a sweep shares: warm start, task, budget, optimiser, noise.

    The optimiser defaults are the official StableDRL recipe's, for every method alike: AdamW with weight decay
    0.1, a linear decay of the learning rate to 0 over the run, gradient clipping at 0.2.
    """

    warm_start: str
    budget: Budget
    learning_rate: float
    noise: ExplodingNoise
    max_grad_norm: float = 0.2
    weight_decay: float = 0.1
    lr_scheduler_type: str = "linear"
    task: str = STRESS_TASK
    generator_options: tuple[tuple[str, Any], ...] = tuple(STRESS_GENERATOR.items())
    protocol: str = STRESS_PROTOCOL
    # A Table 1 preset's task instead of the stress task (``--preset paper --task gsm8k --warm-start MODEL``): its
    # data, rewards, budget and precision, with the knobs above. None: the stress settings.
    preset: str | None = None
    reward_profile: str = "d1"
    train_split: str = "generated"
    per_device_prompts: int | None = None  # None: the whole step on one micro-batch
    dtype: str = "float32"
    bf16: bool = False
    gradient_checkpointing: bool = False

    def optim(self) -> OptimConfig:
        return OptimConfig(
            learning_rate=self.learning_rate,
            weight_decay=self.weight_decay,
            lr_scheduler_type=self.lr_scheduler_type,
            max_grad_norm=self.max_grad_norm,
        )

    def describe(self) -> dict[str, Any]:
        """The record's account of these settings (the warm start is described by its builder)."""
        return {
            "preset": self.preset,
            "task": {
                "name": self.task,
                "generator_options": dict(self.generator_options),
                "protocol": self.protocol,
                "reward_profile": self.reward_profile,
                "train_split": self.train_split,
            },
            "precision": {
                "dtype": self.dtype,
                "bf16": self.bf16,
                "gradient_checkpointing": self.gradient_checkpointing,
            },
            "optimizer": dataclasses.asdict(self.optim()),
            "budget": self.budget.to_dict(),
            "budget_hash": self.budget.hash(),
            "noise": {**self.noise.__dict__, "text": self.noise.describe()},
        }

    def config(self, baseline: str, options: dict[str, Any], seed: int) -> TrainConfig:
        """The trainer config of one run (its folder is set by the job that runs it)."""
        return TrainConfig(
            baseline=baseline,
            task=self.task,
            model=self.warm_start,
            protocol=self.protocol,
            reward_profile=self.reward_profile,
            train_split=self.train_split,
            generator_options=dict(self.generator_options),
            budget=self.budget,
            optim=self.optim(),
            baseline_options=options,
            per_device_prompts=self.per_device_prompts or self.budget.prompts_per_step,
            dtype=self.dtype,
            bf16=self.bf16,
            gradient_checkpointing=self.gradient_checkpointing,
            seed=seed,
            output_dir="",
            progress=False,
            save_every=SAVE_EVERY,
        )


def train_settings(
    stress: StressOptions, sweep: SweepOptions, *, learning_rate: float | None = None, num_iterations: int = 2
) -> TrainSettings:
    """The settings of a training experiment: ``learning_rate``, else ``--lr``, else the rate the committed
    learning-rate sweep chose (:func:`~stabledrl_bench.experiments.stress.common.chosen_lr`); mu =
    ``num_iterations``. Every check is cheap and comes before the warm start is built; its folder is filled in
    afterwards (``warm_start``)."""
    model, training = sweep.model, sweep.training
    chosen_preset(model)
    if learning_rate is None:
        learning_rate = training.lr if training.lr is not None else chosen_lr(stress.results, model.preset, model.task)
    check_positive(lr=learning_rate, max_grad_norm=training.max_grad_norm, jobs=training.jobs)
    if not 0 <= training.weight_decay < 1:
        raise UserError(f"--weight-decay must be in [0, 1), got {training.weight_decay}")
    settings = TrainSettings(
        warm_start="",
        budget=stress_budget(model, training.steps, num_iterations),
        learning_rate=learning_rate,
        max_grad_norm=training.max_grad_norm,
        weight_decay=training.weight_decay,
        lr_scheduler_type=training.lr_scheduler,
        noise=sweep.noise.noise(),
    )
    return settings if model.preset is None else on_preset(settings, model.preset, model.task, training.steps)


def on_preset(settings: TrainSettings, name: str, task: str, steps: int) -> TrainSettings:
    """``settings`` moved onto a Table 1 preset's ``task``: its data, rewards, budget (``steps`` long) and
    precision, e.g. the paper's on a real checkpoint; the optimiser knobs and the rate stay the experiment's."""
    chosen = preset(name, task)
    recipe = chosen.tasks[task]
    return dataclasses.replace(
        settings,
        budget=dataclasses.replace(chosen.budget, max_steps=steps),
        task=task,
        generator_options=tuple(recipe.generator_options.items()),
        protocol=chosen.prompt_protocol,
        preset=name,
        reward_profile=chosen.reward_profile,
        train_split=recipe.train_split,
        per_device_prompts=chosen.per_device_prompts,
        dtype=chosen.dtype,
        bf16=chosen.bf16,
        gradient_checkpointing=chosen.gradient_checkpointing,
    )


CURVE_KEYS = ("ratio_max", "drift", "clip_ratio", "weight_max", "loss")


@dataclass(frozen=True)
class RunSpec:
    """One training run: a labelled method under one condition and seed."""

    label: str
    baseline: str
    options: tuple[tuple[str, Any], ...]
    condition: str
    seed: int


def _in_folder(job: TrainJob, parent: Path, name: str) -> TrainJob:
    """``job`` writing to ``parent/<name>-<first 8 digits of its key>`` (the key ignores the folder)."""
    folder = parent / f"{name}-{job.key()[:8]}"
    return dataclasses.replace(job, config=dataclasses.replace(job.config, output_dir=str(folder)))


def train_job(spec: RunSpec, settings: TrainSettings, runs_dir: Path) -> TrainJob:
    """The runner job of ``spec``; the exploding condition is the trainer hook :class:`NoiseInjection`."""
    hook = None
    if spec.condition == "exploding":
        hook = settings.noise.injection(spec.baseline, settings.budget.max_completion_length)
    job = TrainJob(settings.config(spec.baseline, dict(spec.options), spec.seed), hook)
    return _in_folder(job, runs_dir / "train", f"{spec.baseline}-{spec.condition}-s{spec.seed}")


def control_job(seed: int, settings: TrainSettings, runs_dir: Path) -> TrainJob:
    """The frozen control of a seed (:func:`~stabledrl_bench.experiments.runner.control_config`)."""
    job = TrainJob(control_config(settings.config(CONTROL_BASELINE, {}, seed), ""))
    return _in_folder(job, runs_dir / "control", f"s{seed}")


def _clean(value: Any) -> float | None:
    """Finite numbers as floats, anything else (NaN, inf, missing) as None (JSON null = not finite)."""
    return float(value) if finite(value) else None


def _curves(records: list[dict[str, Any]]) -> dict[str, list]:
    rollouts = [r for r in records if r.get("phase_iteration") == 0]
    curves = {
        "step": [r["step"] for r in records],
        "grad_norm": [_clean(r.get("grad_norm")) for r in records],
        "skipped": [bool(r.get("skipped")) for r in records],
        "reward_step": [r["step"] for r in rollouts],
        "reward_mean": [_clean(r.get("reward_mean")) for r in rollouts],
    }
    for key in CURVE_KEYS:
        curves[key] = [_clean(r.get(key)) for r in records]
    return curves


# ------------------------------------------------------------------------------------------------ analysis
def analyze(summary: dict[str, Any], frozen: dict[str, Any], d: Definitions, planned_steps: int) -> dict[str, Any]:
    """Spike steps, collapse and reward statistics of one run (definitions in :class:`Definitions`); collapse and
    the final reward are judged against the frozen warm start's reward on the same rollout steps (same prompts)."""
    c = summary["curves"]
    spikes = spike_steps(c["step"], c["grad_norm"], d)
    frozen_at = dict(zip(frozen["reward_step"], frozen["reward_mean"], strict=True))
    collapse = collapse_analysis(
        c["reward_step"],
        c["reward_mean"],
        frozen_at,
        last_step=summary["last_step"],
        planned_steps=planned_steps,
        diverged_at=summary["diverged_at"],
        d=d,
    )
    rewards = [r for r in c["reward_mean"] if finite(r)]
    norms = [g for g in c["grad_norm"] if finite(g)]
    last_steps = c["reward_step"][-d.reward_window :]
    frozen_final = band([frozen_at[step] for step in last_steps if step in frozen_at])["mean"]
    final = band(rewards[-d.reward_window :])["mean"]
    return {
        "spike_steps": spikes,
        "spike_count": len(spikes),
        "spike_rate": len(spikes) / summary["last_step"] if summary["last_step"] else None,
        "nonfinite_steps": sum(not finite(g) for g in c["grad_norm"]),
        **collapse,
        "initial_reward": band(rewards[: d.initial_rollouts])["mean"],
        "final_reward": final,
        "frozen_final_reward": frozen_final,
        "final_vs_frozen": None if final is None or frozen_final is None else final - frozen_final,
        "mean_reward": band(rewards)["mean"],
        "grad_norm_median": sorted(norms)[len(norms) // 2] if norms else None,
        "grad_norm_max": max(norms) if norms else None,
    }


def aggregate(rows: list[dict[str, Any]], labels: Sequence[str], conditions: Sequence[str]) -> list[dict[str, Any]]:
    """Per label x condition: how many seeds collapsed and when, spike counts, reward bands."""
    table = []
    for label in labels:
        for condition in conditions:
            group = [r for r in rows if r["label"] == label and r["condition"] == condition]
            if not group:
                continue
            collapsed = [r["collapse_step"] for r in group if r["collapse_step"] is not None]
            table.append(
                {
                    "label": label,
                    "condition": condition,
                    "seeds": len(group),
                    "collapsed": len(collapsed),
                    "collapse_steps": collapsed,
                    "collapse_kinds": sorted({r["collapse_kind"] for r in group if r["collapse_kind"]}),
                    "transient_collapses": sum(r["transient_collapses"] for r in group),
                    "zero_reward_steps": band([r["zero_reward_steps"] for r in group]),
                    "above_frozen": sum(finite(r["final_vs_frozen"]) and r["final_vs_frozen"] > 0 for r in group),
                    "spikes": band([r["spike_count"] for r in group]),
                    "spike_rate": band([r["spike_rate"] for r in group]),
                    "nonfinite_steps": band([r["nonfinite_steps"] for r in group]),
                    "initial_reward": band([r["initial_reward"] for r in group]),
                    "final_reward": band([r["final_reward"] for r in group]),
                    "final_vs_frozen": band([r["final_vs_frozen"] for r in group]),
                    "grad_norm_median": band([r["grad_norm_median"] for r in group]),
                    "grad_norm_max": band([r["grad_norm_max"] for r in group]),
                    "shared_with_normal": any(r.get("shared_with_normal") for r in group),
                }
            )
    return table


def run_sweep(
    specs: list[RunSpec],
    settings: TrainSettings,
    runs_dir: Path,
    definitions: Definitions,
    workers: int,
    desc: str,
    shared_normal: Callable[[RunSpec], bool],
) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]], dict[str, Any]]:
    """Train (or reuse) every run and the frozen control of every seed through the experiment runner; returns one
    analysed row per spec, the control's rollout rewards per seed and the cost (worker CPU seconds of every distinct
    job, how many ran now and how many were reused).

    ``shared_normal(spec)``: the spec's ``exploding`` row is its ``normal`` run (a method without ratios).
    """
    resolved = [dataclasses.replace(s, condition="normal") if shared_normal(s) else s for s in specs]
    jobs = [train_job(s, settings, runs_dir) for s in resolved]
    seeds = sorted({s.seed for s in specs})
    controls = [control_job(seed, settings, runs_dir) for seed in seeds]
    summaries = run_jobs([*controls, *jobs], workers, desc)
    unique = {s["key"]: s for s in summaries}
    cost = {
        "jobs": len(unique),
        "jobs_reused": sum(bool(s["cached"]) for s in unique.values()),
        "worker_cpu_seconds": sum(s.get("cpu_seconds") or 0.0 for s in unique.values()),
    }
    frozen = {}
    for seed, summary in zip(seeds, summaries, strict=False):
        curves = _curves(read_log(Path(summary["folder"]) / "log.jsonl"))
        frozen[seed] = {
            "key": summary["key"],
            "run_dir": summary["folder"],
            "reward_step": curves["reward_step"],
            "reward_mean": curves["reward_mean"],
            "cpu_seconds": summary["cpu_seconds"],
        }
    rows = []
    for spec, resolved_spec, summary in zip(specs, resolved, summaries[len(controls) :], strict=True):
        run = {**summary, "curves": _curves(read_log(Path(summary["folder"]) / "log.jsonl"))}
        rows.append(
            {
                **dataclasses.asdict(spec),
                "options": dict(spec.options),
                "shared_with_normal": resolved_spec.condition != spec.condition,
                "run_dir": summary["folder"],
                "seconds": summary["seconds"],
                "cpu_seconds": summary.get("cpu_seconds"),
                "last_step": summary["last_step"],
                "diverged_at": summary["diverged_at"],
                **analyze(run, frozen[spec.seed], definitions, settings.budget.max_steps),
                "curves": run["curves"],
            }
        )
    return rows, frozen, cost


# --------------------------------------------------------------------------------------------------- plots
def plot_sweep(
    rows: list[dict[str, Any]],
    frozen: dict[int, dict[str, Any]],
    labels: Sequence[str],
    conditions: Sequence[str],
    results_dir: Path,
    experiment: str,
    title: str,
    window: int,
) -> dict[str, str]:
    """``<experiment>_reward.png`` (running mean over ``window`` rollouts, the frozen warm start on the same prompts
    in black) and ``<experiment>_gradnorm.png`` (pre-clip, log scale): one panel per condition, seed bands."""
    out = {}
    for metric, x_key, y_key in (("reward", "reward_step", "reward_mean"), ("gradnorm", "step", "grad_norm")):
        log = metric == "gradnorm"
        fig, axes = figure(len(conditions))
        for ax, condition in zip(axes, conditions, strict=True):
            drawn = False
            for color, label in zip(COLORS, labels, strict=False):
                series = Series(label)
                for r in (r for r in rows if r["label"] == label and r["condition"] == condition):
                    ys = r["curves"][y_key]
                    series.runs.append((r["curves"][x_key], ys if log else running_mean(ys, window)))
                    if r["diverged_at"] is not None:
                        series.stopped.append(r["diverged_at"])
                drawn |= seed_band(ax, series, color, log=log)
            if not log:
                runs = [(f["reward_step"], running_mean(f["reward_mean"], window)) for f in frozen.values()]
                drawn |= seed_band(ax, Series("frozen warm start", runs), "black")
            ax.set_title(condition, fontsize=9)
            ax.set_xlabel("optimizer step", fontsize=8)
            ax.set_ylabel(f"reward, mean of last {window} rollouts" if not log else "pre-clip grad norm", fontsize=8)
            if log and drawn:
                ax.set_yscale("log")
            ax.tick_params(labelsize=7)
            if drawn:
                ax.legend(fontsize=7)
        what = "reward" if not log else "pre-clip gradient norm"
        out[metric] = save_figure(
            fig,
            stability_dir(results_dir) / f"{experiment}_{metric}.png",
            f"{title}: {what} (mean, min-max over seeds; dotted = stopped on non-finite steps)",
        )
    return out


# Display name -> (registered baseline, options): the five methods, each with its official estimator settings
# (num_mc = 2 where the method has Monte-Carlo masks) and one KL setting for all: beta = 0, as the official StableDRL
# recipe trains (GRPO's 0.04, ESPO's 1e-3 and TraDo's 0.01 would give three methods an anchor the others lack).
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {"beta": 0.0}),
    "espo": ("espo", {"beta": 0.0}),
    "spg": ("spg", {}),
    "trado": ("trado", {"beta": 0.0}),
    "stabledrl": ("stabledrl", {}),
}
# StableDRL's two halves alone (paper Fig. 5): unconditional clipping without self-normalisation, and the reverse.
ABLATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "clip_only": ("stabledrl_clip_only", {}),
    "selfnorm_only": ("stabledrl_selfnorm_only", {}),
}
# The exploding test: every method with a ratio to explode (TraDo replays traces, out of its noise model) and SPG.
EXPLODING_METHODS = {**{m: METHODS[m] for m in ("grpo", "espo", "spg", "stabledrl")}, **ABLATIONS}
CLIP_THRESHOLDS = (1.0, 5.0, 100.0, 1000.0)


class TrainingExperimentOptions(Protocol):
    """What :func:`training_experiment` reads of an experiment's options (its record's settings are all of them)."""

    @property
    def conditions(self) -> str: ...

    @property
    def sweep(self) -> SweepOptions: ...


class MethodSweepOptions(TrainingExperimentOptions, Protocol):
    """What :func:`method_sweep` reads besides: ``--methods``."""

    @property
    def methods(self) -> str: ...


def effective_options(baseline: str, chosen: dict[str, Any]) -> dict[str, Any]:
    """Every option of ``baseline``'s config as the run used it (defaults filled in): its beta, num_mc, ..."""
    return dataclasses.asdict(build_baseline(baseline, **chosen).config)


def training_experiment(
    stress: StressOptions,
    options: TrainingExperimentOptions,
    experiment: str,
    title: str,
    labels: list[str],
    make_spec: Callable[[str, str, int], RunSpec],
    shared_normal: Callable[[RunSpec], bool],
    extra: dict[str, Any] | None = None,
    num_iterations: int = 2,
) -> Path:
    """Shared body of the training experiments: labels x conditions x seeds of real runs from one warm start, mu =
    ``num_iterations``."""
    start = (time.perf_counter(), time.process_time())
    sweep, training = options.sweep, options.sweep.training
    conditions = comma_list(options.conditions, "--conditions", choices=CONDITIONS, what="condition")
    seeds = comma_list(training.seeds, "--seeds", kind=int, what="seed")
    definitions = sweep.definitions.definitions()
    train = train_settings(stress, sweep, num_iterations=num_iterations)
    path, info, model = warm_start(sweep.model, stress.runs)
    train = dataclasses.replace(train, warm_start=str(path))
    specs = [make_spec(label, condition, seed) for label in labels for condition in conditions for seed in seeds]
    rows, frozen, cost = run_sweep(
        specs, train, Path(stress.runs), definitions, training.jobs, f"{experiment} runs", shared_normal
    )
    plots = plot_sweep(
        rows, frozen, labels, conditions, Path(stress.results), experiment, title, definitions.reward_window
    )
    payload = {
        "title": title,
        **(extra or {}),
        "settings": recorded_settings(experiment, options),
        "seeds": seeds,
        "definitions": {**definitions.to_dict(), "text": definitions.describe()},
        "warm_start": info,
        "model": model,
        **train.describe(),
        "learning_rate_source": "--lr" if training.lr is not None else f"stability/{LRSWEEP}.json",
        "runs": rows,
        "frozen": frozen,
        "summary": aggregate(rows, labels, conditions),
        "plots": plots,
        "jobs": cost,
        **runtime(start, training.jobs, info, cost["worker_cpu_seconds"]),
    }
    return write_record(stress.results, experiment, payload)


def method_sweep(
    stress: StressOptions,
    options: MethodSweepOptions,
    experiment: str,
    title: str,
    methods: dict[str, tuple[str, dict[str, Any]]],
    num_iterations: int = 2,
) -> Path:
    """A sweep over ``--methods`` (display name -> registered baseline and options) x conditions x seeds. SPG has
    no ratio, so its exploding row is its normal run."""
    chosen = comma_list(options.methods, "--methods", choices=methods, what="method")
    return training_experiment(
        stress,
        options,
        experiment,
        title,
        chosen,
        lambda m, condition, seed: RunSpec(m, methods[m][0], tuple(sorted(methods[m][1].items())), condition, seed),
        shared_normal=lambda spec: spec.condition == "exploding" and spec.baseline == "spg",
        extra={
            "methods": {
                m: {
                    "baseline": methods[m][0],
                    "options": methods[m][1],
                    "effective": effective_options(*methods[m]),
                }
                for m in chosen
            },
        },
        num_iterations=num_iterations,
    )


# ----------------------------------------------------------------------------------------------- commands
@dataclass(frozen=True)
class ExplodingOptions:
    """``stress exploding``: which methods under which conditions, and the training sweep's options."""

    methods: str = option(",".join(EXPLODING_METHODS), f"subset of {', '.join(EXPLODING_METHODS)}")
    conditions: str = option(",".join(CONDITIONS))
    sweep: SweepOptions = field(default=SweepOptions())


@dataclass(frozen=True)
class ClipOptions:
    """``stress clip``: which thresholds C of StableDRL under which conditions, and the training sweep's options."""

    thresholds: str = option(",".join(f"{c:g}" for c in CLIP_THRESHOLDS))
    conditions: str = option(",".join(CONDITIONS))
    sweep: SweepOptions = field(default=SweepOptions())


def _run_exploding(stress: StressOptions, options: ExplodingOptions) -> Path:
    return method_sweep(stress, options, "exploding", "Exploding-weight stress test", EXPLODING_METHODS)


def _run_clip(stress: StressOptions, options: ClipOptions) -> Path:
    thresholds = comma_list(options.thresholds, "--thresholds", kind=float, what="threshold")
    if any(not c > 0 for c in thresholds):
        raise UserError("--thresholds must be positive")
    by_label = {f"C={c:g}": c for c in thresholds}
    return training_experiment(
        stress,
        options,
        "clip",
        "Clip-threshold ablation",
        list(by_label),
        lambda label, condition, seed: RunSpec(
            label, "stabledrl", (("clip_threshold", by_label[label]),), condition, seed
        ),
        shared_normal=lambda _: False,
        extra={"thresholds": thresholds},
    )


EXPERIMENTS.register(
    "exploding",
    Experiment(
        "exploding",
        "methods x {normal, exploding} x seeds: rewards, spikes, collapse",
        ExplodingOptions,
        _run_exploding,
        report=training_block,
        observations=exploding_claims,
    ),
)
EXPERIMENTS.register(
    "clip",
    Experiment(
        "clip",
        "StableDRL clip threshold C sweep x conditions x seeds",
        ClipOptions,
        _run_clip,
        report=functools.partial(training_block, label_name="clip threshold"),
        observations=clip_claims,
    ),
)
