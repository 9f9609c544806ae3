"""``python -m stabledrl_bench stress {exploding,drift,clip,hull,all} [options]``: one command per experiment.

The commands come from the :data:`~stabledrl_bench.experiments.stress.options.EXPERIMENTS` registry (each experiment
module registers its own options and run function). Each writes ``<results>/stability/<experiment>.json`` (settings,
seeds, definitions, warm start, budget and its hash, hardware, per-run numbers and curves) and its PNG plots, then
rebuilds the leaderboard (whose Stability section is generated from those files) unless ``--no-leaderboard``.
Training runs are jobs of the experiment runner, cached under ``--runs`` (default ``runs/stress``), so an
interrupted command resumes by being run again.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from stabledrl_bench.errors import CommandParser, UserError, positive_int
from stabledrl_bench.experiments.stress import options
from stabledrl_bench.experiments.stress.options import EXPERIMENTS


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m stabledrl_bench stress", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="experiment", required=True)
    for name, experiment in EXPERIMENTS.items():
        experiment.add_arguments(sub.add_parser(name, help=experiment.help))
    p = sub.add_parser("all", help="every experiment in turn with its default settings")
    options.add_output(p)
    p.add_argument("--jobs", type=positive_int, default=2)
    p.add_argument("--warm-start")
    return parser


def _refresh_leaderboard(args: argparse.Namespace) -> None:
    if args.no_leaderboard:
        return
    from stabledrl_bench.experiments.stress.report import stability_section
    from stabledrl_bench.reporting.leaderboard import write_leaderboard

    try:
        path = write_leaderboard(
            args.results,
            args.leaderboard,
            plots_dir=Path(args.results) / "plots",
            extra_sections=[stability_section],
        )
    except UserError as exc:  # the stability records are written; a problem elsewhere must not hide that
        print(f"warning: leaderboard not rebuilt: {exc}")
        return
    print(f"leaderboard: {path}")


def main(argv: list[str] | None = None) -> int:
    """Entry point behind ``python -m stabledrl_bench stress``; user errors raise :class:`UserError`.

    Every process of a stress command uses one intra-op thread: for a 0.1 M-parameter model, threads cost more in
    synchronisation than they gain (measured: SFT 2.6x slower with 2 threads on a loaded 2-core machine), and the
    training sweeps get their parallelism from ``--jobs`` worker processes instead.
    """
    import torch

    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    names = options.in_order() if args.experiment == "all" else [args.experiment]
    for name in names:
        sub_args = args
        if args.experiment == "all":  # each experiment's defaults, and the shared options it has
            sub_args = build_parser().parse_args([name, "--results", args.results, "--runs", args.runs])
            sub_args.no_leaderboard = True
            for key in ("jobs", "warm_start"):
                if hasattr(sub_args, key) and getattr(args, key) is not None:
                    setattr(sub_args, key, getattr(args, key))
        start = time.perf_counter()
        path = EXPERIMENTS.get(name).run(sub_args)
        print(f"stress {name}: {path} ({time.perf_counter() - start:.0f} s)")
    _refresh_leaderboard(args)
    return 0
