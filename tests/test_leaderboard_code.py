"""The leaderboard's coding table: SPG's published HumanEval and MBPP rows (arXiv 2510.09541, Table 2) with their
grades and derived averages, and the measured rows of Table 1 records of HumanEval and MBPP, one block per
comparison, never a Table 1 column."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from test_leaderboard import NO_PUBLISHED, PUBLISHED_CELL, _training_csv, measured_tables, parse_tables, store_cells
from test_passk import store_sampled
from test_results import store

from stabledrl_bench.errors import UserError
from stabledrl_bench.reporting.leaderboard import ROW_COLUMNS, build_leaderboard, findings
from stabledrl_bench.reporting.published import load_published

CODE_HEADERS = [f"{task} {sub}" for task in ("HumanEval", "MBPP") for sub in ("128", "256", "512", "avg")]
LABELS = [
    "LLaDA-8B-Instruct (SPG's evaluation)",
    "LLaDA-1.5 (SPG's evaluation)",
    "d1 / diffu-GRPO, no SFT (reproduced by SPG)",
    "wd1 (reproduced by SPG)",
    "UniGRPO (reimplemented by SPG)",
    "SPG w/ EUBO",
    "SPG w/ Mixture",
]
# Each row's HumanEval and MBPP averages over 128/256/512, by hand, e.g. (28.1 + 35.4 + 34.8) / 3 = 32.77 -> 32.8.
AVERAGES = {
    "LLaDA-8B-Instruct (SPG's evaluation)": (32.8, 38.8),  # 98.3 / 3, 116.3 / 3 = 38.77
    "LLaDA-1.5 (SPG's evaluation)": (29.9, 39.5),  # 89.7 / 3, 118.4 / 3 = 39.47
    "d1 / diffu-GRPO, no SFT (reproduced by SPG)": (34.8, 43.6),  # 104.3 / 3 = 34.77, 130.7 / 3 = 43.57
    "wd1 (reproduced by SPG)": (34.3, 43.2),  # 103.0 / 3 = 34.33, 129.6 / 3
    "UniGRPO (reimplemented by SPG)": (35.4, 43.6),  # 106.1 / 3 = 35.37, 130.7 / 3 = 43.57
    "SPG w/ EUBO": (34.8, 45.5),  # 104.3 / 3 = 34.77, 136.6 / 3 = 45.53
    "SPG w/ Mixture": (36.6, 48.6),  # 109.7 / 3 = 36.57, 145.9 / 3 = 48.63
}
LLADA = "LLaDA-8B-Instruct (SPG's evaluation)"


def coding(markdown: str) -> str:
    """The coding table's section of a leaderboard page (the last table; no extra sections in these tests)."""
    return markdown[markdown.index("## Coding") :]


def test_published_coding_rows_carry_spg_table_2_with_grades() -> None:
    rows = {row["label"]: row for row in load_published()["code"]["rows"]}
    assert list(rows) == LABELS
    assert [row["statistic"] for row in rows.values()] == ["start", "released", *["best-average"] * 5]
    spot = {
        (LLADA, "humaneval", 128): 28.1,
        ("LLaDA-1.5 (SPG's evaluation)", "mbpp", 256): 44.8,
        ("wd1 (reproduced by SPG)", "humaneval", 512): 38.4,
        ("SPG w/ EUBO", "humaneval", 512): 33.5,
        ("SPG w/ Mixture", "mbpp", 128): 46.3,
    }
    for (label, task, length), value in spot.items():
        assert rows[label]["cells"][task][length] == {
            "value": value,
            "grade": "P",
            "source": "SPG Table 2 (arXiv 2510.09541)",
        }
    for label, (humaneval, mbpp) in AVERAGES.items():
        cells = rows[label]["cells"]
        assert (cells["humaneval"]["avg"]["value"], cells["mbpp"]["avg"]["value"]) == (humaneval, mbpp), label
        assert {cells[task]["avg"]["grade"] for task in ("humaneval", "mbpp")} == {"D"}
        assert sorted(cells) == ["humaneval", "mbpp"]  # no overall average, no other task


def test_published_coding_block_is_validated() -> None:
    published = load_published()

    def refused(change, message: str) -> None:
        broken = copy.deepcopy(published)
        change(broken)
        with pytest.raises(UserError, match=re.escape(message)):
            load_published(broken)

    def row(data, table: str = "code", index: int = 0):
        return data[table]["rows"][index]["cells"]

    def set_avg(data, value: float) -> None:
        row(data)["humaneval"]["avg"]["value"] = value

    refused(lambda data: set_avg(data, 33.0), "33.0 is not the mean of its lengths, 32.77")
    refused(lambda data: row(data)["humaneval"].pop(512), "a grade-D average needs every length's cell")
    refused(lambda data: row(data).update(gsm8k=row(data)["mbpp"]), "gsm8k: not a column group of code")
    overall = {"value": 35.8, "grade": "D", "source": "mean of the row"}
    refused(lambda data: row(data).update(overall=overall), "overall: not a column group of code")
    refused(lambda data: row(data)["mbpp"].update(static=overall), "'static' is not one of (128, 256, 512, 'avg')")
    refused(lambda data: data.update(coding=data["code"]), "unknown key(s) coding")
    # The same check guards Table 1's derived averages: LLaDA GSM8K (69.5 + 77.2 + 79.8) / 3 = 75.5.
    refused(
        lambda data: row(data, "table1")["gsm8k"]["avg"].update(value=76.5), "is not the mean of its lengths, 75.50"
    )
    set_avg(published, 32.75)  # within the one-decimal rounding of 32.77: accepted
    assert load_published(published)["code"]["rows"][0]["cells"]["humaneval"]["avg"]["value"] == 32.75


def test_coding_table_shows_published_rows_and_no_measured_rows_yet(tmp_path: Path) -> None:
    markdown = build_leaderboard(tmp_path)
    section = coding(markdown)
    assert section.startswith("## Coding — full attention, HumanEval and MBPP (SPG layout)")
    assert "**Measured by this code**: no results for this table yet." in section
    ((kind, rows),) = parse_tables(section)
    assert kind == "published" and [row["Model"] for row in rows] == LABELS
    assert list(rows[0]) == ["Model", "Checkpoint", *CODE_HEADERS, "Source"]
    assert rows[0] == {
        "Model": LLADA,
        "Checkpoint": "start (no RL)",
        "HumanEval 128": "28.1 (P)",
        "HumanEval 256": "35.4 (P)",
        "HumanEval 512": "34.8 (P)",
        "HumanEval avg": "32.8 (D)",
        "MBPP 128": "36.2 (P)",
        "MBPP 256": "42.0 (P)",
        "MBPP 512": "38.1 (P)",
        "MBPP avg": "38.8 (D)",
        "Source": "SPG Table 2 (arXiv 2510.09541); mean of SPG Table 2 lengths",
    }
    mixture = rows[-1]
    assert (mixture["HumanEval 512"], mixture["MBPP 256"], mixture["MBPP avg"]) == ("39.6 (P)", "50.6 (P)", "48.6 (D)")
    assert rows[1]["Checkpoint"] == "released model (not trained by the source)"
    assert all(PUBLISHED_CELL.match(row[header]) for row in rows for header in CODE_HEADERS)
    assert "HumanEval 37.8 → 40.1, MBPP 37.8 → 45.4" in section  # ESPO's quote: why it is not a row
    assert "HumanEval" not in markdown[: markdown.index("## Coding")]  # no coding column in Tables 1 and 2


def test_a_humaneval_record_is_a_row_of_the_coding_table_not_a_table_1_column(tmp_path: Path) -> None:
    # HumanEval: 2/4, 1/4, 3/4 at 128/256/512 -> average (50 + 25 + 75) / 3 = 50.0; MBPP not measured.
    cells = {("humaneval", 128): [1, 1, 0, 0], ("humaneval", 256): [1, 0, 0, 0], ("humaneval", 512): [1, 1, 1, 0]}
    for (task, length), correct in cells.items():
        store_cells(tmp_path, {(task, length): correct}, protocol="stabledrl-code", max_completion_length=length)
    store_cells(tmp_path, {("gsm8k", 128): [1, 0]}, max_completion_length=128)  # the same comparison, Table 1
    markdown = build_leaderboard(tmp_path)
    (table1,) = measured_tables(markdown[: markdown.index("## Table 2")])
    assert table1[0]["GSM8K 128"].startswith("50.0 [") and not any("HumanEval" in header for header in table1[0])
    section = coding(markdown)
    assert "no results for this table yet" not in section and "Lengths are scaled" not in section
    assert "**Measured by this code — comparison `cmp`**" in section
    ((row,),) = measured_tables(section)
    assert list(row) == [*ROW_COLUMNS, *CODE_HEADERS]
    assert (row["Baseline"], row["Protocol"]) == ("test_rl_a", "stabledrl-code")
    assert [row[f"HumanEval {sub}"].split(" ")[0] for sub in ("128", "256", "512", "avg")] == [
        "50.0",
        "25.0",
        "75.0",
        "50.0",
    ]
    assert [row[f"MBPP {sub}"] for sub in ("128", "256", "512", "avg")] == ["–"] * 4
    assert [kind for kind, _ in parse_tables(section)] == ["measured", "published"]


def test_tiny_coding_records_are_a_block_of_their_own(tmp_path: Path) -> None:
    """A tiny preset's canvases (128 -> 40) never share a column with the 8B protocol's (128 -> 128): each
    comparison is its own block, the tiny one saying how its lengths were scaled."""
    start = {"baseline": "base", "budget": None, "task": "mbpp", "length": 128}
    store(tmp_path, [False, False], comparison="table1-tiny", max_completion_length=40, **start)
    store(tmp_path, [True, True], comparison="table1-paper", preset="paper", max_completion_length=128, **start)
    section = coding(build_leaderboard(tmp_path, NO_PUBLISHED))
    paper, tiny = measured_tables(section)
    assert (paper[0]["Preset"], paper[0]["MBPP 128"].split(" ")[0]) == ("paper", "100.0")
    assert (tiny[0]["Preset"], tiny[0]["MBPP 128"].split(" ")[0]) == ("tiny", "0.0")
    assert section.count("Lengths are scaled") == 1
    assert section.index("128 → 40") > section.index("comparison `table1-tiny`")


def test_each_table_shows_the_training_rewards_of_its_own_tasks(tmp_path: Path) -> None:
    for task in ("gsm8k", "humaneval"):
        store(tmp_path, [True], baseline="sft", budget=None, task=task)
        store(tmp_path, [True], task=task)
        rows = [("frozen", 1, 0.5), ("test_rl_a", 1, 0.6)]
        _training_csv(tmp_path, rows, task=task)
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    table1, section = markdown[: markdown.index("## Table 2")], coding(markdown)
    assert "**Training reward, GSM8K**" in table1 and "Training reward, HumanEval" not in table1
    assert "**Training reward, HumanEval**" in section and "Training reward, GSM8K" not in section
    trained = [finding.column for finding in findings(tmp_path) if finding.block == "training reward"]
    assert trained == ["GSM8K", "HumanEval"]  # each once


def test_sampled_coding_records_are_the_coding_tables_pass_at_k_block(tmp_path: Path) -> None:
    # MBPP, two problems decoded twice: 1 of 2 and 0 of 2 correct -> pass@1 = (0.5 + 0) / 2 = 25%.
    store_sampled(tmp_path, "sft", [[True, False], [False, False]], budget=None, task="mbpp")
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    assert "SAMPLED DECODING" not in markdown[: markdown.index("## Coding")]
    block = coding(markdown)[coding(markdown).index("SAMPLED DECODING") :]
    assert "| sft | start | tiny-dlm | d1-n2-t1 | 0 | 25.0 [0.0, 50.0] |" in block and "MBPP 128 pass@2" in block
