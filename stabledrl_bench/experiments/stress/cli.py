"""``python -m stabledrl_bench stress {exploding,drift,clip,hull,all} [options]``: one command per experiment.

Each command writes ``<results>/stability/<experiment>.json`` (settings, seeds, definitions, warm start, budget and
its hash, hardware, per-run numbers and curves) and its PNG plots, then rebuilds the leaderboard (whose Stability
section is generated from those files) unless ``--no-leaderboard``. Training runs are cached under ``--runs``
(default ``runs/stress``), so an interrupted command resumes by being run again.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stabledrl_bench.errors import CommandParser, UserError, positive_int
from stabledrl_bench.experiments.runner import control_config, ensure_warm_start, sample_rollouts
from stabledrl_bench.experiments.stress import drift as drift_mod
from stabledrl_bench.experiments.stress import hull as hull_mod
from stabledrl_bench.experiments.stress.common import (
    CONDITIONS,
    SFT_STEPS,
    Definitions,
    ExplodingNoise,
    parse_list,
    stress_warm_start,
    write_record,
)
from stabledrl_bench.experiments.stress.training import (
    METHODS,
    RunSpec,
    TrainSettings,
    aggregate,
    conditions_arg,
    plot_sweep,
    sweep,
)
from stabledrl_bench.training.budget import Budget

EXPERIMENTS = ("exploding", "drift", "clip", "hull")
CLIP_THRESHOLDS = (1.0, 5.0, 100.0, 1000.0)


def stress_budget(args: argparse.Namespace, steps: int) -> Budget:
    """The stress budget: the tiny preset's canvas (L = 40, block 8, mu = 2, T = 0.9) with fewer prompts and
    diffusion steps, so that a whole sweep fits ~15 minutes on 2 cores."""
    return Budget(
        max_steps=steps,
        prompts_per_step=args.prompts,
        num_generations=args.generations,
        num_iterations=2,
        max_completion_length=40,
        diffusion_steps=args.diffusion_steps,
        block_length=8,
        temperature=0.9,
        max_prompt_length=64,
    )


# ------------------------------------------------------------------------------------------------ parsers
def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", default="results", help="results folder (records go to <results>/stability)")
    p.add_argument("--runs", default="runs/stress", help="cache of the warm start and the training runs")
    p.add_argument("--leaderboard", default="leaderboard.md", help="leaderboard file to rebuild afterwards")
    p.add_argument("--no-leaderboard", action="store_true", help="do not rebuild the leaderboard")


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warm-start", help="use this model folder instead of the cached stress warm start")
    p.add_argument("--sft-steps", type=positive_int, default=SFT_STEPS, help="SFT steps of the warm start")
    p.add_argument("--prompts", type=positive_int, default=4, help="prompts per step")
    p.add_argument("--generations", type=positive_int, default=8, help="completions per prompt (group size G)")
    p.add_argument(
        "--diffusion-steps", type=positive_int, default=10, help="rollout denoising steps over the 40 tokens"
    )


def _add_noise(p: argparse.ArgumentParser) -> None:
    p.add_argument("--noise-df", type=float, default=ExplodingNoise.df, help="Student-t df of the noise (1 = Cauchy)")
    p.add_argument("--noise-scale", type=float, default=ExplodingNoise.scale, help="noise scale on the log-ratio")
    p.add_argument("--noise-prob", type=float, default=ExplodingNoise.probability, help="probability per ratio")


def _add_definitions(p: argparse.ArgumentParser) -> None:
    d = Definitions()
    p.add_argument("--spike-k", type=float, default=d.spike_k, help="spike: norm > k x running median")
    p.add_argument("--spike-window", type=positive_int, default=d.spike_window, help="running-median window (steps)")
    p.add_argument("--collapse-fraction", type=float, default=d.collapse_fraction, help="of the initial reward")
    p.add_argument("--reward-window", type=positive_int, default=d.reward_window, help="running-mean window (rollouts)")
    p.add_argument("--confirm-steps", type=positive_int, default=d.confirm_steps, help="steps a collapse must last")


def _add_training(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
    p.add_argument("--steps", type=positive_int, default=120, help="optimizer steps per run (budget.max_steps)")
    p.add_argument("--lr", type=float, default=1e-4, help="constant AdamW learning rate (the tiny preset's RL lr)")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping (pre-clip norm is logged)")
    p.add_argument("--jobs", type=positive_int, default=2, help="parallel worker processes (one thread each)")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m stabledrl_bench stress", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="experiment", required=True)
    p = sub.add_parser("exploding", help="methods x {normal, exploding} x seeds: rewards, spikes, collapse")
    p.add_argument("--methods", default=",".join(METHODS), help=f"subset of {', '.join(METHODS)}")
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    for add in (_add_output, _add_model, _add_noise, _add_definitions, _add_training):
        add(p)
    p = sub.add_parser("clip", help="StableDRL clip threshold C sweep x conditions x seeds")
    p.add_argument("--thresholds", default=",".join(f"{c:g}" for c in CLIP_THRESHOLDS))
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    for add in (_add_output, _add_model, _add_noise, _add_definitions, _add_training):
        add(p)
    p = sub.add_parser("drift", help="spike probability of each update rule vs drift from the rollout policy")
    p.add_argument(
        "--variants", default=",".join(drift_mod.VARIANTS), help=f"subset of {', '.join(drift_mod.VARIANTS)}"
    )
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    p.add_argument("--levels", default="0,0.02,0.05,0.1,0.2,0.3", help="relative parameter-noise levels sigma")
    p.add_argument(
        "--repeats", type=positive_int, default=16, help="drift directions and mask draws per level and seed"
    )
    p.add_argument("--rollouts", type=positive_int, default=4, help="rollout batches per seed (cycled over repeats)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (rollouts, directions, masks)")
    for add in (_add_output, _add_model, _add_noise):
        add(p)
    p.add_argument("--spike-k", type=float, default=Definitions.spike_k, help="spike: norm > k x reference median")
    p = sub.add_parser("hull", help="convex-hull property of the update on random inputs (no model)")
    p.add_argument("--trials", type=positive_int, default=4000)
    p.add_argument("--scales", default="0.1,0.3,1,3,10", help="Cauchy scales of the log-ratios, cycled over trials")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clip-threshold", type=float, default=5.0)
    _add_output(p)
    p = sub.add_parser("all", help="every experiment in turn with its default settings")
    _add_output(p)
    p.add_argument("--jobs", type=positive_int, default=2)
    p.add_argument("--warm-start")
    return parser


# --------------------------------------------------------------------------------------------- experiments
def _noise(args: argparse.Namespace) -> ExplodingNoise:
    return ExplodingNoise(df=args.noise_df, scale=args.noise_scale, probability=args.noise_prob)


def _definitions(args: argparse.Namespace) -> Definitions:
    return Definitions(
        spike_k=args.spike_k,
        spike_window=args.spike_window,
        collapse_fraction=args.collapse_fraction,
        reward_window=args.reward_window,
        confirm_steps=args.confirm_steps,
    )


def _warm_start(args: argparse.Namespace) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Warm-start folder, its description and the model summary (parameter count etc.)."""
    from stabledrl_bench.core.models.backends import load_diffusion_lm

    if args.sft_steps < 1:
        raise UserError("--sft-steps must be >= 1")
    path, info = ensure_warm_start(stress_warm_start(args.sft_steps), Path(args.runs) / "sft", override=args.warm_start)
    return path, info, load_diffusion_lm(path).config_summary()


def _check_positive(**values: float) -> None:
    bad = [f"--{k.replace('_', '-')}" for k, v in values.items() if not v > 0]
    if bad:
        raise UserError(f"{', '.join(bad)} must be positive")


def _train_settings(args: argparse.Namespace, path: Path, info: dict[str, Any]) -> TrainSettings:
    _check_positive(lr=args.lr, max_grad_norm=args.max_grad_norm, jobs=args.jobs)
    return TrainSettings(
        warm_start=str(path),
        budget=stress_budget(args, args.steps),
        learning_rate=args.lr,
        max_grad_norm=args.max_grad_norm,
        noise=_noise(args),
    )


def _runtime(
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


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Every command-line setting except where files go."""
    return {k: v for k, v in vars(args).items() if k not in ("results", "runs", "leaderboard", "no_leaderboard")}


def _training_experiment(
    args: argparse.Namespace,
    experiment: str,
    title: str,
    labels: list[str],
    make_spec: Callable[[str, str, int], RunSpec],
    shared_normal: Callable[[RunSpec], bool],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Shared body of ``exploding`` and ``clip``: labels x conditions x seeds of real runs from one warm start."""
    start = (time.perf_counter(), time.process_time())
    conditions = conditions_arg(args.conditions)
    seeds = parse_list(args.seeds, int, "--seeds")
    definitions = _definitions(args)
    path, info, model = _warm_start(args)
    settings = _train_settings(args, path, info)
    specs = [make_spec(label, condition, seed) for label in labels for condition in conditions for seed in seeds]
    rows, frozen, cost = sweep(
        specs, settings, Path(args.runs), definitions, args.jobs, f"{experiment} runs", shared_normal
    )
    plots = plot_sweep(
        rows, frozen, labels, conditions, Path(args.results), experiment, title, definitions.reward_window
    )
    payload = {
        "title": title,
        **(extra or {}),
        "settings": _settings(args),
        "seeds": seeds,
        "noise": {**settings.noise.__dict__, "text": settings.noise.describe()},
        "definitions": {**definitions.to_dict(), "text": definitions.describe()},
        "warm_start": info,
        "model": model,
        "task": {"name": settings.task, "protocol": settings.protocol, "reward_profile": "d1"},
        "optimizer": {"learning_rate": settings.learning_rate, "max_grad_norm": settings.max_grad_norm},
        "budget": settings.budget.to_dict(),
        "budget_hash": settings.budget.hash(),
        "runs": rows,
        "frozen": frozen,
        "summary": aggregate(rows, labels, conditions),
        "plots": plots,
        "jobs": cost,
        **_runtime(start, args.jobs, info, cost["worker_cpu_seconds"]),
    }
    return write_record(args.results, experiment, payload)


def _names(text: str, known: Mapping[str, Any], option: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UserError(f"{option}: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}")
    return names


def cmd_exploding(args: argparse.Namespace) -> Path:
    methods = _names(args.methods, METHODS, "--methods")
    return _training_experiment(
        args,
        "exploding",
        "Exploding-weight stress test",
        methods,
        lambda m, condition, seed: RunSpec(m, METHODS[m][0], tuple(sorted(METHODS[m][1].items())), condition, seed),
        shared_normal=lambda spec: spec.condition == "exploding" and spec.baseline == "spg",
    )


def cmd_clip(args: argparse.Namespace) -> Path:
    thresholds = parse_list(args.thresholds, float, "--thresholds")
    if any(not c > 0 for c in thresholds):
        raise UserError("--thresholds must be positive")
    by_label = {f"C={c:g}": c for c in thresholds}
    return _training_experiment(
        args,
        "clip",
        "Clip-threshold ablation",
        list(by_label),
        lambda label, condition, seed: RunSpec(
            label, "stabledrl", (("clip_threshold", by_label[label]),), condition, seed
        ),
        shared_normal=lambda _: False,
        extra={"thresholds": thresholds},
    )


def cmd_drift(args: argparse.Namespace) -> Path:
    start = (time.perf_counter(), time.process_time())
    variants = _names(args.variants, drift_mod.VARIANTS, "--variants")
    conditions = conditions_arg(args.conditions)
    levels = sorted(parse_list(args.levels, float, "--levels"))
    if levels[0] < 0:
        raise UserError("--levels must be >= 0")
    seeds = parse_list(args.seeds, int, "--seeds")
    _check_positive(repeats=args.repeats, rollouts=args.rollouts, spike_k=args.spike_k)
    noise = _noise(args)
    path, info, model = _warm_start(args)
    budget = stress_budget(args, 2)  # one rollout phase: the rollout, then the off-policy inner step mu = 2
    settings = TrainSettings(warm_start=str(path), budget=budget, learning_rate=0.0, max_grad_norm=1.0, noise=noise)
    records_by_seed = {}
    for seed in seeds:
        control = control_config(settings.config("stabledrl", {}, seed), Path(args.runs) / "drift")
        dlm, rollouts = sample_rollouts(control, args.rollouts)
        records_by_seed[seed] = drift_mod.measure_update_norms(
            dlm,
            rollouts,
            variants,
            levels,
            args.repeats,
            conditions,
            noise,
            seed=seed,
            block_length=budget.block_length,
        )
    summary = drift_mod.summarize(records_by_seed, variants, levels, conditions, args.spike_k)
    plot = drift_mod.plot(summary, variants, conditions, Path(args.results), args.spike_k)
    payload = {
        "title": "Spike probability vs drift",
        "settings": _settings(args),
        "seeds": seeds,
        "levels": levels,
        "variants": {v: {"baseline": drift_mod.VARIANTS[v][0], "options": drift_mod.VARIANTS[v][1]} for v in variants},
        "noise": {**noise.__dict__, "text": noise.describe()},
        "definitions": {
            "spike_k": args.spike_k,
            "text": {
                "spike": f"update norm > {args.spike_k:g} x the variant's median norm at the smallest drift level "
                "(normal condition), per seed; non-finite norms count as spikes",
                "drift": "mean |E_theta - E_theta0| per completion (StableDRL's per-token ELBO, same masks)",
                "policy": "theta = theta0 + sigma * rms(W) * N(0, 1) per parameter tensor W",
            },
        },
        "warm_start": info,
        "model": model,
        "budget": budget.to_dict(),
        "budget_hash": budget.hash(),
        "records": records_by_seed,
        "summary": summary,
        "plots": {"spikes": plot},
        **_runtime(start, 1, info),
    }
    return write_record(args.results, "drift", payload)


def cmd_hull(args: argparse.Namespace) -> Path:
    start = (time.perf_counter(), time.process_time())
    scales = parse_list(args.scales, float, "--scales")
    _check_positive(trials=args.trials, clip_threshold=args.clip_threshold, **{f"scale {s:g}": s for s in scales})
    records = hull_mod.run_hull(args.trials, scales, args.seed, clip_threshold=args.clip_threshold)
    summary = hull_mod.summarize(records, scales)
    plot = hull_mod.plot(records, Path(args.results), args.clip_threshold)
    payload = {
        "title": "Convex-hull property",
        "settings": _settings(args),
        "seeds": [args.seed],
        "scales": scales,
        "tolerance": hull_mod.TOLERANCE,
        "summary": summary,
        "plots": {"hull": plot},
        **_runtime(start, 1, None),
    }
    return write_record(args.results, "hull", payload)


COMMANDS = {"exploding": cmd_exploding, "drift": cmd_drift, "clip": cmd_clip, "hull": cmd_hull}


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
    names = EXPERIMENTS if args.experiment == "all" else (args.experiment,)
    for name in names:
        sub_args = args
        if args.experiment == "all":
            extra = ["--results", args.results, "--runs", args.runs, "--no-leaderboard"]
            if name in ("exploding", "clip"):
                extra += ["--jobs", str(args.jobs)]
            if name != "hull" and args.warm_start:
                extra += ["--warm-start", args.warm_start]
            sub_args = build_parser().parse_args([name, *extra])
        start = time.perf_counter()
        path = COMMANDS[name](sub_args)
        print(f"stress {name}: {path} ({time.perf_counter() - start:.0f} s)")
    _refresh_leaderboard(args)
    return 0
