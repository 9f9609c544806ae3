"""``python -m stabledrl_bench stress <experiment> [options]``: one command per registered experiment, and ``all``.

The commands come from the :data:`~stabledrl_bench.experiments.stress.options.EXPERIMENTS` registry: each
experiment's options dataclass becomes its ``--options`` here, and the parsed command line becomes typed objects
(:class:`~.options.StressOptions` and the experiment's own) before anything runs, so nothing below this module sees
``argparse``. Each command writes ``<results>/stability/<experiment>.json`` (settings, seeds, definitions, warm start,
budget and its hash, hardware, per-run numbers and curves) and its PNG plots, then rebuilds the leaderboard (whose
Stability section is generated from those files) unless ``--no-leaderboard``. Training runs are jobs of the
experiment runner, cached under ``--runs`` (default ``runs/stress``), so an interrupted command resumes by being run
again.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from stabledrl_bench.errors import CommandParser, UserError, on_interrupt, positive_int
from stabledrl_bench.experiments.stress.options import EXPERIMENTS, StressOptions, in_order, option_fields
from stabledrl_bench.experiments.stress.report import stability_section

T = TypeVar("T")
REDERIVE_OPTIONS = ("results", "leaderboard", "no_leaderboard")  # `stress rederive` reads and writes records only


def _add_arguments(parser: argparse.ArgumentParser, options: Iterable[tuple[dataclasses.Field, Any]]) -> None:
    """``--<name>`` for every (option, default) pair, parsed as :func:`~.options.option` says."""
    for f, default in options:
        flag, help_text, parse = f"--{f.name.replace('_', '-')}", f.metadata.get("help"), f.metadata.get("parse")
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true", help=help_text)
            continue
        if parse is None and isinstance(default, int | float):
            parse = type(default)
        parser.add_argument(flag, type=parse, default=default, help=help_text)


def _add_experiment(parser: argparse.ArgumentParser, own: Any) -> None:
    """The experiment's options in declaration order, where files go (:class:`StressOptions`) listed before its
    first option group (last when it has none)."""
    common = list(option_fields(StressOptions()))
    for f in dataclasses.fields(own):
        value = getattr(own, f.name)
        if dataclasses.is_dataclass(value):
            _add_arguments(parser, common)
            common = []
            _add_arguments(parser, option_fields(value))
        else:
            _add_arguments(parser, [(f, value)])
    _add_arguments(parser, common)


def _typed(options: T, args: argparse.Namespace) -> T:
    """``options`` (an options dataclass) with every option's value parsed into ``args``, groups recursively."""
    values = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        values[f.name] = _typed(value, args) if dataclasses.is_dataclass(value) else getattr(args, f.name)
    return dataclasses.replace(options, **values)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m stabledrl_bench stress",
        description="The stability experiments of the paper on the tiny model, one command each (listed below); "
        "`stress <experiment> --help` gives its options.",
    )
    sub = parser.add_subparsers(dest="experiment", required=True)
    for name, experiment in EXPERIMENTS.items():
        _add_experiment(sub.add_parser(name, help=experiment.help), experiment.options())
    p = sub.add_parser(
        "rederive",
        help="recompute every record's derived fields (summaries, verdicts' numbers) from its stored curves, after "
        "the analysis changed; trains nothing",
    )
    _add_arguments(p, [(f, d) for f, d in option_fields(StressOptions()) if f.name in REDERIVE_OPTIONS])
    p = sub.add_parser("all", help="every experiment in turn with its default settings")
    _add_arguments(p, option_fields(StressOptions()))
    p.add_argument("--jobs", type=positive_int, default=2, help="parallel worker processes of the training sweeps")
    p.add_argument("--warm-start", help="use this model folder instead of the cached stress warm start")
    return parser


def _refresh_leaderboard(stress: StressOptions) -> None:
    if stress.no_leaderboard:
        return
    from stabledrl_bench.reporting.leaderboard import write_leaderboard  # pandas and matplotlib: not for --help

    try:
        path = write_leaderboard(
            stress.results,
            stress.leaderboard,
            plots_dir=Path(stress.results) / "plots",
            extra_sections=[stability_section],
        )
    except UserError as exc:  # the stability records are written; a problem elsewhere must not hide that
        print(f"warning: leaderboard not rebuilt: {exc}")
        return
    print(f"leaderboard: {path}")


def _one_of_all(parser: argparse.ArgumentParser, name: str, args: argparse.Namespace) -> argparse.Namespace:
    """``stress all``'s command line for experiment ``name``: its defaults, ``all``'s folders, and the shared
    options it has (``--jobs``, ``--warm-start``); the leaderboard is rebuilt once, at the end."""
    one = parser.parse_args([name, "--results", args.results, "--runs", args.runs])
    one.no_leaderboard = True
    for key in ("jobs", "warm_start"):
        if hasattr(one, key) and getattr(args, key) is not None:
            setattr(one, key, getattr(args, key))
    return one


# What re-running an interrupted `stress` command does (its runs go through the experiment runner's cache).
RERUN = (
    "re-run the same command to go on: finished training runs are reused, interrupted ones resume from their last "
    "checkpoint"
)


def main(argv: list[str] | None = None) -> int:
    """Entry point behind ``python -m stabledrl_bench stress``; user errors raise :class:`UserError`.

    Every process of a stress command uses one intra-op thread: for a 0.1 M-parameter model, threads cost more in
    synchronisation than they gain (measured: SFT 2.6x slower with 2 threads on a loaded 2-core machine), and the
    training sweeps get their parallelism from ``--jobs`` worker processes instead.
    """
    import torch

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.experiment == "rederive":
        from stabledrl_bench.experiments.stress.recheck import rederive_records

        for line in rederive_records(args.results):
            print(line)
        _refresh_leaderboard(StressOptions(**{name: getattr(args, name) for name in REDERIVE_OPTIONS}))
        return 0
    torch.set_num_threads(1)
    if args.trust_remote_code:  # as the other commands' flag: this process and the job processes it starts
        from stabledrl_bench.core.models.backends import REMOTE_CODE_ENV

        os.environ[REMOTE_CODE_ENV] = "1"
    names = in_order() if args.experiment == "all" else [args.experiment]
    with on_interrupt(lambda: RERUN):
        _run_all(parser, names, args)
    _refresh_leaderboard(_typed(StressOptions(), args))
    return 0


def _run_all(parser: argparse.ArgumentParser, names: list[str], args: argparse.Namespace) -> None:
    for name in names:
        one = _one_of_all(parser, name, args) if args.experiment == "all" else args
        experiment = EXPERIMENTS.get(name)
        start = time.perf_counter()
        path = experiment.run(_typed(StressOptions(), one), _typed(experiment.options(), one))
        print(f"stress {name}: {path} ({time.perf_counter() - start:.0f} s)")
