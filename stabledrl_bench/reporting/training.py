"""Training rewards against the frozen control: each run's reward over its last rollouts minus the control's on the
same rollouts (same prompts, same random numbers, learning rate 0), stored per comparison and task as a CSV and
shown under the comparison's tables with a curve per run."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from stabledrl_bench.errors import UserError
from stabledrl_bench.migrations import upgraded_training_rewards
from stabledrl_bench.reporting.curves import plot_runs
from stabledrl_bench.reporting.markdown import markdown_table, task_label
from stabledrl_bench.reporting.naming import slugify
from stabledrl_bench.reporting.overruns import ABOVE, BELOW, CONTROL, Finding
from stabledrl_bench.reporting.runlevel import two_level_bootstrap
from stabledrl_bench.reporting.stats import bootstrap_mean_ci

TRAINING_DIR = "training"  # <results>/training/<comparison>__<task>.csv: per-rollout training rewards
CONTROL_RUN = "frozen"  # the run trained with learning rate 0 on the same rollouts
TRAINING_WINDOW = 10
TRAINING_COLUMNS = ("task", "seed", "run", "step", "reward_mean")


def training_path(results_dir: Path | str, comparison: str, task: str) -> Path:
    return Path(results_dir) / TRAINING_DIR / f"{slugify(comparison, 80)}__{slugify(task)}.csv"


def training_changes(rewards: pd.DataFrame, window: int = TRAINING_WINDOW) -> pd.DataFrame:
    """Each run's mean training reward over its last ``window`` rollouts, minus the frozen control's on the same
    rollouts (same seed and step = same prompts and random numbers), with a bootstrap 95% interval over those
    rollouts (pooled over seeds), the same over runs (``over_runs``: the seeds resampled, then the rollouts within
    each, :func:`~.runlevel.two_level_bootstrap`; what a verdict is read from) and each seed's own mean change
    (``per_seed``, by seed: a seed whose rows are missing for a run is then visible by its absence, not hidden in a
    shorter list).

    ``rewards`` has :data:`TRAINING_COLUMNS` for one task; the control is the run named :data:`CONTROL_RUN`.
    Why paired: a rollout's reward depends on the prompts drawn; the difference at equal steps removes that.
    """
    rows = []
    # Runs alphabetically, as the leaderboard's other tables: the file's order is the order runs happened to finish.
    for run, group in rewards[rewards["run"] != CONTROL_RUN].groupby("run", sort=True):
        differences, ours_all, frozen_all, per_seed = [], [], [], {}
        for seed, runs in group.groupby("seed", sort=True):
            control = rewards[(rewards["run"] == CONTROL_RUN) & (rewards["seed"] == seed)]
            frozen = control.set_index("step")["reward_mean"]
            ours = runs.set_index("step")["reward_mean"]
            steps = sorted(set(ours.index) & set(frozen.index))[-window:]
            if not steps:
                continue
            differences.append((ours[steps] - frozen[steps]).to_numpy())
            ours_all += ours[steps].tolist()
            frozen_all += frozen[steps].tolist()
            per_seed[int(seed)] = float(differences[-1].mean())
        if not differences:
            continue
        rows.append(
            {
                "run": run,
                "seeds": len(per_seed),
                "rollouts": sum(len(d) for d in differences),
                "reward": float(np.mean(ours_all)),
                "frozen": float(np.mean(frozen_all)),
                "change": bootstrap_mean_ci([np.concatenate(differences)]),
                "over_runs": two_level_bootstrap([[difference] for difference in differences]),
                "per_seed": per_seed,
            }
        )
    columns = ["run", "seeds", "rollouts", "reward", "frozen", "change", "over_runs", "per_seed"]
    return pd.DataFrame(rows, columns=columns)


def read_training(path: Path) -> pd.DataFrame:
    """A training-reward CSV (an old one, without seeds, is read as seed 0: see ``migrations``)."""
    try:
        rewards = upgraded_training_rewards(pd.read_csv(path))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable training-reward file: {exc}") from exc
    if list(rewards.columns) != list(TRAINING_COLUMNS) or rewards.empty:
        raise UserError(f"{path}: a training-reward file needs the columns {', '.join(TRAINING_COLUMNS)}")
    return rewards


def _plot_training(path: Path, rewards: pd.DataFrame, comparison: str) -> Path | None:
    """``<csv>.png``: every run's rollout reward against the optimizer step, the frozen control labelled as such."""

    mean = rewards.groupby(["run", "step"], sort=False, as_index=False)["reward_mean"].mean()  # over seeds
    runs = {
        f"{run} (learning rate 0)" if run == CONTROL_RUN else run: group.to_dict("records")
        for run, group in mean.groupby("run", sort=False)
    }
    task = rewards["task"].iloc[0]
    return plot_runs(
        runs,
        path.with_suffix(".png"),
        window=5,
        title=f"{comparison}: {task_label(task)}, training reward of each rollout"
        + (f" (mean of {rewards['seed'].nunique()} seeds)" if rewards["seed"].nunique() > 1 else ""),
        x_label="optimizer step (one point per rollout: a rollout every num_iterations optimizer steps)",
    )


def training_findings(results_dir: Path, comparison: str, shown: Callable[[str], bool]) -> list[Finding]:
    """Every run of ``comparison`` against the frozen control, per task that ``shown`` keeps, over runs."""
    found = []
    for _, rewards in _training_rewards(results_dir, comparison, shown):
        label = task_label(rewards["task"].iloc[0])
        for change in training_changes(rewards).itertuples():
            found.append(Finding(comparison, "training reward", change.run, CONTROL, label, change.over_runs))
    return found


def _training_rewards(
    results_dir: Path, comparison: str, shown: Callable[[str], bool]
) -> list[tuple[Path, pd.DataFrame]]:
    """The training rewards of ``comparison``'s tasks that ``shown`` keeps, with their files: one comparison's tasks
    can be shown in two leaderboard tables (Table 1 and the coding table), and each shows its own tasks' once."""
    files = sorted((results_dir / TRAINING_DIR).glob(f"{slugify(comparison, 80)}__*.csv"))
    found = [(path, read_training(path)) for path in files]
    return [(path, rewards) for path, rewards in found if shown(rewards["task"].iloc[0])]


def training_block(results_dir: Path, comparison: str, markdown_dir: Path | None, shown: Callable[[str], bool]) -> str:
    """The training-reward table of every task of ``comparison`` that ``shown`` keeps (and, given ``markdown_dir``,
    its curves)."""
    blocks = []
    for path, rewards in _training_rewards(results_dir, comparison, shown):
        changes = training_changes(rewards)
        if changes.empty:
            continue
        display = pd.DataFrame(
            {
                "Baseline": changes["run"],
                "Rollouts": changes["rollouts"],
                "Training reward": changes["reward"].map("{:.3f}".format),
                "Frozen start": changes["frozen"].map("{:.3f}".format),
                "Change": changes["change"].map(lambda c: c.text("+.3f", scale=1.0)),
                "Runs": changes["seeds"].map(str),
                "Change over runs": changes["over_runs"].map(lambda c: c.cell(ABOVE, BELOW, "+.3f", scale=1.0)),
            }
        )
        if changes["seeds"].max() > 1:
            display["Per seed (seed: change)"] = changes["per_seed"].map(
                lambda values: ", ".join(f"{seed}: {v:+.3f}" for seed, v in values.items())
            )
        task = rewards["task"].iloc[0]
        blocks.append(
            f"**Training reward, {task_label(task)}** (`{path.name}`): mean reward of each run's last "
            f"rollouts (sampled at the budget's temperature) against the frozen start, trained with learning rate 0 "
            f"on the same prompts with the same random numbers; change with a percentile-bootstrap 95% interval over "
            f"the rollouts (seeds pooled), and over runs: the seeds resampled, then the rollouts within each "
            f"(`above` / `below` the control where that interval excludes 0, else `not resolved`).\n\n"
            + markdown_table(display)
        )
        plot = _plot_training(path, rewards, comparison) if markdown_dir is not None else None
        if plot is not None and markdown_dir is not None:
            link = Path(os.path.relpath(plot.resolve(), markdown_dir.resolve())).as_posix()
            blocks[-1] += f"\n![training reward {task}]({link})\n"
    return "\n".join(blocks)
