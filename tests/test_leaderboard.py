"""Leaderboard: layout, averages, bootstrap, budget refusal, measured/published separation, published numbers."""

from __future__ import annotations

import copy
import re
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from test_results import BUDGET, TINY, store

from stabledrl_bench.errors import UserError
from stabledrl_bench.reporting.leaderboard import ROW_COLUMNS, build_leaderboard, write_leaderboard
from stabledrl_bench.reporting.published import load_published
from stabledrl_bench.reporting.schema import budget_hash
from stabledrl_bench.reporting.stats import bootstrap_mean_ci
from stabledrl_bench.reporting.training import TRAINING_COLUMNS, training_changes, training_path

TABLE1_HEADERS = [
    f"{task} {sub}" for task in ("GSM8K", "MATH500", "Countdown", "Sudoku") for sub in ("128", "256", "512", "avg")
] + ["Overall avg"]
TABLE2_HEADERS = [f"{task} {mode}" for task in ("MATH500", "AIME 2024", "GSM8K") for mode in ("static", "dynamic")]
MEASURED_CELL = re.compile(r"^(–|\d+\.\d \[\d+\.\d, \d+\.\d\])$")
PUBLISHED_CELL = re.compile(r"^(–|\d+\.\d \([PCSD]\))$")
NO_PUBLISHED = {"schema": "stabledrl-bench/published/v1"}


def parse_tables(markdown: str) -> list[tuple[str, list[dict[str, str]]]]:
    """Every markdown table with the kind of block it sits in ('measured' or 'published'), rows as dicts."""
    found: list[tuple[str, list[list[str]]]] = []
    kind, previous = "", ""
    for line in markdown.splitlines():
        if line.startswith("**Measured"):
            kind = "measured"
        elif line.startswith("**Published"):
            kind = "published"
        elif line.startswith("**Change from the start over runs"):
            kind = "runs"
        elif line.startswith("**Change"):
            kind = "change"
        elif line.startswith("**Training"):
            kind = "training"
        elif line.startswith("**Method against method"):
            kind = "pairwise"
        elif line.startswith("**Aggregates"):
            kind = "aggregates"
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            if not previous.startswith("|"):
                found.append((kind, []))
            found[-1][1].append(cells)
        previous = line
    return [(kind, [dict(zip(rows[0], row, strict=True)) for row in rows[2:]]) for kind, rows in found]


def measured_tables(markdown: str) -> list[list[dict[str, str]]]:
    return [rows for kind, rows in parse_tables(markdown) if kind == "measured"]


def change_tables(markdown: str, kind: str = "change") -> list[list[dict[str, str]]]:
    return [rows for found, rows in parse_tables(markdown) if found == kind]


def store_cells(results_dir: Path, cells: dict[tuple[str, int], list[int]], **overrides: Any) -> None:
    for (task, length), correct in cells.items():
        store(results_dir, [bool(flag) for flag in correct], task=task, length=length, **overrides)


def test_layout_column_order_and_row_labels(tmp_path: Path) -> None:
    store(tmp_path, [True, False], baseline="test_rl_b")
    store(tmp_path, [True], baseline="sft", budget=None)
    store(tmp_path, [False], baseline="test_rl_a")
    store(tmp_path, [True, True], baseline="base", budget=None)
    markdown = build_leaderboard(tmp_path)
    assert markdown.startswith("# stabledrl-bench leaderboard")
    assert "python -m stabledrl_bench leaderboard" in markdown
    assert markdown.index("## Table 1") < markdown.index("## Table 2") < markdown.index("## Coding")
    tables = parse_tables(markdown)
    assert [kind for kind, _ in tables] == [
        "measured",
        "change",
        "runs",
        "pairwise",
        "aggregates",
        "published",
        "published",
        "published",
    ]  # one seed: every comparison over runs is shown, and none is resolved
    (_, rows), (_, change_rows), (_, run_rows), *_, (_, published_rows), rest, _ = tables
    assert [row["GSM8K 128"].endswith("not resolved") for row in run_rows] == [True, True]
    assert "**Verdicts over runs, comparison `cmp`**: 0 of the 4 comparisons above are resolved" in markdown
    assert [row["Baseline"] for row in change_rows] == ["test_rl_a", "test_rl_b"]  # each against sft
    assert list(rows[0]) == [*ROW_COLUMNS, *TABLE1_HEADERS]
    assert [row["Baseline"] for row in rows] == ["base", "sft", "test_rl_a", "test_rl_b"]
    assert rows[0]["Model"] == "tiny-dlm" and rows[0]["Preset"] == "tiny" and rows[0]["Hardware"] == "CPU ×2"
    assert rows[0]["Budget"] == "–" and rows[2]["Budget"] == f"`{budget_hash(BUDGET)}`"
    assert [row["Checkpoint"] for row in rows] == ["start", "start", "final", "final"]  # records without selection
    assert list(published_rows[0]) == ["Model", "Checkpoint", *TABLE1_HEADERS, "Source"]
    assert [(row["Model"], row["Checkpoint"]) for row in published_rows][:2] == [
        ("LLaDA-8B-Instruct (SPG's evaluation)", "start (no RL)"),
        ("d1 / diffu-GRPO, no SFT (reproduced by SPG)", "best checkpoint, best mean over the lengths"),
    ]
    # Table 2 has no measured rows here: only its published block.
    assert list(rest[1][0]) == ["Model", "Checkpoint", *TABLE2_HEADERS, "Source"]


BEST = {"every": 2, "tasks": ["gsm8k"], "lengths": [32], "items": 8, "protocol": "d1", "step": 4, "score": 0.5}


def test_a_runs_best_checkpoint_is_a_row_of_its_own_that_says_so(tmp_path: Path) -> None:
    """A run's final and best checkpoints (two folders, two records) are two rows, final first, each naming its
    statistic; seeds of the best row list their chosen steps. A record's selection is checked."""
    run = "runs/cmp/gsm8k/s{seed}/test_rl_a/{name}"
    for seed in (0, 1):
        store(tmp_path, [True, False], seed=seed, model={**TINY, "checkpoint": run.format(seed=seed, name="final")})
        best = {**TINY, "checkpoint": run.format(seed=seed, name="best")}
        store(
            tmp_path, [True, True], seed=seed, model=best, selection="best", validation={**BEST, "step": 4 + 2 * seed}
        )
    store(tmp_path, [False], baseline="sft", budget=None)
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    rows = measured_tables(markdown)[0]
    assert [(row["Baseline"], row["Checkpoint"]) for row in rows] == [
        ("sft", "start"),
        ("test_rl_a", "final"),
        ("test_rl_a", "best on validation (steps 4, 6)"),
    ]
    assert rows[1]["GSM8K 128"].startswith("50.0 [") and rows[2]["GSM8K 128"].startswith("100.0 [")
    change = next(rows for kind, rows in parse_tables(markdown) if kind == "change")
    assert [row["Checkpoint"] for row in change] == ["final", "best on validation (steps 4, 6)"]
    bad = [
        ({"selection": "best"}, "'validation' needs exactly"),
        ({"selection": "final", "validation": BEST}, "'validation' belongs to a 'best' selection only"),
        ({"selection": "best", "validation": {**BEST, "step": 0}}, "'validation.step' must be a positive integer"),
        ({"selection": "latest"}, "'selection' must be one of final, best"),
        ({"selection": "best", "validation": BEST, "baseline": "sft", "budget": None}, "base/sft rows are a starting"),
    ]
    for fields, message in bad:
        with pytest.raises(UserError, match=re.escape(message)):
            store(tmp_path / "bad", [True], **fields)


def test_published_rows_say_which_checkpoint_they_report() -> None:
    published = load_published()
    statistic = {row["label"]: row["statistic"] for table in ("table1", "table2") for row in published[table]["rows"]}
    assert statistic["SPG w/ Mixture"] == "best-average"  # SPG: one checkpoint per model, best mean over lengths
    assert statistic["d1 / diffu-GRPO, no SFT (reported by d1)"] == "best-per-length"  # d1: best per length
    assert statistic["StableDRL, full-parameter"] == "unstated" and statistic["SDAR-8B-Chat"] == "start"
    broken = copy.deepcopy(published)
    broken["table1"]["rows"][0]["statistic"] = "best"
    with pytest.raises(UserError, match="statistic must be one of start, best-average, best-per-length, unstated"):
        load_published(broken)


def test_average_columns_from_hand_made_results(tmp_path: Path) -> None:
    # GSM8K only: 2/4, 3/4, 1/8 -> average (0.5 + 0.75 + 0.125) / 3 = 45.83 %
    store_cells(tmp_path, {("gsm8k", 128): [1, 1, 0, 0], ("gsm8k", 256): [1, 1, 1, 0], ("gsm8k", 512): [1] + [0] * 7})
    (row,) = measured_tables(build_leaderboard(tmp_path, NO_PUBLISHED))[0]
    assert row["GSM8K 128"].startswith("50.0 [")
    assert row["GSM8K 512"].startswith("12.5 [")
    assert row["GSM8K avg"].startswith("45.8 [")
    assert row["MATH500 avg"] == "–" and row["Overall avg"] == "–"  # missing tasks: no overall average


def test_overall_average_is_mean_of_twelve_cells(tmp_path: Path) -> None:
    hits = {"gsm8k": (1, 2, 3), "math500": (0, 1, 1), "countdown": (4, 4, 3), "sudoku": (1, 0, 0)}  # out of 4
    cells = {
        (task, length): [1] * k + [0] * (4 - k)
        for task, ks in hits.items()
        for length, k in zip((128, 256, 512), ks, strict=True)
    }
    store_cells(tmp_path, cells)
    (row,) = measured_tables(build_leaderboard(tmp_path, NO_PUBLISHED))[0]
    assert [row[f"{t} avg"].split(" ")[0] for t in ("GSM8K", "MATH500", "Countdown", "Sudoku")] == [
        "50.0",  # 6/12
        "16.7",  # 2/12
        "91.7",  # 11/12
        "8.3",  # 1/12
    ]
    assert row["Overall avg"].startswith("41.7 [")  # 20/48


def test_generated_test_sets_are_extra_columns_outside_the_overall_average(tmp_path: Path) -> None:
    """Sudoku 12-blank and Countdown 1024 are not in the paper: their columns appear only when measured, and the
    overall average stays the mean of the paper's twelve cells."""
    every = {
        (task, length): [1, 1, 0, 0]
        for task in ("gsm8k", "math500", "countdown", "sudoku")
        for length in (128, 256, 512)
    }
    store_cells(tmp_path, every)  # 50% everywhere
    (row,) = measured_tables(build_leaderboard(tmp_path, NO_PUBLISHED))[0]
    assert list(row) == [*ROW_COLUMNS, *TABLE1_HEADERS] and row["Overall avg"].startswith("50.0 [")
    store_cells(tmp_path, {("sudoku_hard", length): [1, 1, 1, 1] for length in (128, 256, 512)})
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    (row,) = measured_tables(markdown)[0]
    hard = [f"Sudoku 12-blank {sub}" for sub in ("128", "256", "512", "avg")]
    assert list(row) == [*ROW_COLUMNS, *TABLE1_HEADERS[:-1], *hard, "Overall avg"]
    assert row["Sudoku 12-blank avg"].startswith("100.0 [") and row["Overall avg"].startswith("50.0 [")
    assert "Sudoku 12-blank is not a column of the paper" in markdown and "Countdown 1024" not in markdown
    store_cells(tmp_path, {("countdown_large", length): [0, 0, 0, 0] for length in (128, 256, 512)})
    (row,) = measured_tables(build_leaderboard(tmp_path, NO_PUBLISHED))[0]
    large = [f"Countdown 1024 {sub}" for sub in ("128", "256", "512", "avg")]
    assert list(row) == [*ROW_COLUMNS, *TABLE1_HEADERS[:-1], *large, *hard, "Overall avg"]
    assert row["Countdown 1024 avg"].startswith("0.0 [") and row["Overall avg"].startswith("50.0 [")


def test_bootstrap_deterministic_contains_mean_and_narrows() -> None:
    small = np.array([1.0] * 6 + [0.0] * 4)
    large = np.tile(small, 40)
    first, again = bootstrap_mean_ci([small]), bootstrap_mean_ci([small])
    assert first == again
    assert first.mean == pytest.approx(0.6)
    assert first.low < first.mean < first.high
    wide, narrow = first.high - first.low, bootstrap_mean_ci([large]).high - bootstrap_mean_ci([large]).low
    assert narrow < wide / 3  # 40x the samples: ~sqrt(40) = 6.3x narrower
    # Width against the normal approximation 2 * 1.96 * sqrt(p (1 - p) / n) = 0.0960 for p = 0.6, n = 400.
    assert narrow == pytest.approx(2 * 1.96 * np.sqrt(0.24 / 400), rel=0.15)
    # Average of groups: each resampled on its own; mean of means 0.5, sd sqrt(sum p(1-p)/n) / 3.
    groups = [np.tile([1.0, 0.0], 100), np.tile([1.0, 1.0, 1.0, 0.0], 50), np.tile([1.0, 0.0, 0.0, 0.0], 50)]
    averaged = bootstrap_mean_ci(groups)
    assert averaged.mean == pytest.approx((0.5 + 0.75 + 0.25) / 3)
    expected_sd = np.sqrt(0.25 / 200 + 0.1875 / 200 + 0.1875 / 200) / 3
    assert averaged.high - averaged.low == pytest.approx(2 * 1.96 * expected_sd, rel=0.15)
    assert bootstrap_mean_ci([np.ones(5)]) == bootstrap_mean_ci([np.ones(5)], seed=1)  # degenerate: [1, 1]
    with pytest.raises(ValueError):
        bootstrap_mean_ci([np.array([])])


def test_seeds_are_pooled_and_listed(tmp_path: Path) -> None:
    store(tmp_path, [True, True, True, True], seed=1)
    store(tmp_path, [False, False], seed=7)
    (row,) = measured_tables(build_leaderboard(tmp_path, NO_PUBLISHED))[0]
    assert row["Seeds"] == "1, 7"
    pooled = bootstrap_mean_ci([np.array([1.0, 1, 1, 1, 0, 0])])
    assert row["GSM8K 128"] == f"66.7 [{100 * pooled.low:.1f}, {100 * pooled.high:.1f}]"


def test_change_from_the_start_is_paired_by_item(tmp_path: Path) -> None:
    # Per item: sft 1 1 0 0 1 0 0 0, RL 1 1 1 0 1 0 1 0 -> differences 0 0 1 0 0 0 1 0: +25 points, never below 0.
    store(tmp_path, [True, True, False, False, True, False, False, False], baseline="sft", budget=None)
    store(tmp_path, [True, True, True, False, True, False, True, False], baseline="test_rl_a")
    (row,) = change_tables(build_leaderboard(tmp_path, NO_PUBLISHED))[0]
    expected = bootstrap_mean_ci([np.array([0.0, 0, 1, 0, 0, 0, 1, 0])])
    assert expected.low >= 0.0
    assert row["GSM8K 128"] == f"+25.0 [{100 * expected.low:+.1f}, {100 * expected.high:+.1f}]"
    assert row["GSM8K avg"] == "–" and row["Overall avg"] == "–"  # 256/512 not measured


def test_change_pairs_shared_items_and_averages_seeds_per_item(tmp_path: Path) -> None:
    # Items 4 and 5 exist only in the RL row: they raise its accuracy (25% -> 50%) but pair with nothing.
    store(tmp_path, [True, False, False, False], baseline="sft", budget=None)
    store(tmp_path, [True, False, False, False, True, True], baseline="test_rl_a")
    # Two seeds: item means (1 + 0) / 2 = 0.5 and (1 + 1) / 2 = 1 against base 0 and 1 -> differences 0.5, 0.
    store(tmp_path, [False, True], baseline="base", budget=None, comparison="seeds")
    store(tmp_path, [True, True], baseline="test_rl_b", comparison="seeds", seed=1)
    store(tmp_path, [False, True], baseline="test_rl_b", comparison="seeds", seed=2)
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    (shared,), (seeds,) = change_tables(markdown)
    assert measured_tables(markdown)[0][1]["GSM8K 128"].startswith("50.0 [")
    assert shared["GSM8K 128"] == "+0.0 [+0.0, +0.0]"
    assert seeds["Baseline"] == "test_rl_b" and seeds["GSM8K 128"].startswith("+25.0 [+0.0, ")
    # over runs: one seed in "cmp"; in "seeds" the start (seed 0) shares no seed with seeds 1 and 2: no run, no table
    ((one,),) = change_tables(markdown, "runs")
    assert (one["Runs"], one["GSM8K 128"]) == ("1", "+0.0 [+0.0, +0.0] not resolved")


def test_change_average_column_and_reference_choice(tmp_path: Path) -> None:
    # sft: 0 0 at every length; RL: 1 0 at 128, 1 1 at 256, 0 0 at 512 -> +50, +100, +0, average +50.
    for length, rl in ((128, [1, 0]), (256, [1, 1]), (512, [0, 0])):
        store(tmp_path, [False, False], baseline="sft", budget=None, length=length)
        store(tmp_path, [True, True], baseline="base", budget=None, length=length)  # ignored: sft is the start
        store(tmp_path, [bool(flag) for flag in rl], length=length)
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    assert "(`sft`, " in markdown
    (row,) = change_tables(markdown)[0]
    assert [row[f"GSM8K {sub}"].split(" ")[0] for sub in ("128", "256", "512", "avg")] == [
        "+50.0",
        "+100.0",
        "+0.0",
        "+50.0",
    ]


def test_no_change_block_without_a_starting_point(tmp_path: Path) -> None:
    store(tmp_path, [True, False], baseline="test_rl_a")
    store(tmp_path, [True], baseline="test_rl_b")
    assert change_tables(build_leaderboard(tmp_path, NO_PUBLISHED)) == []


def test_mixed_budgets_are_refused(tmp_path: Path) -> None:
    first = store(tmp_path, [True], baseline="test_rl_a")
    second = store(tmp_path, [False], baseline="test_rl_b", budget={**BUDGET, "max_steps": 20})
    with pytest.raises(UserError, match="mixes RL training budgets") as info:
        build_leaderboard(tmp_path, NO_PUBLISHED)
    assert str(first) in str(info.value) and str(second) in str(info.value)


def test_reference_rows_are_exempt_from_the_budget_rule(tmp_path: Path) -> None:
    store(tmp_path, [True], baseline="test_rl_a")
    store(tmp_path, [True], baseline="base", budget=None)
    store(tmp_path, [True], baseline="sft", budget={**BUDGET, "max_steps": 5})
    store(tmp_path, [True], baseline="test_rl_b", budget=BUDGET, comparison="other", seed=1)  # other comparison
    tables = measured_tables(build_leaderboard(tmp_path, NO_PUBLISHED))
    assert [[row["Baseline"] for row in rows] for rows in tables] == [["base", "sft", "test_rl_a"], ["test_rl_b"]]


def test_measured_and_published_cells_never_mix_markers(tmp_path: Path) -> None:
    store_cells(tmp_path, {("gsm8k", 128): [1, 0], ("sudoku", 512): [1]})
    store(tmp_path, [True], table="table2", task="aime24", sampling="dynamic", length=2000, max_completion_length=64)
    markdown = build_leaderboard(tmp_path)
    kinds = {"measured": MEASURED_CELL, "published": PUBLISHED_CELL}
    seen = set()
    for kind, rows in parse_tables(markdown):
        for row in rows:
            for header, cell in row.items():
                if header in TABLE1_HEADERS or header in TABLE2_HEADERS:
                    assert kinds[kind].match(cell), (kind, header, cell)
                    seen.add((kind, cell != "–"))
    assert seen == {("measured", True), ("measured", False), ("published", True), ("published", False)}


def test_packaged_published_numbers_have_grades_and_no_grade_u() -> None:
    raw = yaml.safe_load(resources.files("stabledrl_bench.reporting").joinpath("published.yaml").read_text("utf-8"))

    def cells(node: Any) -> list[dict[str, Any]]:
        if isinstance(node, dict):
            own = [node] if "grade" in node else []
            return own + [cell for value in node.values() for cell in cells(value)]
        return [cell for value in node for cell in cells(value)] if isinstance(node, list) else []

    graded = cells(raw)
    assert len(graded) > 150
    assert {cell["grade"] for cell in graded} == {"P", "S", "D"}
    assert all(cell["source"] and isinstance(cell["value"], float) for cell in graded)
    assert load_published() == raw
    broken = copy.deepcopy(raw)
    broken["table2"]["rows"][0]["cells"]["math500"]["static"]["grade"] = "U"
    with pytest.raises(UserError, match="grade-U"):
        load_published(broken)


def test_published_averages_agree_with_their_cells() -> None:
    """Averages (D, or P from SPG Table 10) equal the mean of the lengths; overall = mean of cells (D)."""
    for row in load_published()["table1"]["rows"]:
        groups = {task: cells for task, cells in row["cells"].items() if task != "overall"}
        for cells in groups.values():
            lengths = [cells[length]["value"] for length in (128, 256, 512) if length in cells]
            if "avg" in cells and len(lengths) == 3:
                assert cells["avg"]["value"] == pytest.approx(sum(lengths) / 3, abs=0.05 + 1e-9), row["label"]
        if "overall" in row["cells"]:
            assert row["cells"]["overall"]["grade"] == "D"
            per_length = [c[n]["value"] for c in groups.values() for n in (128, 256, 512) if n in c]
            averages = [c["avg"]["value"] for c in groups.values()]
            expected = sum(per_length) / 12 if len(per_length) == 12 else sum(averages) / 4
            assert row["cells"]["overall"]["value"] == pytest.approx(expected, abs=0.05 + 1e-9), row["label"]


def test_published_spot_values() -> None:
    published = load_published()

    def cell(table: str, label: str, *path: Any) -> tuple[float, str]:
        (row,) = [row for row in published[table]["rows"] if row["label"] == label]
        node = row["cells"]
        for key in path:
            node = node[key]
        return node["value"], node["grade"]

    assert cell("table1", "SPG w/ Mixture", "sudoku", 256) == (94.0, "P")
    assert cell("table1", "StableDRL, full-parameter", "gsm8k", "avg") == (84.2, "S")
    assert cell("table1", "ESPO", "math500", "avg") == (39.5, "S")
    assert cell("table2", "TraDo-8B-Instruct (TraceRL)", "aime24", "static") == (13.3, "P")
    assert cell("table2", "StableDRL, SDAR-8B + staircase attention", "aime24", "dynamic") == (13.3, "S")


def test_tiny_caption_states_scaled_lengths(tmp_path: Path) -> None:
    store_cells(tmp_path, {("gsm8k", 128): [1]}, max_completion_length=32)
    store_cells(tmp_path, {("gsm8k", 256): [1]}, max_completion_length=64)
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    assert "actual generated tokens: 128 → 32, 256 → 64." in markdown
    store_cells(tmp_path, {("math500", 128): [1]}, max_completion_length=40)  # same nominal length, other actual
    with pytest.raises(UserError, match="different canvases"):
        build_leaderboard(tmp_path, NO_PUBLISHED)


def test_table2_shows_aime25_only_when_measured(tmp_path: Path) -> None:
    common = {"table": "table2", "length": 2000, "max_completion_length": 2000}
    store(tmp_path, [True, False], task="aime25", sampling="static", **common)
    store(tmp_path, [True], task="math500", sampling="dynamic", **common)
    markdown = build_leaderboard(tmp_path)
    table2 = parse_tables(markdown[markdown.index("## Table 2") : markdown.index("## Coding")])
    (measured_kind, (row,)), (published_kind, published_rows) = table2
    assert (measured_kind, published_kind) == ("measured", "published")
    assert list(row)[len(ROW_COLUMNS) :] == [*TABLE2_HEADERS, "AIME 2025 static", "AIME 2025 dynamic"]
    assert row["AIME 2025 static"].startswith("50.0 [") and row["MATH500 dynamic"].startswith("100.0 [")
    assert "AIME 2025 static" not in published_rows[0]
    assert "Lengths are scaled" not in markdown  # nothing scaled here


def test_a_methods_per_task_and_per_seed_checkpoints_share_one_row(tmp_path: Path) -> None:
    from test_results import TINY

    for task, seed in (("gsm8k", 0), ("gsm8k", 1), ("sudoku", 0)):
        for baseline in ("sft", "test_rl_a"):
            runs = "/scratch/node7/runs2" if seed == 1 else "runs"  # where a seed's runs were kept: same row
            path = f"{runs}/cmp/{task}/s{seed}/{baseline}/final"
            model = {**TINY, "name": path, "checkpoint": path}
            flags = {"baseline": baseline, "task": task, "seed": seed, "model": model}
            store(tmp_path, [baseline != "sft", False], **flags, **({"budget": None} if baseline == "sft" else {}))
    start, rl = measured_tables(build_leaderboard(tmp_path, NO_PUBLISHED))[0]
    assert start["Model"].startswith("*/cmp/*/*/sft/final") and start["Sudoku 128"].startswith("0.0 [")
    assert rl["Model"].startswith("*/cmp/*/*/test_rl_a/final") and rl["Seeds"] == "0, 1"
    assert rl["GSM8K 128"].startswith("50.0 [") and rl["Sudoku 128"].startswith("50.0 [")
    ((change,),) = change_tables(build_leaderboard(tmp_path, NO_PUBLISHED))[:1]
    assert change["GSM8K 128"].startswith("+50.0 [") and change["Sudoku 128"].startswith("+50.0 [")


def test_table2_static_and_dynamic_share_a_row_and_each_pairs_with_its_own_start(tmp_path: Path) -> None:
    common = {"table": "table2", "task": "math500", "length": 2000, "max_completion_length": 48}
    # start: static 0 0 0 0, dynamic 1 1 1 1; RL: static 1 1 0 0 (+50), dynamic 1 1 1 0 (-25)
    for sampling, start, rl in (("static", [0, 0, 0, 0], [1, 1, 0, 0]), ("dynamic", [1, 1, 1, 1], [1, 1, 1, 0])):
        flags = {"sampling": sampling, "protocol": f"tiny-{sampling}", **common}
        store(tmp_path, [bool(x) for x in start], baseline="sft", budget=None, **flags)
        store(tmp_path, [bool(x) for x in rl], **flags)
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    start, rl = measured_tables(markdown)[0]
    assert start["Protocol"] == rl["Protocol"] == "tiny-dynamic, tiny-static"
    assert rl["MATH500 static"].startswith("50.0 [") and rl["MATH500 dynamic"].startswith("75.0 [")
    ((change,),) = change_tables(markdown)
    assert change["MATH500 static"].startswith("+50.0 [") and change["MATH500 dynamic"].startswith("-25.0 [")


def test_each_protocol_is_compared_with_the_start_under_that_protocol(tmp_path: Path) -> None:
    for protocol, start, rl in (("d1", [False, False], [True, True]), ("tiny", [True, True], [True, False])):
        store(tmp_path, start, baseline="sft", budget=None, protocol=protocol)
        store(tmp_path, rl, protocol=protocol)
    (d1, tiny), *_ = change_tables(build_leaderboard(tmp_path, NO_PUBLISHED))
    assert (d1["Protocol"], d1["GSM8K 128"].split(" ")[0]) == ("d1", "+100.0")
    assert (tiny["Protocol"], tiny["GSM8K 128"].split(" ")[0]) == ("tiny", "-50.0")


def test_empty_results_directory_shows_published_blocks_only(tmp_path: Path) -> None:
    markdown = build_leaderboard(tmp_path)
    assert markdown.count("**Measured by this code**: no results for this table yet.") == 3
    assert [kind for kind, _ in parse_tables(markdown)] == ["published", "published", "published"]


def test_duplicate_evaluation_is_refused(tmp_path: Path) -> None:
    path = store(tmp_path, [True])
    copy_dir = tmp_path / "copy" / path.parent.name  # a second copy of the comparison folder, deeper down
    copy_dir.mkdir(parents=True)
    for file in path.parent.iterdir():
        shutil.copy(file, copy_dir / file.name)
    with pytest.raises(UserError, match="stored twice"):
        build_leaderboard(tmp_path, NO_PUBLISHED)


def test_corrupt_file_stops_the_leaderboard(tmp_path: Path) -> None:
    path = store(tmp_path, [True])
    path.write_text("{")
    with pytest.raises(UserError, match=re.escape(str(path))):
        build_leaderboard(tmp_path, NO_PUBLISHED)


def test_extra_sections_are_appended(tmp_path: Path) -> None:
    store(tmp_path, [True])
    calls = []

    def stability(results_dir: Path) -> str:
        calls.append(results_dir)
        return "## Stability\n\nstress tests here\n"

    markdown = build_leaderboard(tmp_path, NO_PUBLISHED, extra_sections=[stability, lambda _: None])
    assert calls == [tmp_path]
    assert markdown.rstrip().endswith("## Stability\n\nstress tests here")


def test_write_leaderboard_with_plots(tmp_path: Path) -> None:
    results_dir = tmp_path / "results"
    store(results_dir, [True, False])
    store(results_dir, [True], baseline="base", budget=None)
    out = tmp_path / "docs" / "LEADERBOARD.md"
    write_leaderboard(results_dir, out, plots_dir=tmp_path / "docs" / "plots", published=NO_PUBLISHED)
    text = out.read_text()
    assert "![table1 cmp](plots/table1__cmp.png)" in text
    assert (tmp_path / "docs" / "plots" / "table1__cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["LEADERBOARD.md", "plots"]
    assert not list(tmp_path.rglob("*.tmp"))


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[16:24]  # the IHDR chunk: width, height as big-endian 32-bit integers
    return int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")


def test_plot_has_one_row_of_panels_per_task(tmp_path: Path) -> None:
    """Each task gets its own row (and its own change scale): a second task makes the figure taller, not wider."""
    for baseline, budget in (("sft", None), ("grpo", BUDGET)):
        store(tmp_path / "results", [True, False], baseline=baseline, budget=budget, task="countdown")
    plot = tmp_path / "plots" / "table1__cmp.png"
    write_leaderboard(tmp_path / "results", tmp_path / "board.md", plots_dir=plot.parent, published=NO_PUBLISHED)
    one_task = png_size(plot)
    for baseline, budget in (("sft", None), ("grpo", BUDGET)):
        store(tmp_path / "results", [True, True], baseline=baseline, budget=budget, task="sudoku")
    write_leaderboard(tmp_path / "results", tmp_path / "board.md", plots_dir=plot.parent, published=NO_PUBLISHED)
    two_tasks = png_size(plot)
    assert two_tasks[0] == one_task[0] and two_tasks[1] > 1.6 * one_task[1]


def _training_csv(
    results_dir: Path, rows: list[tuple], comparison: str = "cmp", *, seeded: bool = False, task: str = "sudoku"
) -> Path:
    """A training-reward file of ``task`` (Sudoku by default) of ``rows``: (run, step, reward), the seedless old
    format read as seed 0, or with ``seeded`` (run, seed, step, reward)."""
    path = training_path(results_dir, comparison, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "task,seed,run,step,reward_mean" if seeded else "task,run,step,reward_mean"
    lines = [header]
    for row in rows:
        run, *seed, step, reward = row
        lines.append(",".join(map(str, [task, *seed, run, step, reward])))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_training_changes_pair_the_last_rollouts_with_the_frozen_control() -> None:
    import pandas as pd

    frozen = [("frozen", step, 0.5 + 0.1 * (step % 2)) for step in range(1, 14)]  # prompts alternate in difficulty
    learner = [("learner", step, 0.5 + 0.1 * (step % 2) + (0.2 if step > 3 else 0.0)) for step in range(1, 14)]
    flat = [("flat", step, 0.5 + 0.1 * (step % 2)) for step in range(1, 14)]
    rewards = pd.DataFrame([("sudoku", 0, *row) for row in frozen + learner + flat], columns=TRAINING_COLUMNS)
    changes = training_changes(rewards, window=10).set_index("run")
    assert list(changes.index) == ["flat", "learner"]  # alphabetical, not the file's order
    assert changes.loc["learner", "rollouts"] == 10
    learned = changes.loc["learner", "change"]
    assert (learned.mean, learned.low, learned.high) == pytest.approx((0.2, 0.2, 0.2))  # a constant difference
    assert changes.loc["flat", "change"].mean == pytest.approx(0.0)
    # Steps 4..13: rewards 0.6, 0.5, ... -> mean 0.55 for the control, + 0.2 for the learner.
    assert changes.loc["learner", "frozen"] == pytest.approx(0.55)
    assert changes.loc["learner", "reward"] == pytest.approx(0.75)


def test_training_changes_pair_each_seed_with_its_own_control() -> None:
    """Seed 1's control is 0.3 higher than seed 0's (other prompts): pairing across seeds would invent a change."""
    import pandas as pd

    rows = [("frozen", seed, step, 0.2 + 0.3 * seed) for seed in (0, 1) for step in (1, 3)]
    rows += [("learner", seed, step, 0.2 + 0.3 * seed + 0.1 * (seed + 1)) for seed in (0, 1) for step in (1, 3)]
    rewards = pd.DataFrame([("sudoku", seed, run, step, r) for run, seed, step, r in rows], columns=TRAINING_COLUMNS)
    (change,) = training_changes(rewards).to_dict("records")
    assert change["seeds"] == 2 and change["rollouts"] == 4
    assert change["per_seed"] == pytest.approx({0: 0.1, 1: 0.2}) and change["change"].mean == pytest.approx(0.15)


def test_training_block_is_shown_with_its_comparison(tmp_path: Path) -> None:
    store(tmp_path, [True], baseline="sft", budget=None)
    store(tmp_path, [True], baseline="test_rl_a")
    _training_csv(tmp_path, [("frozen", 1, 0.5), ("frozen", 3, 0.5), ("test_rl_a", 1, 0.5), ("test_rl_a", 3, 0.7)])
    _training_csv(tmp_path, [("frozen", 1, 0.1), ("other", 1, 0.9)], comparison="another")  # no such comparison
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    assert "**Training reward, Sudoku** (`cmp__sudoku.csv`)" in markdown and "another" not in markdown
    (row,) = next(rows for kind, rows in parse_tables(markdown) if kind == "training")
    assert row == {
        "Baseline": "test_rl_a",
        "Rollouts": "2",
        "Training reward": "0.600",
        "Frozen start": "0.500",
        "Change": "+0.100 [+0.000, +0.200]",
        "Runs": "1",
        "Change over runs": "+0.100 [+0.000, +0.200] not resolved",
    }


def test_training_block_names_the_seed_of_each_per_seed_change(tmp_path: Path) -> None:
    """A run missing one seed's rollouts shows which seed it has: an unlabelled shorter list would not say."""
    store(tmp_path, [True], baseline="sft", budget=None)
    store(tmp_path, [True], baseline="test_rl_a")
    store(tmp_path, [True], baseline="test_rl_b")
    rows = [("frozen", seed, 1, 0.5) for seed in (0, 1)] + [("test_rl_a", 0, 1, 0.7), ("test_rl_a", 1, 1, 0.4)]
    rows.append(("test_rl_b", 1, 1, 0.6))  # seed 0's rows of test_rl_b are missing
    _training_csv(tmp_path, rows, seeded=True)
    table = next(rows for kind, rows in parse_tables(build_leaderboard(tmp_path, NO_PUBLISHED)) if kind == "training")
    assert {row["Baseline"]: row["Per seed (seed: change)"] for row in table} == {
        "test_rl_a": "0: +0.200, 1: -0.100",
        "test_rl_b": "1: +0.100",
    }


@pytest.mark.parametrize("text", ["task,run\nsudoku,frozen\n", "", "\x00\x01garbage"])
def test_bad_training_file_is_one_clear_error(tmp_path: Path, text: str) -> None:
    store(tmp_path, [True])
    path = _training_csv(tmp_path, [])
    path.write_text(text)
    with pytest.raises(UserError, match="training-reward file"):
        build_leaderboard(tmp_path, NO_PUBLISHED)


def test_invalid_recorded_decode_settings_name_the_record(tmp_path: Path) -> None:
    path = store(tmp_path, [True], settings={"max_completion_length": 32, "block_length": 8, "steps": 3})
    with pytest.raises(UserError, match=rf"{path.name}: its recorded decode settings are invalid: steps \(3\)"):
        build_leaderboard(tmp_path, NO_PUBLISHED)


def test_approximate_decoding_gets_its_own_block(tmp_path: Path) -> None:
    """A fast-protocol cell never sits in an exact-decoding block: same comparison, two titled blocks."""
    # recorded before `cache` existed
    exact = {"max_completion_length": 32, "steps": 16, "block_length": 8, "protocol": {"attention": "full"}}
    fast = {**exact, "cache": "dual", "strategy": "dynamic", "stop_at_eos": True}
    store(tmp_path, [True, False], settings=exact)
    store(tmp_path, [True, True], settings=fast, protocol="tiny-fast")
    store(tmp_path, [False], settings={**fast, "cache": "none"}, protocol="tiny-parallel", baseline="test_rl_b")
    # a block model's own dynamic protocol is its reference decoder: not approximate
    block = {**fast, "cache": "none", "protocol": {"attention": "block"}}
    store(
        tmp_path,
        [True],
        table="table2",
        task="aime24",
        sampling="dynamic",
        length=2000,
        max_completion_length=64,
        settings=block,
        protocol="tracerl-dynamic",
    )
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    captions = [line for line in markdown.splitlines() if line.startswith("**Measured by this code — ")]
    assert len(captions) == 3 and sum("APPROXIMATE DECODING" in line for line in captions) == 1
    table1_exact, table1_fast, table2 = measured_tables(markdown)
    assert [row["Protocol"] for row in table1_exact] == ["d1"]
    assert sorted(row["Protocol"] for row in table1_fast) == ["tiny-fast", "tiny-parallel"]
    assert [row["Protocol"] for row in table2] == ["tracerl-dynamic"]
    fast_block = markdown[markdown.index("APPROXIMATE DECODING") :]
    assert "not comparable with exact-decoding rows" in fast_block.split("\n|")[0]


def test_the_paper_layout_is_the_paper_presets() -> None:
    """The columns the published tables have are the tasks and lengths the paper presets reproduce."""
    from stabledrl_bench.experiments.presets import presets
    from stabledrl_bench.reporting.layout import TABLE1_TASKS, TABLE2_OPTIONAL, TABLE2_TASKS
    from stabledrl_bench.reporting.schema import TABLE1_LENGTHS

    table1, table2 = presets("table1")["paper"], presets("table2")["paper"]
    assert tuple(table1.tasks) == TABLE1_TASKS and tuple(table1.lengths) == TABLE1_LENGTHS
    assert set(table2.tasks) <= set(TABLE2_TASKS) and set(TABLE2_OPTIONAL) <= set(TABLE2_TASKS)


# ------------------------------------------------------------------------------------------------ over runs
def _seeded(results_dir: Path, rows: dict[str, dict[int, list[int]]], **overrides: Any) -> None:
    """Records of every (row, seed): ``rows[baseline][seed]`` is its per-item correctness at GSM8K 128."""
    for baseline, seeds in rows.items():
        for seed, correct in seeds.items():
            budget = None if baseline == "sft" else BUDGET
            store(results_dir, [bool(x) for x in correct], baseline=baseline, seed=seed, budget=budget, **overrides)


def test_changes_over_runs_resample_the_seeds_and_print_a_verdict_only_where_resolved(tmp_path: Path) -> None:
    """Worked by hand, items constant within a seed: test_rl_a gains 100 points on every seed, so every resample
    is +100 (above); test_rl_b gains on two seeds and not on the third, and a resample draws the third seed three
    times with chance 1/27 > 2.5 %, so its interval reaches 0 (not resolved) while the pooled item interval (each
    item's mean over the seeds: +2/3 everywhere) is [+66.7, +66.7]. In another comparison test_rl_a loses on every
    seed: below."""
    off, on = [0, 0, 0, 0], [1, 1, 1, 1]
    _seeded(
        tmp_path,
        {
            "sft": {0: off, 1: off, 2: off},
            "test_rl_a": {0: on, 1: on, 2: on},
            "test_rl_b": {0: on, 1: on, 2: off},
        },
    )
    _seeded(tmp_path, {"sft": {3: on, 4: on}, "test_rl_a": {3: off, 4: off}}, comparison="lose")
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    pooled = {row["Baseline"]: row["GSM8K 128"] for table in change_tables(markdown) for row in table}
    assert pooled["test_rl_b"] == "+66.7 [+66.7, +66.7]"  # every item's mean over the seeds gains 2/3
    gain, lose = change_tables(markdown, "runs")
    runs = {row["Baseline"]: row for row in gain}
    assert runs["test_rl_a"]["Runs"] == "3" and runs["test_rl_a"]["GSM8K 128"] == "+100.0 [+100.0, +100.0] above"
    assert runs["test_rl_b"]["GSM8K 128"] == "+66.7 [+0.0, +100.0] not resolved"
    assert lose[0]["GSM8K 128"] == "-100.0 [-100.0, -100.0] below"
    assert runs["test_rl_a"]["GSM8K avg"] == "–"  # an average column needs all of its lengths
    assert "test_rl_a is above its start in GSM8K 128: +100.0 [+100.0, +100.0] points over 3 runs" in markdown
    assert "test_rl_a is below its start in GSM8K 128: -100.0" in markdown and "test_rl_b is above" not in markdown


def test_methods_are_compared_with_each_other_over_runs(tmp_path: Path) -> None:
    """test_rl_a beats test_rl_b by 100 points on every item of two seeds (paired by seed and item): better, and
    P = 1; the verdict list names it once (its mirror, "worse than", is the same statement)."""
    off, on = [0, 0, 0, 0], [1, 1, 1, 1]
    _seeded(tmp_path, {"sft": {0: off, 1: off}, "test_rl_a": {0: on, 1: on}, "test_rl_b": {0: off, 1: off}})
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    (matrix,) = change_tables(markdown, "pairwise")
    by_row = {row["Baseline"]: row for row in matrix}
    assert by_row["test_rl_a"]["test_rl_b"] == "+100.0 (1.00) better"
    assert by_row["test_rl_b"]["test_rl_a"] == "-100.0 (0.00) worse"
    assert by_row["test_rl_a"]["test_rl_a"] == "–"
    assert "test_rl_a is better than test_rl_b in GSM8K: +100.0 [+100.0, +100.0] points over 2 runs" in markdown
    assert "is worse than" not in markdown
    (aggregates,) = change_tables(markdown, "aggregates")
    assert {row["Baseline"]: row["GSM8K P(run > start)"] for row in aggregates} == {
        "test_rl_a": "1.00 [1.00, 1.00]",
        "test_rl_b": "0.50 [0.50, 0.50]",  # ties with its start on every seed
    }
    assert aggregates[0]["GSM8K IQM change"] == "+100.0 [+100.0, +100.0]"


def test_the_profiles_plot_is_written_beside_the_comparisons(tmp_path: Path) -> None:
    _seeded(tmp_path / "results", {"sft": {0: [0, 1], 1: [0, 0]}, "test_rl_a": {0: [1, 1], 1: [0, 1]}})
    markdown = build_leaderboard(
        tmp_path / "results", NO_PUBLISHED, plots_dir=tmp_path / "plots", markdown_dir=tmp_path
    )
    assert "![table1 cmp profiles](plots/table1__cmp__profiles.png)" in markdown
    assert (tmp_path / "plots" / "table1__cmp__profiles.png").stat().st_size > 1000


def test_training_rewards_over_runs_say_whether_the_control_is_beaten(tmp_path: Path) -> None:
    """Seed 0 gains 0.25 over its control and seed 1 0.125, on every rollout: above the control over runs; a run
    that gains on one seed and loses as much on the other is not resolved."""
    store(tmp_path, [True], baseline="sft", budget=None)
    store(tmp_path, [True], baseline="test_rl_a")
    rows = [("frozen", seed, step, 0.5) for seed in (0, 1) for step in (1, 3)]
    rows += [("test_rl_a", seed, step, 0.75 - 0.125 * seed) for seed in (0, 1) for step in (1, 3)]
    rows += [("test_rl_b", seed, step, 0.625 - 0.25 * seed) for seed in (0, 1) for step in (1, 3)]
    _training_csv(tmp_path, rows, seeded=True)
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    table = {row["Baseline"]: row for row in next(rows for kind, rows in parse_tables(markdown) if kind == "training")}
    assert table["test_rl_a"]["Runs"] == "2"
    assert table["test_rl_a"]["Change over runs"] == "+0.188 [+0.125, +0.250] above"
    assert table["test_rl_b"]["Change over runs"] == "+0.000 [-0.125, +0.125] not resolved"
    assert "test_rl_a is above the frozen control in Sudoku: +0.188 [+0.125, +0.250] over 2 runs" in markdown
