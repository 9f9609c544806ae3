"""Training experiments of the stress test: ``exploding`` (methods x {normal, exploding} x seeds) and ``clip``
(StableDRL's clip threshold C x conditions x seeds), and the method table and record writer that ``lrsweep`` and
``longrun`` share with them. Every run is a real :class:`~stabledrl_bench.training.trainer.RLTrainer` run from the
same warm start under the same budget, learning rate and seeds (:mod:`.settings`), run and analysed by
:mod:`.sweep`.

Methods without an importance ratio (SPG) are unaffected by the noise, so their ``exploding`` row is the ``normal``
run itself (marked ``shared_with_normal``), not a second identical run.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stabledrl_bench.core.baseline import build_baseline
from stabledrl_bench.errors import UserError, comma_list
from stabledrl_bench.experiments.stress.common import CONDITIONS, LRSWEEP, runtime, write_record
from stabledrl_bench.experiments.stress.observations import clip_claims, exploding_claims
from stabledrl_bench.experiments.stress.options import (
    EXPERIMENTS,
    Experiment,
    StressOptions,
    SweepOptions,
    option,
    recorded_settings,
)
from stabledrl_bench.experiments.stress.settings import train_settings, warm_start
from stabledrl_bench.experiments.stress.sweep import (
    RunSpec,
    aggregate,
    plot_sweep,
    rederive,
    run_sweep,
    split_options,
)
from stabledrl_bench.experiments.stress.tables import training_block

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
# The same KL anchor for every method (TrainConfig.anchor_beta: k3 of the per-token sequence log-ratio to the frozen
# start, on one shared ELBO estimator), at d1's GRPO coefficient: the "KL on" of the attribution runs, equal for all.
ANCHOR_BETA = 0.04
# Cause-finding variants: the noisier one-sample estimators, shared masks, each method's own KL anchor switched on
# (GRPO k3 to the reference, ESPO k2 on the ELBO, TraDo k3 to the old policy; SPG and StableDRL have none) and the
# same anchor for every method (``*_anchor``).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "espo_mc1": ("espo", {"beta": 0.0, "num_mc": 1}),
    "spg_mc1": ("spg", {"num_mc": 1}),
    "stabledrl_mc1": ("stabledrl", {"num_mc": 1}),
    "stabledrl_coupled": ("stabledrl", {"coupled": True}),
    "grpo_kl": ("grpo", {}),
    "espo_kl": ("espo", {}),
    "trado_kl": ("trado", {}),
    **{f"{m}_anchor": (name, {**options, "anchor_beta": ANCHOR_BETA}) for m, (name, options) in METHODS.items()},
}
# Every label the long-run experiments and the attribution accept: the five methods and their variants.
METHODS_AND_VARIANTS = {**METHODS, **VARIANTS}
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
    """Every option of ``baseline``'s config as the run used it (defaults filled in): its beta, num_mc, ..., and the
    trainer's shared ``anchor_beta``."""
    options, anchor_beta = split_options(chosen)
    return {**dataclasses.asdict(build_baseline(baseline, **options).config), "anchor_beta": anchor_beta}


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
    conditions: str = option(",".join(CONDITIONS), f"subset of {', '.join(CONDITIONS)}")
    sweep: SweepOptions = field(default=SweepOptions())


@dataclass(frozen=True)
class ClipOptions:
    """``stress clip``: which thresholds C of StableDRL under which conditions, and the training sweep's options."""

    thresholds: str = option(",".join(f"{c:g}" for c in CLIP_THRESHOLDS), "comma-separated clip thresholds C")
    conditions: str = option(",".join(CONDITIONS), f"subset of {', '.join(CONDITIONS)}")
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
        rederive=rederive,
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
        rederive=rederive,
    ),
)
