"""Stability experiments: the paper's mechanism (docs/published-numbers.md §1.4-1.5, §5) on a tiny model.

The claim under test: with *estimated* importance ratios, GRPO's conditional clip lets noise-driven outliers through
(for A < 0 the PPO min keeps rho A, unbounded in rho) as gradient spikes; spikes cause drift, drift widens the ratio
distribution, and the loop ends in reward collapse. StableDRL's unconditional clip plus self-normalisation keeps every
update inside the convex hull of the per-sample terms. Unlike the 8B accuracy tables, this can be measured on a CPU.

===============  ==============================================================  ==================================
command          what                                                            module
===============  ==============================================================  ==================================
``exploding``    methods x {normal, exploding noise} x seeds, real RL runs:      :mod:`.training`
                 reward / pre-clip grad-norm curves, spikes, collapse step
``drift``        spike probability of each update rule vs drift from the         :mod:`.drift`
                 rollout policy (no training loop)
``clip``         StableDRL with C in {1, 5, 100, 1000}                           :mod:`.training`
``hull``         ||update|| vs the convex-hull bound on random inputs            :mod:`.hull`
``lrsweep``      the learning rate the training experiments use                  :mod:`.lrsweep`
``longrun``      every method for 500 steps, no injected noise                   :mod:`.longrun`
``anchored``     the long run with one KL anchor for every method                :mod:`.longrun`
``attribution``  one change at a time (num_mc 1, shared masks, the anchor)       :mod:`.attribution`
                 under exploding ratios: what a collapse comes from
===============  ==============================================================  ==================================

Each module registers its command in :data:`.options.EXPERIMENTS` (an options dataclass, its run function and its
report), and its training runs are jobs of the one experiment runner (:mod:`stabledrl_bench.experiments.runner`),
so a new experiment is one module. :mod:`.cli` turns the command line into typed options, the only place that
parses it. ``python -m stabledrl_bench stress <command>`` writes ``results/stability/<command>.json`` plus PNGs and
rebuilds the leaderboard, whose Stability section (:func:`stability_section`) is generated from those files.
Definitions (spike, collapse, exploding noise) live in :mod:`.common`; the warm start, budget and shared run
settings in :mod:`.settings`; running and analysing a sweep of training runs in :mod:`.sweep`; the section's blocks
in :mod:`.tables` and its verdicts in :mod:`.observations`; ``verify`` recomputes each record's summary from the data
stored beside it (:mod:`.recheck`). The CI regression is ``tests/test_stress.py``.
"""

from stabledrl_bench.experiments.stress.cli import main as cli_main
from stabledrl_bench.experiments.stress.report import stability_section


def main(argv: list[str] | None = None) -> int:
    """``python -m stabledrl_bench stress ...`` (:func:`.cli.main`); imported on call, so that the leaderboard,
    which only needs :func:`stability_section`, does not load the training stack."""

    return cli_main(argv)


__all__ = ["main", "stability_section"]
