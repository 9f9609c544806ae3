"""``verify --rerun RECORD``: make one result record again, from scratch, and say whether this code reproduces it.

``verify`` checks that a record adds up; this checks that the *current code* still produces it. The record names
everything needed: its comparison's table, preset, task, seed, method, protocol and length. The warm start and the
training run are rebuilt into a fresh folder (or ``--rerun-runs`` to reuse a cache: then only what is missing is
trained), the checkpoint is evaluated with the record's settings, and the weights hash, every completion and the
metrics are compared with the record. A record that does not reproduce is not necessarily wrong: it may come from an
older code version (its commit is printed beside this one), which is what the answer is for, or from another CPU
model or thread count: the same code rounds differently there (docs/regression.md), so the platform the record names
is printed beside this one and a difference in it is named in the verdict.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from stabledrl_bench.core.models.backends import load_model_spec
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.native import evaluate_and_record, model_record
from stabledrl_bench.evaluation.protocols import get_protocol
from stabledrl_bench.experiments.comparison import Comparison, Replicate, comparison
from stabledrl_bench.experiments.reproduce import _best_checkpoint, _train, _train_config, _warm_start
from stabledrl_bench.processes import intra_op_threads
from stabledrl_bench.reporting.provenance import cpu_numerics, git_state
from stabledrl_bench.reporting.results import load_samples, read_result

STARTS = ("base", "sft")  # records of the start checkpoint, not of a trained method


def rerun(record_path: Path, runs: Path | None = None) -> int:
    """Remake ``record_path`` and print how it compares; 0 when weights and completions are reproduced exactly."""
    record = read_result(record_path)
    recorded_samples = load_samples(record)
    commit = (record.get("environment", {}).get("git") or {}).get("commit") or "unknown"
    now = git_state()["commit"] or "unknown"
    print(f"rerun {record_path}: made at {commit[:10]}, rerun at {now[:10]}")
    with tempfile.TemporaryDirectory(prefix="rerun-") as tmp:
        work = Path(tmp)
        remade, threads = _remake(record, recorded_samples, runs or work / "runs", work / "results")
        samples = load_samples(remade)
    with intra_op_threads(threads):
        return _report(record, recorded_samples, remade, samples)


def _remake(
    record: dict[str, Any], samples: list[dict[str, Any]], runs: Path, results: Path
) -> tuple[dict[str, Any], int]:
    """The record made again (as ``reproduce`` makes it, at the thread count of its model's size), and that count."""
    baseline, task, seed = record["baseline"], record["task"], int(record["seed"])
    validation = record.get("validation")  # a run's best checkpoint: trained with the same validation, then chosen
    if record.get("preset") in (None, "custom"):
        raise UserError("--rerun: this record was made by `eval` outside a preset; re-run its eval command instead")
    run = comparison(
        record["table"],
        preset=record["preset"],
        baselines=None if baseline in STARTS else baseline,
        tasks=task,
        seeds=str(seed),
        runs=str(runs),
        results=str(results),
        leaderboard=str(results / "leaderboard.md"),
        eval_every=None if validation is None else validation["every"],
        train_starts=True,  # the start is remade too, not copied: the question is what this code produces
    )
    if baseline not in STARTS and record.get("budget") != run.preset.budget.to_dict():
        raise UserError(
            f"--rerun: the record was trained under budget {record.get('budget_hash')}, the preset "
            f"{record['preset']!r} now has {run.preset.budget.hash()}: it cannot be remade by this code"
        )
    with intra_op_threads(run.threads):
        return _remade(run, record, samples, results), run.threads


def _remade(run: Comparison, record: dict[str, Any], samples: list[dict[str, Any]], results: Path) -> dict[str, Any]:
    baseline, seed, validation = record["baseline"], int(record["seed"]), record.get("validation")
    replicate = Replicate(run, record["task"], seed)
    checkpoint = run.model
    if run.preset.sft is not None:
        checkpoint = str(_warm_start(replicate).value)
    if baseline not in STARTS:
        config = _train_config(replicate, baseline, checkpoint)
        checkpoint = str(_train(config, force=False).value)
        if validation is not None:
            checkpoint, validation = _best_checkpoint(Path(config.output_dir))
    dlm = load_model_spec(checkpoint, seed=seed)
    protocol = get_protocol(record["protocol"])
    repeats = max(1, protocol.repeats)
    recorded = evaluate_and_record(
        dlm,
        results_dir=results,
        key=replicate.result_key(baseline, protocol, int(record["length"]), model_record(dlm, checkpoint)).to_dict(),
        max_completion_length=int(record["max_completion_length"]),
        budget=record.get("budget"),
        advantage=record.get("advantage"),
        limit=len(samples) // repeats,
        batch_size=run.preset.eval_batch_size,
        skip_existing=False,
        selection="final" if validation is None else "best",
        validation=validation,
    )
    return read_result(recorded.path)  # with its _path, which load_samples needs


def _report(
    record: dict[str, Any], samples: list[dict[str, Any]], remade: dict[str, Any], remade_samples: list[dict[str, Any]]
) -> int:
    weights = (record["model"].get("weights_sha256"), remade["model"].get("weights_sha256"))
    differing = sum(a["completion"] != b["completion"] for a, b in zip(samples, remade_samples, strict=False)) + abs(
        len(samples) - len(remade_samples)
    )
    same_weights = weights[0] == weights[1]
    verdict = "identical" if same_weights else "DIFFERENT"
    platform_now = cpu_numerics()
    hardware = (record.get("environment") or {}).get("hardware") or {}  # before 2026-12-04: no CPU numerics
    recorded_platform = {key: hardware.get(key) for key in platform_now}
    print(f"  platform:    {_describe(recorded_platform)} recorded, {_describe(platform_now)} now")
    print(f"  weights:     {verdict} ({weights[0][:12]} recorded, {weights[1][:12]} now)")
    print(f"  completions: {len(samples) - differing} of {len(samples)} identical")
    for name in ("accuracy", "score_mean"):
        if name in record["metrics"]:
            print(f"  {name}: {record['metrics'][name]!r} recorded, {remade['metrics'].get(name)!r} now")
    if same_weights and not differing:
        print("verify --rerun: reproduced bit for bit")
        return 0
    what = "completions identical, weights differ" if not differing else "NOT reproduced"
    if any(recorded_platform.get(key) != value for key, value in platform_now.items()):
        what += (
            " (the record names another CPU or thread count, or none: bitwise equality is expected only on the"
            " platform that made it; docs/regression.md)"
        )
    print(f"verify --rerun: {what}")
    return 1


def _describe(numerics: dict[str, Any]) -> str:
    if numerics.get("threads") is None:
        return "platform not recorded"
    return f"{numerics.get('cpu') or '?'} ({numerics.get('capability')}, {numerics['threads']} threads)"
