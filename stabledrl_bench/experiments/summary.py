"""What ``reproduce`` keeps and prints of a task's training: every run's per-rollout reward next to the frozen
control's, stored as ``<results>/training/<comparison>__<task>.csv`` (:mod:`stabledrl_bench.reporting.training`
shows it in the leaderboard) and printed as each run's paired change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.experiments.comparison import Comparison, Replicate
from stabledrl_bench.processes import barrier, is_main_process
from stabledrl_bench.reporting.training import (
    CONTROL_RUN,
    TRAINING_COLUMNS,
    TRAINING_WINDOW,
    read_training,
    training_changes,
    training_path,
)
from stabledrl_bench.training.runlog import read_log


def training_summary(run: Comparison, task: str) -> None:
    """Store every run's per-rollout training reward with the frozen control's, print the paired change, plot.

    Why a control: the reward of a rollout depends on which prompts were drawn and on the sampling noise. The
    frozen run (learning rate 0) draws the same prompts with the same random numbers, so the per-rollout
    difference isolates what training changed (:func:`training_changes`). The evaluation-side signal (each RL
    row minus the start on the test set, paired by item) is in the leaderboard next to it.
    """
    logs = {
        (seed, name): Replicate(run, task, seed).runs / name / "log.jsonl"
        for seed in run.seeds
        for name in (*run.baselines, CONTROL_RUN)
    }
    rows = [
        (task, seed, name, r["step"], r["reward_mean"])
        for (seed, name), log in logs.items()
        if log.is_file()
        for r in _rollout_records(log)
    ]
    rewards = pd.DataFrame(rows, columns=list(TRAINING_COLUMNS))
    path = training_path(run.results, run.name, task)
    if path.is_file():
        # A run trained by an earlier invocation keeps its rollouts: another seed (`--seeds 2` after `--seeds 0,1`)
        # or another method of the same seed (`--baselines spg` after `--baselines grpo`); only the runs read
        # now replace theirs.
        earlier = read_training(path)
        fresh = pd.MultiIndex.from_frame(rewards[["seed", "run"]])
        kept = earlier[~pd.MultiIndex.from_frame(earlier[["seed", "run"]]).isin(fresh)]
        rewards = pd.concat([kept, rewards], ignore_index=True)
        rewards = rewards.sort_values("seed", kind="stable", ignore_index=True)
    if is_main_process():
        atomic_write_text(path, rewards.to_csv(index=False))
    barrier()
    pooled = ", ".join(map(str, sorted(rewards["seed"].unique())))
    print(f"  [{task}] training reward of the last {TRAINING_WINDOW} rollouts vs the frozen start on the same ones")
    print(f"  (rollouts of seeds {pooled} pooled):")
    for row in training_changes(rewards).itertuples():
        print(f"    {row.run:<12} {row.reward:.3f} vs {row.frozen:.3f}: {row.change.text('+.3f', scale=1.0)}")
    print(f"  [{task}] training rewards: {path} (the leaderboard plots them)")


def _rollout_records(log: Path) -> list[dict[str, Any]]:
    """One record per rollout phase: the phase's first optimizer step carries the reward of its rollout."""
    return [r for r in read_log(log) if r.get("phase_iteration") == 0 and r.get("reward_mean") is not None]
