"""``longrun``: the paper's central claim on a real training loop, with no injected noise.

The claim (docs/published-numbers.md §1.4-1.5): GRPO-style baselines collapse after a few hundred steps, while StableDRL
trains stably for 1000+ steps. The ``exploding`` experiment tests the mechanism with *injected* ratio noise; this one
lets the estimators' own noise do the work. Every method trains for ``--steps`` (default 1000) optimizer steps from
the stress warm start, at settings where estimator noise matters:

* one Monte-Carlo sample per likelihood estimate (``num_mc = 1`` for ESPO, SPG and StableDRL; GRPO's one-step
  estimator and TraDo's trajectory replay have no such knob);
* ``mu = 4`` optimizer steps per rollout, so later inner steps are off-policy and the ratios matter;
* a learning rate 10x the stress test's (1e-3).

Collapse and spikes follow the stress test's :class:`~stabledrl_bench.experiments.stress.common.Definitions`, and
every seed has the runner's frozen control. Whatever happens is reported: the leaderboard's verdict compares it
with the claim.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from stabledrl_bench.experiments.stress import options
from stabledrl_bench.experiments.stress.options import EXPERIMENTS, Experiment
from stabledrl_bench.experiments.stress.training import RunSpec, training_experiment

# Display name -> (registered baseline, options): each method with its noisiest estimator setting.
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {}),
    "espo": ("espo", {"num_mc": 1}),
    "spg": ("spg", {"num_mc": 1}),
    "trado": ("trado", {}),
    "stabledrl": ("stabledrl", {"num_mc": 1}),
}


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", default=",".join(METHODS), help=f"subset of {', '.join(METHODS)}")
    p.add_argument("--conditions", default="normal", help="normal (default) and/or exploding")
    for add in (
        options.add_output,
        options.add_model,
        options.add_noise,
        options.add_definitions,
        options.add_training,
    ):
        add(p)
    p.add_argument("--num-iterations", type=options.positive_int, default=4, help="mu: optimizer steps per rollout")
    p.set_defaults(steps=1000, lr=1e-3, seeds="0,1")


def _run(args: argparse.Namespace) -> Path:
    methods = options.names(args.methods, METHODS, "--methods")
    return training_experiment(
        args,
        "longrun",
        "Long-run stability without injected noise",
        methods,
        lambda m, condition, seed: RunSpec(m, METHODS[m][0], tuple(sorted(METHODS[m][1].items())), condition, seed),
        shared_normal=lambda spec: spec.condition == "exploding" and spec.baseline == "spg",
        extra={"methods": {m: {"baseline": METHODS[m][0], "options": METHODS[m][1]} for m in methods}},
    )


EXPERIMENTS.register(
    "longrun",
    Experiment("longrun", "every method for 1000 steps at noisy-estimator settings: collapse or not", _arguments, _run),
)
