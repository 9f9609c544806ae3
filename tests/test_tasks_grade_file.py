"""grade_file / main: one output line per input line, bad lines flagged but never fatal, summaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stabledrl_bench.errors import UserError
from stabledrl_bench.tasks import get_task
from stabledrl_bench.tasks import grade_file as grade_file_module
from stabledrl_bench.tasks.grade_file import grade_file, main


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines) + b"\n")
    return path


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_gsm8k_file_with_good_and_bad_lines(tmp_path: Path) -> None:
    lines = [
        json.dumps({"id": "a", "prediction": "<answer>\\boxed{18}</answer>", "answer": "Janet...\n#### 18"}),
        json.dumps({"prediction": "so the answer is \\boxed{1,000}", "answer": 1000}),
        json.dumps({"prediction": "\\boxed{17}", "answer": "18"}),
        "not json",
        "[1, 2]",
        json.dumps({"answer": "5"}),
        json.dumps({"prediction": 5, "answer": "5"}),
        "",
        json.dumps({"prediction": "x", "answer": True}),
        b"\xff\xfe{",
        "[" * 100_000 + "]" * 100_000,
        '{"prediction": "1", "answer": ' + "9" * 5000 + "}",
    ]
    source, out = write_lines(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    summary = grade_file("gsm8k", source, out)
    records = read_records(out)
    assert [r["line"] for r in records] == list(range(1, 13))
    assert records[0]["id"] == "a" and records[0]["correct"] is True and records[0]["extracted"] == "18"
    assert records[1]["correct"] is True and records[1]["d1"] is False  # d1 reads "1,000" as 1
    assert records[2]["correct"] is False and records[2]["score"] == 0.0
    errors = [r["error"] for r in records[3:]]
    assert errors[0].startswith("invalid JSON") and "not an object" in errors[1]
    assert errors[2] == "missing field 'prediction'" and errors[3] == "field 'prediction' must be a string"
    assert errors[4] == "empty line" and "must be" in errors[5] and errors[6].startswith("invalid JSON")
    assert errors[7].startswith("invalid JSON: RecursionError") and errors[8].startswith("invalid JSON")
    assert all(r["correct"] is None and r["score"] is None for r in records[3:])
    assert summary == {
        "task": "gsm8k",
        "lines": 12,
        "graded": 3,
        "errors": 9,
        "accuracy": pytest.approx(2 / 3),
        "mean_score": pytest.approx(2 / 3),
        "accuracy_d1": pytest.approx(1 / 3),
        "timed_out": 0,
    }


def test_a_file_is_graded_in_batches_with_the_line_by_line_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines are graded a chunk at a time (math-verify checks a chunk on every worker); a bad gold field in a
    chunk costs only its own line, and every record is what grading that line alone gives."""
    monkeypatch.setattr(grade_file_module, "CHUNK_LINES", 4)
    items = [{"id": n, "prediction": f"<answer>\\boxed{{{n}}}</answer>", "answer": f"#### {n % 3}"} for n in range(9)]
    items[5]["answer"] = "#### five"  # in the second chunk
    source = write_lines(tmp_path / "in.jsonl", [json.dumps(item) for item in items] + ["[]"])
    summary = grade_file("gsm8k", source, tmp_path / "out.jsonl")
    records = read_records(tmp_path / "out.jsonl")
    task = get_task("gsm8k")
    for n, item in enumerate(items):
        if n == 5:
            assert records[n]["error"] == "GSM8K answer is not a number after '####': 'five'"
            continue
        grade = task.grade(item["prediction"], item)
        assert records[n] == {
            "line": n + 1,
            "id": n,
            "correct": grade.correct,
            "score": grade.score,
            "extracted": grade.extracted,
            **grade.details,
        }
    assert records[9]["line"] == 10 and "not an object" in records[9]["error"]
    assert (summary["graded"], summary["errors"], summary["accuracy"]) == (8, 2, 3 / 8)  # n = 0, 1, 2 are right


def test_countdown_and_sudoku_files(tmp_path: Path) -> None:
    countdown = write_lines(
        tmp_path / "cd.jsonl",
        [
            json.dumps({"prediction": "<answer>\\boxed{3*5+7}</answer>", "numbers": [3, 5, 7], "target": 22}),
            json.dumps({"prediction": "<answer>3*5+7</answer>", "numbers": [3, 5, 7], "target": 22}),
            json.dumps({"prediction": "x", "numbers": "3,5,7", "target": 22}),
            json.dumps({"prediction": "x", "numbers": [3, 5, 7], "target": "22"}),
        ],
    )
    summary = grade_file("countdown", countdown, tmp_path / "cd.out")
    assert (summary["graded"], summary["errors"], summary["accuracy"], summary["accuracy_d1"]) == (2, 2, 1.0, 0.5)
    solution, puzzle = "3142243142131324", "3102200002100320"
    sudoku = write_lines(
        tmp_path / "sd.jsonl",
        [
            json.dumps({"prediction": f"<answer>{solution}</answer>", "puzzle": puzzle, "solution": solution}),
            json.dumps({"prediction": "<answer>3142</answer>", "puzzle": puzzle, "solution": solution}),
            json.dumps({"prediction": "x", "puzzle": int(puzzle), "solution": solution}),
        ],
    )
    summary = grade_file("sudoku", sudoku, tmp_path / "sd.out")
    # Cell accuracy is micro-averaged as in d1: (8 + 1) correct of (8 + 8) empty cells ("3142" fills cell 2).
    assert summary["cell_accuracy"] == 9 / 16 and summary["accuracy"] == 0.5 and summary["exact_match"] == 0.5
    assert read_records(tmp_path / "sd.out")[2]["error"].startswith("field 'puzzle' must be")


def test_math_and_aime_answers(tmp_path: Path) -> None:
    source = write_lines(
        tmp_path / "m.jsonl",
        [
            json.dumps({"prediction": "\\boxed{\\frac12}", "answer": "\\frac{1}{2}"}),
            json.dumps({"prediction": "\\boxed{25}", "answer": "025"}),
            json.dumps({"prediction": "\\boxed{25}", "answer": 25}),
        ],
    )
    assert grade_file("math500", source, tmp_path / "m.out")["accuracy"] == 1.0
    # AIME golds are compared as integers: "025" is 25 for d1's string comparison too.
    aime = grade_file("aime24", source, tmp_path / "a.out")
    assert aime["accuracy"] == aime["accuracy_d1"] == 1.0
    assert grade_file("math500", source, tmp_path / "m.out")["accuracy_d1"] == pytest.approx(2 / 3)  # "25" != "025"


def test_stdout_and_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write_lines(tmp_path / "in.jsonl", [json.dumps({"prediction": "\\boxed{4}", "answer": "#### 4"})])
    assert main(["--task", "gsm8k", "--input", str(source)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["correct"] is True and json.loads(captured.err)["accuracy"] == 1.0
    assert main(["--task", "gsm8k", "--input", str(source), "--output", str(tmp_path / "o.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out)["graded"] == 1
    assert main(["--task", "gsm8k", "--input", str(tmp_path / "missing.jsonl")]) == 2
    assert "input file not found" in capsys.readouterr().err
    assert main(["--task", "mbpp", "--input", str(source)]) == 2  # argparse rejects the choice
    assert main(["--task", "gsm8k", "--input", str(source), "--output", str(tmp_path / "no" / "dir.jsonl")]) == 2
    with pytest.raises(UserError, match="cannot grade"):
        grade_file("tiny", source)
