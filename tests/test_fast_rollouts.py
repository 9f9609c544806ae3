"""``benchmarks/fast_rollouts.py``: the exact-vs-fast rollout study, on hand-made records and logs (the study itself
trains two comparisons, which takes an hour on 2 cores; what is checked here is what it computes from them)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from test_results import BUDGET, store

ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("fast_rollouts", ROOT / "benchmarks" / "fast_rollouts.py")
study = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(study)

LENGTHS = (128, 256, 512)


def _log(rewards: list[float], kl: list[float], seconds: list[float]) -> list[dict]:
    """A run log: each rollout step (it has ``reward_std``) followed by one reuse step."""
    log = []
    for i, (reward, k, s) in enumerate(zip(rewards, kl, seconds, strict=True)):
        log.append(
            {"step": 2 * i + 1, "reward_mean": reward, "reward_std": 0.1, "kl": k, "ratio_max": 1.0, "seconds": s}
        )
        log.append(
            {"step": 2 * i + 2, "reward_mean": reward, "kl": k, "ratio_max": 1.0 + k, "clip_ratio": k, "seconds": s}
        )
    return log


def test_a_runs_log_statistics_by_hand() -> None:
    log = _log([0.1] * 5 + [0.2] * 10, [0.0] * 14 + [0.3], [2.0] * 10 + [1.0] * 5)
    stats = study.log_statistics(log)
    assert stats["final_reward"] == pytest.approx(0.2)  # the last 10 rollout steps
    assert stats["kl"] == pytest.approx(0.6 / 30) and stats["ratio_max"] == pytest.approx(1.3)
    assert stats["clip_ratio"] == pytest.approx(0.3 / 15)  # logged on the reuse steps only
    assert stats["seconds"] == 2.0 and "drift" not in stats
    assert stats["first_reward"] == pytest.approx(0.1) and stats["rewarded"] == 1.0
    never = study.log_statistics(_log([0.0] * 3, [0.0] * 3, [1.0] * 3))
    assert never["rewarded"] == 0.0 and never["final_reward"] == 0.0
    assert study._rewards(never) == "0.00 -> 0.00 (never)" and study._rewards(stats) == "0.10 -> 0.20"


def test_the_mean_curve_averages_the_runs_that_logged_a_step() -> None:
    curve = study.mean_curve([_log([0.2, 0.4], [0, 0], [1, 1]), _log([0.6], [0], [1])])
    assert curve == [{"step": 1, "reward_mean": pytest.approx(0.4)}, {"step": 3, "reward_mean": pytest.approx(0.4)}]


def test_only_finished_warm_starts_are_shared_and_none_is_overwritten(tmp_path: Path) -> None:
    for seed in (0, 1, 2):
        (tmp_path / "exact" / "sudoku" / f"s{seed}" / "sft").mkdir(parents=True)
    for seed in (0, 1):
        (tmp_path / "exact" / "sudoku" / f"s{seed}" / "sft" / "warm_start.json").write_text("{}")
    (tmp_path / "fast" / "sudoku" / "s1" / "sft").mkdir(parents=True)  # the fast comparison's own: kept
    copied = study.share_warm_starts(tmp_path, "exact", "fast", ["sudoku"], [0, 1, 2])
    assert copied == [tmp_path / "fast" / "sudoku" / "s0" / "sft"]
    assert (copied[0] / "warm_start.json").is_file()
    assert list((tmp_path / "fast" / "sudoku" / "s1" / "sft").iterdir()) == []
    assert not (tmp_path / "fast" / "sudoku" / "s2").exists()


def test_the_study_pairs_the_two_comparisons_by_seed_and_item(tmp_path: Path) -> None:
    """Four test items, two seeds: the start solves items 0-1, grpo with exact rollouts items 0-2 and with fast
    rollouts all four, on every seed and length: changes +25 (exact) and +50 (fast) points, fast - exact +25."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    solved = {"sft": [1, 1, 0, 0], "exact": [1, 1, 1, 0], "fast": [1, 1, 1, 1]}
    for preset, mode, budget in (("tiny", "exact", BUDGET), ("tiny-fast", "fast", BUDGET | {"rollout_decode": "fast"})):
        comparison = f"table1-{preset}"
        for seed in (0, 1):
            for length in LENGTHS:
                common = {"comparison": comparison, "preset": preset, "task": "sudoku", "length": length, "seed": seed}
                store(results, [bool(x) for x in solved["sft"]], baseline="sft", budget=budget, **common)
                store(results, [bool(x) for x in solved[mode]], baseline="grpo", budget=budget, **common)
            folder = runs / comparison / "sudoku" / f"s{seed}" / "grpo"
            folder.mkdir(parents=True)
            # seconds per step: seed 0 exact 4 / fast 1, seed 1 exact 2 / fast 2; the paired ratios are 4 and 1
            seconds = [(4.0, 2.0)[seed]] if mode == "exact" else [(1.0, 2.0)[seed]]
            reward = 0.5 if seed == 0 or mode == "exact" else 0.0  # fast rollouts on seed 1 never earn a reward
            folder.joinpath("log.jsonl").write_text("\n".join(json.dumps(r) for r in _log([reward], [0.01], seconds)))
    document = study.analyse(results, runs, "table1", "tiny", "tiny-fast", ["sudoku"], [0, 1], ["grpo", "spg"])
    (method,) = document["methods"]  # spg has no records: left out
    assert method["baseline"] == "grpo" and len(method["columns"]) == 4  # three lengths and their average
    for column in method["columns"]:
        assert column["exact change"]["estimate"] == pytest.approx(0.25)
        assert column["fast change"]["estimate"] == pytest.approx(0.5)
        assert column["fast - exact"]["estimate"] == pytest.approx(0.25) and column["fast - exact"]["runs"] == 2
    assert method["logs"]["exact"]["seconds"] == 3.0 and method["logs"]["fast"]["runs"] == 2
    assert (method["logs"]["exact"]["rewarded_runs"], method["logs"]["fast"]["rewarded_runs"]) == (2, 1)
    # the median of the paired ratios (4, 1), not the ratio of the medians (3 / 1.5 = 2)
    assert method["speedup"] == pytest.approx(2.5)
    text = study.report(document, None)
    assert "+25.0" in text and "| grpo | fast | 2 | 1 |" in text and "| 2.50 |" in text
    assert "| grpo | sudoku s0 | 0.50 -> 0.50 | 0.50 -> 0.50 | 4 | 1 | 4.00 |" in text
    assert "| grpo | sudoku s1 | 0.50 -> 0.50 | 0.00 -> 0.00 (never) | 2 | 2 | 1.00 |" in text
    with pytest.raises(study.UserError, match="no records"):
        study.analyse(results, runs, "table1", "tiny", "tiny-fast", ["countdown"], [0, 1], ["grpo"])
