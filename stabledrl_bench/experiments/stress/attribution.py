"""``attribution``: which part of a method a collapse comes from, by switching one part at a time.

The ``exploding`` test shows GRPO collapsing on every seed and ESPO on some under injected ratio noise, and nothing
collapsing without it (``longrun``). This experiment re-runs those methods under the same noise with one change
each, on the same seeds, warm start and knobs, so that a change in the collapse count names the cause:

* ``*_mc1``: one Monte-Carlo mask sample per ELBO instead of two (noisier log-ratios);
* ``stabledrl_coupled``: the current and the rollout estimate share their masks (the official code draws the
  rollout's independently), so their difference carries no mask noise;
* ``*_anchor``: KL on, with the same anchor for every method (``TrainConfig.anchor_beta``: k3 of the per-token
  sequence log-ratio to the frozen start on one shared ELBO estimator, beta = 0.04); each method's own KL term is
  ``*_kl`` (GRPO's and ESPO's defaults), which SPG and StableDRL do not have.

SPG has no ratio, so the noise cannot reach it; TraDo replays traces, outside the noise model. Both are left out
by default (``--methods`` takes any label of the long run's table).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from stabledrl_bench.experiments.stress.observations import attribution_observations
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
from stabledrl_bench.experiments.stress.training import METHODS_AND_VARIANTS, method_sweep

# Each method that collapses (or is the paper's answer to it) under exploding ratios, with its one-change variants.
DEFAULT_LABELS = (
    "grpo",
    "grpo_anchor",
    "espo",
    "espo_mc1",
    "espo_anchor",
    "stabledrl",
    "stabledrl_mc1",
    "stabledrl_coupled",
    "stabledrl_anchor",
)


@dataclass(frozen=True)
class AttributionOptions:
    """``stress attribution``: which variants under which conditions (exploding by default), 120 steps, 5 seeds."""

    methods: str = option(",".join(DEFAULT_LABELS), f"subset of {', '.join(METHODS_AND_VARIANTS)}")
    conditions: str = option("exploding", "exploding (default) and/or normal")
    sweep: SweepOptions = field(default=SweepOptions(training=TrainingOptions(seeds="0,1,2,3,4")))


def _run(stress: StressOptions, options: AttributionOptions) -> Path:
    return method_sweep(
        stress, options, "attribution", "Attribution of collapses: one change at a time", METHODS_AND_VARIANTS
    )


EXPERIMENTS.register(
    "attribution",
    Experiment(
        "attribution",
        "one change at a time (num_mc 1, shared masks, one KL anchor) under exploding ratios: the cause",
        AttributionOptions,
        _run,
        report=functools.partial(training_block, label_name="variant"),
        observations=attribution_observations,
        rederive=rederive,
    ),
)
