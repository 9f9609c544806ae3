"""``verify`` on stability records (:mod:`stabledrl_bench.experiments.stress.recheck`): every summary field a verdict
is read from is recomputed from the record's own data and compared, so an edited summary, flag or rate is caught.

The committed records must re-derive exactly; copies of them, edited the way a relabelling would edit them, must
fail with a line naming the field.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stabledrl_bench.cli import main
from stabledrl_bench.experiments.stress.recheck import differences, recheck

COMMITTED = Path(__file__).resolve().parent.parent / "results" / "stability"


def test_differences_hand_cases() -> None:
    assert differences({"a": 1, "extra": "kept"}, {"a": 1.0 + 1e-12}, "x") == []  # stored may hold more keys
    assert differences([0.5, None], [0.5, None], "x") == []
    assert differences({"a": 1}, {"a": 2}, "x") == ["x.a: stored 1, recomputed 2"]
    assert differences({"a": True}, {"a": 1}, "x") == ["x.a: stored True, recomputed 1"]  # a flag is not a count
    assert differences({}, {"a": 1}, "x") == ["x.a: missing"]
    assert differences([1, 2], [1], "x") == ["x: stored [1, 2], recomputed [1]"]
    assert differences({"a": None}, {"a": 0.0}, "x") == ["x.a: stored None, recomputed 0.0"]
    assert differences(3, {"a": 1}, "x") == ["x: stored 3, recomputed a mapping"]


@pytest.mark.parametrize("path", sorted(COMMITTED.glob("*.json")), ids=lambda path: path.stem)
def test_every_committed_record_rederives(path: Path) -> None:
    """The leaderboard's verdicts are read from these summaries: each follows from the data stored beside it."""
    assert recheck(path) == ([], [])


def test_the_committed_records_are_all_there() -> None:
    names = {path.stem for path in COMMITTED.glob("*.json")}
    assert names == {"anchored", "attribution", "clip", "drift", "exploding", "hull", "longrun", "lrsweep"}


def _away(value: Any, absent: Path) -> None:
    """Point every ``run_dir`` in ``value`` into ``absent``: the copy is judged on its stored data alone, as on a
    machine without the run cache (where the folders exist, ``verify`` reads their logs instead)."""
    if isinstance(value, dict):
        if "run_dir" in value:
            value["run_dir"] = str(absent / Path(value["run_dir"]).name)
        for item in value.values():
            _away(item, absent)
    elif isinstance(value, list):
        for item in value:
            _away(item, absent)


def _edited(tmp_path: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of a committed record under ``tmp_path``/results/stability, edited."""
    folder = tmp_path / "results" / "stability"
    folder.mkdir(parents=True)
    path = shutil.copy(COMMITTED / f"{name}.json", folder)
    record = json.loads(Path(path).read_text())
    _away(record, tmp_path / "absent")
    edit(record)
    Path(path).write_text(json.dumps(record))
    return Path(path)


def _stabledrl(record: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in record["summary"] if s["label"] == "stabledrl")


def _set_collapsed(record: dict[str, Any]) -> None:
    _stabledrl(record)["collapsed"] = 3  # the claim's verdict reads this count


def _zero_a_run(record: dict[str, Any]) -> None:
    run = next(r for r in record["runs"] if r["label"] == "stabledrl")
    run["curves"]["reward_mean"] = [0.0] * len(run["curves"]["reward_mean"])  # data edited, analysis kept


def _rechoose(record: dict[str, Any]) -> None:
    record["chosen_lr"] = 1e-4


def _flip_flag(record: dict[str, Any]) -> None:
    entry = record["by_lr"]["0.0001"]["grpo"]
    entry["falls_below"] = not entry["falls_below"]


def _zero_a_sweep_run(record: dict[str, Any]) -> None:
    run = next(r for r in record["runs"] if r["label"] == "grpo" and r["learning_rate"] == 3e-5)
    run["curves"]["reward_mean"] = [0.0] * len(run["curves"]["reward_mean"])  # the interval's data, not the interval


def _drift_probability(record: dict[str, Any]) -> None:
    record["summary"][-1]["spike_probability"]["mean"] = (
        0.0 if record["summary"][-1]["spike_probability"]["mean"] else 1.0
    )


@pytest.mark.parametrize(
    ("name", "edit", "expected"),
    [
        ("longrun", _set_collapsed, ".collapsed: stored 3, recomputed 0"),
        ("longrun", _zero_a_run, ".zero_reward_steps: stored 0, recomputed 500"),
        ("lrsweep", _rechoose, "chosen_lr: stored 0.0001, recomputed 3e-05"),
        ("lrsweep", _flip_flag, "by_lr.0.0001.grpo.falls_below: stored"),
        ("lrsweep", _zero_a_sweep_run, "by_lr.3e-05.grpo.change: stored"),
        ("drift", _drift_probability, ".spike_probability.mean: stored"),
    ],
)
def test_an_edited_record_fails_with_the_field_named(tmp_path: Path, name: str, edit, expected: str) -> None:
    problems, _ = recheck(_edited(tmp_path, name, edit))
    assert any(expected in line for line in problems), problems


def test_verify_counts_and_fails_stability_records(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _edited(tmp_path, "longrun", lambda record: None)
    assert main(["verify", "--results", str(tmp_path / "results"), "--no-weights"]) == 0
    assert "all 0 result records and 1 stability records add up" in capsys.readouterr().out
    _edited(tmp_path / "second", "longrun", _set_collapsed)
    assert main(["verify", "--results", str(tmp_path / "second" / "results"), "--no-weights"]) == 2
    captured = capsys.readouterr()
    assert f"FAIL {tmp_path / 'second' / 'results' / 'stability' / 'longrun.json'}" in captured.out
    assert "1 of 0 result records and 1 stability records do not add up" in captured.err
    assert path.is_file()


def test_records_that_cannot_be_rederived_are_one_line(tmp_path: Path) -> None:
    path = _edited(tmp_path, "longrun", lambda record: record.pop("frozen"))
    assert recheck(path) == (["cannot recompute its summary from the stored data (KeyError: 'frozen')"], [])
    other = _edited(tmp_path / "other", "longrun", lambda record: record.update(experiment="not_installed"))
    assert recheck(other) == ([], ["no stress experiment 'not_installed' is registered here: not re-derived"])
    (tmp_path / "bad.json").write_text("{")
    problems, _ = recheck(tmp_path / "bad.json")
    assert len(problems) == 1 and "bad.json" in problems[0]


def test_stress_rederive_rewrites_what_the_analysis_derives_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """An edited summary is recomputed from the stored curves (the record then re-derives), the stored data and the
    record's own date stay, the rewrite is recorded; a record that already agrees is left byte for byte."""
    path = _edited(tmp_path, "longrun", _set_collapsed)
    _edited(tmp_path / "other", "drift", lambda record: None)
    shutil.copy(tmp_path / "other" / "results" / "stability" / "drift.json", path.parent)
    before = json.loads(path.read_text())
    drift = (path.parent / "drift.json").read_text()
    results = str(tmp_path / "results")
    assert main(["stress", "rederive", "--results", results, "--no-leaderboard"]) == 0
    out = capsys.readouterr().out
    assert f"{path}: " in out and "derived field(s) recomputed" in out
    assert f"{path.parent / 'drift.json'}: unchanged" in out and (path.parent / "drift.json").read_text() == drift
    after = json.loads(path.read_text())
    assert recheck(path) == ([], [])
    assert _stabledrl(after)["collapsed"] == 0
    assert after["runs"][0]["curves"] == before["runs"][0]["curves"] and after["created"] == before["created"]
    assert set(after["rederived"]) == {"created", "git"}
    written = path.read_text()
    assert main(["stress", "rederive", "--results", results, "--no-leaderboard"]) == 0
    assert f"{path}: unchanged" in capsys.readouterr().out and path.read_text() == written
    assert main(["stress", "rederive", "--results", str(tmp_path / "none"), "--no-leaderboard"]) == 2
    assert "no stability records in" in capsys.readouterr().err
    broken = _edited(tmp_path / "broken", "longrun", lambda record: record.pop("frozen"))
    kept = broken.read_text()
    assert main(["stress", "rederive", "--results", str(tmp_path / "broken" / "results"), "--no-leaderboard"]) == 2
    err = capsys.readouterr().err
    assert f"{broken}: cannot recompute its summary from the stored data (KeyError: 'frozen')" in err
    assert len(err.strip().splitlines()) == 1 and broken.read_text() == kept
