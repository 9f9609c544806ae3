"""What the stability experiments share on the command line: option groups, the stress budget and warm start,
and the :data:`EXPERIMENTS` registry through which each experiment module adds its command.

An experiment is one module that registers an :class:`Experiment` (its options and its run function); the
``stress`` command line is built from the registry, so adding an experiment edits nothing else (a package can add
one through the ``stabledrl_bench.stress_experiments`` entry-point group).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabledrl_bench.core.registry import Registry
from stabledrl_bench.errors import UserError, positive_int
from stabledrl_bench.experiments.runner import ensure_warm_start
from stabledrl_bench.experiments.stress.common import (
    LRSWEEP,
    STRESS_CANVAS,
    Definitions,
    ExplodingNoise,
    stress_warm_start,
)
from stabledrl_bench.training.budget import Budget


@dataclass(frozen=True)
class Experiment:
    """One ``stress`` command: its help line, its options and what it runs (returns the record it wrote).

    ``report(record, link_base)`` renders its record in the leaderboard's Stability section and
    ``observations(record or None)`` gives its lines under "What we observed" (the built-in experiments' are in
    :mod:`.tables` and :mod:`.observations`); left out, the experiment gets a generic block (title, settings, plots)
    and no verdict.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], Path]
    report: Callable[[Mapping[str, Any], str], str] | None = None
    observations: Callable[[Mapping[str, Any] | None], list[str]] | None = None


def _experiment(name: str, experiment: Experiment) -> Experiment:
    if not isinstance(experiment, Experiment) or experiment.name != name:
        raise TypeError(f"stress experiment {name!r} must be an Experiment named {name!r}, got {experiment!r}")
    return experiment


EXPERIMENTS: Registry[Experiment] = Registry(
    "stress experiment",
    "stress_experiments",
    builtins=(
        "stabledrl_bench.experiments.stress.lrsweep",  # first: `stress all` chooses the rate the others use
        "stabledrl_bench.experiments.stress.training",
        "stabledrl_bench.experiments.stress.drift",
        "stabledrl_bench.experiments.stress.hull",
        "stabledrl_bench.experiments.stress.longrun",
    ),
    check=_experiment,
)


def in_order() -> list[str]:
    """Every registered experiment, the learning-rate sweep first (the training experiments use its rate)."""
    return [LRSWEEP, *(name for name in EXPERIMENTS.entries() if name != LRSWEEP)]


def stress_budget(args: argparse.Namespace, steps: int) -> Budget:
    """The stress budget: the tiny Table 1 canvas (L = 48, block 8, T = 0.9) and mu = 2, the official recipe's, with
    ``--prompts`` x ``--generations`` rollouts and ``--diffusion-steps`` (an experiment with a ``--num-iterations``
    option sets mu itself)."""
    return Budget(
        max_steps=steps,
        prompts_per_step=args.prompts,
        num_generations=args.generations,
        num_iterations=getattr(args, "num_iterations", 2),
        max_completion_length=STRESS_CANVAS,
        diffusion_steps=args.diffusion_steps,
        block_length=8,
        temperature=0.9,
        max_prompt_length=64,
    )


# ------------------------------------------------------------------------------------------------ parsers
def add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", default="results", help="results folder (records go to <results>/stability)")
    p.add_argument("--runs", default="runs/stress", help="cache of the warm start and the training runs")
    p.add_argument("--leaderboard", default="leaderboard.md", help="leaderboard file to rebuild afterwards")
    p.add_argument("--no-leaderboard", action="store_true", help="do not rebuild the leaderboard")


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warm-start", help="use this model folder instead of the cached stress warm start")
    p.add_argument(
        "--preset",
        help="train on a Table 1 preset's --task (its data, rewards, budget, precision) instead of the stress task, "
        "e.g. --preset paper --task gsm8k --warm-start /path/to/LLaDA-8B-Instruct",
    )
    p.add_argument("--task", help="the --preset's task")
    p.add_argument("--sft-steps", type=positive_int, help="SFT steps of the warm start (default: the preset's)")
    p.add_argument("--prompts", type=positive_int, default=4, help="prompts per step")
    # G = 8 for every method: 16 (the official) doubles every run's cost, which 2 CPU cores cannot afford for
    # 5 methods x 5 seeds x 500 steps; it is one option away for a machine that can.
    p.add_argument("--generations", type=positive_int, default=8, help="completions per prompt (group size G)")
    p.add_argument(
        "--diffusion-steps", type=positive_int, default=12, help="rollout denoising steps over the 48 tokens"
    )


def add_noise(p: argparse.ArgumentParser) -> None:
    p.add_argument("--noise-df", type=float, default=ExplodingNoise.df, help="Student-t df of the noise (1 = Cauchy)")
    p.add_argument("--noise-scale", type=float, default=ExplodingNoise.scale, help="noise scale on the log-ratio")
    p.add_argument("--noise-prob", type=float, default=ExplodingNoise.probability, help="probability per ratio")


def add_definitions(p: argparse.ArgumentParser) -> None:
    d = Definitions()
    p.add_argument("--spike-k", type=float, default=d.spike_k, help="spike: norm > k x running median")
    p.add_argument("--spike-window", type=positive_int, default=d.spike_window, help="running-median window (steps)")
    p.add_argument("--collapse-fraction", type=float, default=d.collapse_fraction, help="of the initial reward")
    p.add_argument("--reward-window", type=positive_int, default=d.reward_window, help="running-mean window (rollouts)")
    p.add_argument("--confirm-steps", type=positive_int, default=d.confirm_steps, help="steps a collapse must last")


def add_training(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
    p.add_argument("--steps", type=positive_int, default=120, help="optimizer steps per run (budget.max_steps)")
    p.add_argument("--lr", type=float, help="peak AdamW learning rate (default: the rate `stress lrsweep` chose)")
    p.add_argument("--lr-scheduler", default="linear", help="learning-rate schedule (official: linear decay to 0)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (official: 0.1)")
    p.add_argument("--max-grad-norm", type=float, default=0.2, help="gradient clipping (official 0.2; pre-clip logged)")
    p.add_argument("--jobs", type=positive_int, default=2, help="parallel worker processes (one thread each)")


def add_training_sweep(p: argparse.ArgumentParser) -> None:
    """Every option group of an experiment made of training runs."""
    for add in (add_output, add_model, add_noise, add_definitions, add_training):
        add(p)


# ------------------------------------------------------------------------------------------------ settings
def noise(args: argparse.Namespace) -> ExplodingNoise:
    return ExplodingNoise(df=args.noise_df, scale=args.noise_scale, probability=args.noise_prob)


def definitions(args: argparse.Namespace) -> Definitions:
    return Definitions(
        spike_k=args.spike_k,
        spike_window=args.spike_window,
        collapse_fraction=args.collapse_fraction,
        reward_window=args.reward_window,
        confirm_steps=args.confirm_steps,
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


def chosen_preset(args: argparse.Namespace) -> Any:
    """``--preset`` checked with its ``--task`` and, for a preset without a warm start of its own, ``--warm-start``
    (None: the stress settings, which take no ``--task``)."""
    if args.preset is None:
        if args.task is not None:
            raise UserError("--task needs --preset (the stress settings have their own task)")
        return None
    chosen = preset(args.preset, args.task)
    if chosen.task_sft(args.task) is None and args.warm_start is None:
        raise UserError(f"--preset {args.preset} trains a given model: pass --warm-start /path/to/model")
    return chosen


def warm_start(args: argparse.Namespace) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Warm-start folder, its description and the model summary (parameter count etc.): ``--warm-start``, else the
    stress warm start, or with ``--preset`` that preset's warm start of ``--task`` (training seed 0)."""
    from stabledrl_bench.core.models.backends import load_diffusion_lm

    chosen = chosen_preset(args)
    if chosen is None:
        spec, folder = stress_warm_start(args.sft_steps), Path(args.runs) / "sft"
    else:
        from stabledrl_bench.experiments.reproduce import warm_start_spec

        spec = None if args.warm_start else warm_start_spec(chosen, args.task, chosen.model, seed=0)
        folder = Path(args.runs) / f"sft-{args.preset}-{args.task}"
    path, info = ensure_warm_start(spec, folder, override=args.warm_start)
    return path, info, load_diffusion_lm(path).config_summary()


def check_positive(**values: float) -> None:
    bad = [f"--{k.replace('_', '-')}" for k, v in values.items() if not v > 0]
    if bad:
        raise UserError(f"{', '.join(bad)} must be positive")


def runtime(
    start: tuple[float, float], workers: int, warm_start: Mapping[str, Any] | None, worker_cpu: float = 0.0
) -> dict[str, Any]:
    """Wall time of this invocation, and the cost of the whole experiment from scratch, which does not depend on
    what was cached: CPU seconds of the warm-start SFT (as recorded when it was built; its wall time for older
    records), of this process and of every run (as recorded by the run), and from them the estimated wall time on
    ``workers`` free cores. A shared machine makes measured wall times pessimistic, hence the load average."""
    main_cpu = time.process_time() - start[1]
    warm = warm_start or {}
    sft_cpu = warm.get("sft_cpu_seconds") or warm.get("sft_seconds") or 0.0
    other_cpu = main_cpu - (sft_cpu if warm.get("built_now") else 0.0)
    return {
        "runtime_s": time.perf_counter() - start[0],
        "cpu_seconds": {"warm_start": sft_cpu, "main": other_cpu, "workers": worker_cpu},
        "estimated_free_cores_s": sft_cpu + other_cpu + worker_cpu / max(1, workers),
        "cores": workers,
        "load_average": os.getloadavg(),
    }


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Every command-line setting except where files go."""
    return {k: v for k, v in vars(args).items() if k not in ("results", "runs", "leaderboard", "no_leaderboard")}
