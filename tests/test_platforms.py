"""The platform study: the analysis on hand-made records of two platforms (which verdicts hold, pooled runs, the
spread of a seed's change), and the command end to end on the smoke preset (an emulated platform's records say
which kernels made them, and the leaderboard never reads them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_results import store

from stabledrl_bench.cli import main
from stabledrl_bench.errors import UserError
from stabledrl_bench.experiments.comparison import comparison
from stabledrl_bench.experiments.platforms import analyse, folders, report, run_study
from stabledrl_bench.reporting.leaderboard import findings
from stabledrl_bench.reporting.provenance import code_label
from stabledrl_bench.reporting.results import load_results

ON, OFF = [1, 1, 1, 1], [0, 0, 0, 0]


def _study(tmp_path: Path):
    return comparison(
        "table1",
        preset="smoke",
        baselines="test_rl_a,test_rl_b",
        tasks="sudoku",
        seeds="0,1,2",
        runs=str(tmp_path / "runs"),
        results=str(tmp_path / "results"),
    )


def _platform(results: Path, rows: dict[str, dict[int, list[int]]]) -> None:
    for baseline, seeds in rows.items():
        for seed, correct in seeds.items():
            for length in (128, 256, 512):
                store(
                    results,
                    [bool(x) for x in correct],
                    comparison="table1-smoke",
                    preset="smoke",
                    task="sudoku",
                    length=length,
                    baseline=baseline,
                    seed=seed,
                    budget=None if baseline == "sft" else json.loads(json.dumps(_budget())),
                )


def _budget():
    from test_results import BUDGET

    return BUDGET


def test_a_verdict_holds_only_with_one_sign_on_every_platform(tmp_path: Path) -> None:
    """test_rl_a gains on every seed of both platforms (+100 and +50 points): above its start, and it holds.
    test_rl_b gains 100 points on every seed of this machine's kernels but loses 50 on every seed of the emulated
    AVX2 machine: resolved here, and it does not hold; pooled over the six runs (three at +100, three at -50) a
    resample of six draws at most one of the +100 runs with chance 7/64 > 2.5 %, which puts the interval's lower end
    below 0: not resolved."""
    run = _study(tmp_path)
    seeds = (0, 1, 2)
    native = {"sft": OFF, "test_rl_a": ON, "test_rl_b": ON}
    avx2 = {"sft": [1, 1, 0, 0], "test_rl_a": ON, "test_rl_b": OFF}
    _platform(folders(run, "native")[1], {name: dict.fromkeys(seeds, flags) for name, flags in native.items()})
    _platform(folders(run, "avx2")[1], {name: dict.fromkeys(seeds, flags) for name, flags in avx2.items()})
    document = analyse(run, ["native", "avx2"])
    rows = {tuple(row["comparison"]): row for row in document["findings"]}
    a = rows[("change from the start", "test_rl_a", "its start", "Sudoku avg")]
    assert (a["native"]["mean"], a["avx2"]["mean"], a["holds"]) == (1.0, 0.5, True)
    b = rows[("change from the start", "test_rl_b", "its start", "Sudoku avg")]
    assert b["native"]["verdict"] == "above" and b["avx2"]["verdict"] == "below" and not b["holds"]
    assert b["pooled"]["runs"] == 6 and b["pooled"]["low"] < 0 and b["pooled"]["verdict"] == "not resolved"
    pair = rows[("method against method", "test_rl_a", "test_rl_b", "Sudoku")]
    assert pair["native"]["verdict"] == "not resolved" and pair["avx2"]["verdict"] == "better"
    summary = document["summary"]
    assert summary["resolved on native"] == 8  # each method above its start in 3 lengths and their average
    assert summary["resolved on native that hold on every platform"] == 4  # test_rl_a's
    # the same seed moves by 50 (test_rl_a) or 150 points (test_rl_b) between platforms, and not at all between seeds
    spread = document["spread"]
    assert spread["platform range"]["max"] == 150.0 and spread["seed range"]["max"] == 0.0
    assert spread["seed changes whose sign a platform flips"] == [12, 24]
    text = report({**document, "command": "python -m stabledrl_bench platforms table1"})
    assert "| test_rl_b vs its start (Sudoku avg) |" in text and "| NO |" in text


def test_the_leaderboard_says_which_verdicts_kept_their_sign_in_a_committed_study(tmp_path: Path) -> None:
    """The study of the first test committed beside the records: the leaderboard's verdict list says test_rl_a's gain
    kept its sign under AVX2 and test_rl_b's did not; once the records are other runs than the study's, it says so
    instead of lending them the study's word."""
    from stabledrl_bench.reporting.leaderboard import build_leaderboard

    run = _study(tmp_path)
    native = {"sft": OFF, "test_rl_a": ON, "test_rl_b": ON}
    avx2 = {"sft": [1, 1, 0, 0], "test_rl_a": ON, "test_rl_b": OFF}
    _platform(run.results, {name: dict.fromkeys((0, 1, 2), flags) for name, flags in native.items()})
    _platform(folders(run, "avx2")[1], {name: dict.fromkeys((0, 1, 2), flags) for name, flags in avx2.items()})
    study = run.results / "platforms" / "table1-smoke__sudoku.json"
    study.write_text(json.dumps(analyse(run, ["native", "avx2"])))
    lines = build_leaderboard(run.results).splitlines()
    said = {line.split(":")[0]: line for line in lines if line.startswith("- test_rl_")}
    assert said["- test_rl_a is above its start in Sudoku avg"].endswith("over 3 runs; same sign under avx2")
    assert said["- test_rl_b is above its start in Sudoku avg"].endswith("over 3 runs; sign NOT kept under avx2")
    summary = next(line for line in lines if line.startswith("**Verdicts over runs"))
    assert f"A platform study (`{study.with_suffix('.md').as_posix()}`) ran 8 of the 8 listed again" in summary
    assert summary.endswith("4 kept their sign there.")
    _platform(run.results, {"test_rl_a": {0: [1, 1, 1, 0]}})  # seed 0 measured again, with another result
    lines = build_leaderboard(run.results).splitlines()
    assert any(line.endswith("over 3 runs; its platform study measured other runs") for line in lines)


def test_the_command_runs_every_platform_and_keeps_their_records_apart(tmp_path: Path, capsys, monkeypatch) -> None:
    # a variable that forces kernels, left set by the caller's shell, reaches no platform: each runs exactly its own
    # (the suite run under emulated AVX2 kernels found `blas-sse42` carrying it, and `native` too)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    results = tmp_path / "results"
    argv = ["platforms", "table1", "--preset", "smoke", "--baselines", "grpo", "--seeds", "0", "--limit", "4"]
    argv += ["--platforms", "native,blas-sse42", "--workers", "1", "--runs", str(tmp_path / "runs")]
    assert main([*argv, "--results", str(results), "--leaderboard", str(tmp_path / "lb.md")]) == 0
    out = capsys.readouterr().out
    assert "[platform 2/2] blas-sse42: MKL at SSE4.2" in out
    emulated = load_results(results / "platforms" / "blas-sse42")
    assert len(emulated) == 6
    assert {json.dumps(r["environment"]["hardware"]["emulated"]) for r in emulated} == {
        json.dumps({"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"})
    }
    # the platform trained its own warm start under its kernels (--train-starts), and the start says so
    start = tmp_path / "runs" / "platforms" / "blas-sse42" / "table1-smoke" / "sudoku" / "s0" / "sft"
    assert "emulated" in json.loads((start / "warm_start.json").read_text())["environment"]["hardware"]
    native = load_results(results)  # the comparison's own records only: the platforms' are not the board's
    assert len(native) == 6 and all("emulated" not in r["environment"]["hardware"] for r in native)
    assert findings(results)  # the board's comparisons over runs read the native records
    study = (results / "platforms" / "table1-smoke__sudoku.md").read_text()
    assert study.startswith("# Platform study: `table1-smoke`") and "`blas-sse42`: MKL at SSE4.2" in study
    assert "--platforms native,blas-sse42`" in study and "not run by this study" not in study
    document = json.loads((results / "platforms" / "table1-smoke__sudoku.json").read_text())
    assert document["seeds"] == [0] and document["platforms"]["native"]["rerun"]
    # native left out: its records are read as they are, not made again, and the report says by which commit
    again = [*argv[:-4], "--platforms", "blas-sse42", "--workers", "1", "--runs", str(tmp_path / "runs")]
    assert main([*again, "--results", str(results), "--leaderboard", str(tmp_path / "lb.md")]) == 0
    out = capsys.readouterr().out
    assert "[platform native] not run" in out and "[platform 1/1] blas-sse42" in out and "measured (" not in out
    assert load_results(results) == native
    document = json.loads((results / "platforms" / "table1-smoke__sudoku.json").read_text())
    assert list(document["platforms"]) == ["native", "blas-sse42"] and not document["platforms"]["native"]["rerun"]
    commit = code_label(native[0]["environment"])
    study = (results / "platforms" / "table1-smoke__sudoku.md").read_text()
    assert f"not run by this study: the comparison's records as they were, measured at commit(s) {commit}" in study


def test_a_study_without_native_needs_its_records_for_every_method_and_seed(tmp_path: Path) -> None:
    """native left out of --platforms is read from --results: a missing record stops the study before any platform
    runs (hours, on a real comparison), naming what is missing."""
    run = _study(tmp_path)
    _platform(run.results, {"sft": {0: ON, 1: ON, 2: ON}, "test_rl_a": {0: ON, 1: ON, 2: ON}, "test_rl_b": {0: ON}})
    with pytest.raises(UserError, match=r"no records of table1-smoke for sudoku seed 1 test_rl_b, sudoku seed 2 "):
        run_study(run, ["table1"], ["avx2"])
    assert not (tmp_path / "runs").exists()


def test_a_comparison_missing_on_a_platform_neither_holds_nor_fails(tmp_path: Path) -> None:
    """A comparison found on one platform only (here the training rewards, which only this machine's run recorded)
    is not said to hold: its ``holds`` is None, shown n/a, and a doc stating it is told it was not measured on every
    platform."""
    import pandas as pd

    from stabledrl_bench.experiments.platforms import stated_problems
    from stabledrl_bench.reporting.training import training_path

    run = _study(tmp_path)
    seeds = (0, 1, 2)
    flags = {
        "sft": dict.fromkeys(seeds, OFF),
        "test_rl_a": dict.fromkeys(seeds, ON),
        "test_rl_b": dict.fromkeys(seeds, ON),
    }
    for name in ("native", "avx2"):
        _platform(folders(run, name)[1], flags)
    rewards = [
        ("sudoku", seed, name, step, reward)
        for seed in seeds
        for name, reward in (("frozen", 0.25), ("test_rl_a", 0.5), ("test_rl_b", 0.5))
        for step in range(1, 11)
    ]
    path = training_path(run.results, run.name, "sudoku")
    path.parent.mkdir(parents=True)
    pd.DataFrame(rewards, columns=["task", "seed", "run", "step", "reward_mean"]).to_csv(path, index=False)
    document = analyse(run, ["native", "avx2"])
    rows = {tuple(row["comparison"]): row for row in document["findings"]}
    assert rows[("change from the start", "test_rl_a", "its start", "Sudoku avg")]["holds"] is True
    control = rows[("training reward", "test_rl_a", "the frozen control", "Sudoku")]
    assert control["native"]["verdict"] == "above" and control["avx2"] is None and control["holds"] is None
    assert control["pooled"] is None  # one platform's runs alone are no pool
    text = report({**document, "command": "python -m stabledrl_bench platforms table1"})
    assert "| test_rl_a vs the frozen control (Sudoku) | +0.250 [+0.250, +0.250] above | – | – | n/a |" in text
    assert text.count("| n/a |") == 2  # both methods' control comparisons
    stated = "- test_rl_a is above the frozen control in Sudoku: +0.250 [+0.250, +0.250] over 3 runs\n"
    assert stated_problems(stated, [document], "doc.md") == [
        "doc.md: test_rl_a is above the frozen control in Sudoku: +0.250 [+0.250, +0.250]: not measured on every "
        "platform of the study"
    ]


def test_a_stated_verdict_must_be_the_studys_and_hold() -> None:
    from stabledrl_bench.experiments.platforms import stated_problems

    def entry(mean: float, low: float, high: float, verdict: str) -> dict:
        return {"mean": mean, "low": low, "high": high, "runs": 5, "verdict": verdict}

    study = {
        "platforms": {"native": {}, "avx2": {}},
        "findings": [
            {
                "comparison": ["change from the start", "trado", "its start", "Sudoku 128"],
                "native": entry(0.417, 0.011, 0.895, "above"),
                "avx2": entry(0.3, 0.01, 0.6, "above"),
                "holds": True,
            },
            {
                "comparison": ["method against method", "espo", "spg", "Sudoku"],
                "native": entry(0.01, 0.002, 0.02, "better"),
                "avx2": entry(-0.01, -0.02, 0.0, "not resolved"),
                "holds": False,
            },
        ],
    }
    text = """
- trado is above its start in Sudoku 128: +41.7 [+1.1, +89.5] points over 5 runs
- espo is better than spg in Sudoku: +1.0 [+0.2, +2.0] points over 5 runs
- `trado` is below its start in Sudoku 128: +41.7 [+1.1, +89.5]
- grpo is above its start in Sudoku 512: +1.0 [+0.1, +2.0]
"""
    problems = stated_problems(text, [study], "doc.md")
    assert len(problems) == 3 and problems[0].startswith("doc.md: espo is better than spg")
    assert "does not hold on every platform" in problems[0]
    assert "the study has above +41.7 [+1.1, +89.5] on native" in problems[1]
    assert "not a comparison of the platform study" in problems[2]


def test_the_docs_state_only_verdicts_the_committed_study_backs() -> None:
    """Every verdict docs/tiny-preset.md states for a committed comparison is a committed platform study's (the
    same interval on this machine's kernels) and keeps its sign on every platform that study ran."""
    from stabledrl_bench.experiments.platforms import STATED, stated_problems

    root = Path(__file__).resolve().parents[1]
    studies = [json.loads(path.read_text()) for path in sorted((root / "results" / "platforms").glob("*.json"))]
    text = (root / "docs" / "tiny-preset.md").read_text()
    assert len(STATED.findall(text)) >= 3  # the docs do state verdicts: the check below is not vacuous
    assert stated_problems(text, studies, "docs/tiny-preset.md") == []
    assert studies and all(len(s["platforms"]) >= 2 and s["seeds"] == [0, 1, 2, 3, 4] for s in studies)
