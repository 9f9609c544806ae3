"""``longrun``: the paper's central claim on a real training loop, with no injected noise.

The claim (docs/published-numbers.md §1.4-1.5): GRPO-style baselines collapse after a few hundred steps, while StableDRL
trains stably for 1000+ steps. The ``exploding`` experiment tests the mechanism with *injected* ratio noise; this one
lets the estimators' own noise do the work. Every method trains ``--steps`` (default 500) optimizer steps on
``--seeds`` (default five) from the stress warm start, under the same settings for all: the official recipe's
knobs (num_mc = 2, mu = 2, one group size, AdamW with weight decay 0.1, linear decay, clipping at 0.2), beta = 0 for
every method, and the learning rate the recorded sweep chose (``stress lrsweep``).

Collapse and spikes follow :class:`~stabledrl_bench.experiments.stress.common.Definitions` (judged against every
seed's frozen control); ``--methods`` also offers the ablations that attribute a collapse to a cause: one
Monte-Carlo sample instead of two (``*_mc1``), StableDRL with the rollout's masks shared by the current estimate
(``stabledrl_coupled``), the KL anchors switched on (``*_kl``, each method's default beta) and one anchor for every
method alike (``*_anchor``, the trainer's ``anchor_beta``). Whatever happens
is reported: the leaderboard's verdict compares it with the claim.

``anchored`` is the same long run with the other KL setting that treats every method alike: one anchor for all
(``*_anchor``; the methods' own KL terms stay off), its own record, judged against the same claim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stabledrl_bench.errors import positive_int
from stabledrl_bench.experiments.stress.observations import anchored_claims, longrun_claims
from stabledrl_bench.experiments.stress.options import (
    EXPERIMENTS,
    Experiment,
    StressOptions,
    SweepOptions,
    TrainingOptions,
    option,
)
from stabledrl_bench.experiments.stress.sweep import rederive
from stabledrl_bench.experiments.stress.tables import training_block
from stabledrl_bench.experiments.stress.training import METHODS, METHODS_AND_VARIANTS, method_sweep


@dataclass(frozen=True)
class LongRunOptions:
    """``stress longrun``: which methods under which conditions, the training sweep's options (500 steps, 5 seeds)
    and mu."""

    methods: str = option(",".join(METHODS), f"subset of {', '.join(METHODS_AND_VARIANTS)}")
    conditions: str = option("normal", "normal (default) and/or exploding")
    sweep: SweepOptions = field(default=SweepOptions(training=TrainingOptions(steps=500, seeds="0,1,2,3,4")))
    num_iterations: int = option(2, "mu: optimizer steps per rollout", parse=positive_int)


ANCHORED = [f"{m}_anchor" for m in METHODS]


@dataclass(frozen=True)
class AnchoredOptions(LongRunOptions):
    """``stress anchored``: the long run with the same KL anchor for every method (the ``*_anchor`` labels)."""

    methods: str = option(",".join(ANCHORED), f"subset of {', '.join(METHODS_AND_VARIANTS)}")


def _long_run(experiment: str, title: str) -> Callable[[StressOptions, LongRunOptions], Path]:
    """The run function of a long-run experiment: its ``--methods`` (of the long run's table) for its steps and
    seeds, mu = ``--num-iterations``, written as ``<experiment>.json``."""

    def run(stress: StressOptions, options: LongRunOptions) -> Path:
        return method_sweep(
            stress, options, experiment, title, METHODS_AND_VARIANTS, num_iterations=options.num_iterations
        )

    return run


EXPERIMENTS.register(
    "longrun",
    Experiment(
        "longrun",
        "every method for 500 steps under the official knobs: collapse or not",
        LongRunOptions,
        _long_run("longrun", "Long-run stability without injected noise"),
        report=training_block,
        observations=longrun_claims,
        rederive=rederive,
    ),
)
EXPERIMENTS.register(
    "anchored",
    Experiment(
        "anchored",
        "the long run with the same KL anchor for every method (beta = 0.04 on one shared estimator)",
        AnchoredOptions,
        _long_run("anchored", "Long run with one KL anchor for every method"),
        report=training_block,
        observations=anchored_claims,
        rederive=rederive,
    ),
)
