"""``benchmarks/bench_suite.py``: the suite's CPU seconds by module, from hand-made rows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("bench_suite", ROOT / "benchmarks" / "bench_suite.py")
bench_suite = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench_suite)


def test_cpu_seconds_add_up_by_module_and_wall_seconds_by_worker() -> None:
    rows = [
        {"test": "tests/test_a.py::one", "worker": "gw0", "wall": 10.0, "self": 1.0, "children": 8.0},
        {"test": "tests/test_a.py::two", "worker": "gw1", "wall": 2.0, "self": 2.0, "children": 0.0},
        {"test": "tests/test_b.py::three", "worker": "gw1", "wall": 5.0, "self": 0.5, "children": 0.0},
    ]
    document = bench_suite.summary(rows, wall=13.0, last="3 passed")
    assert document["cpu_s"] == 11.5
    assert document["modules"] == [
        {"module": "tests/test_a.py", "cpu_s": 11.0},
        {"module": "tests/test_b.py", "cpu_s": 0.5},
    ]
    assert document["workers_wall_s"] == {"gw0": 10.0, "gw1": 7.0}
    assert [t["test"] for t in document["tests"]] == [
        "tests/test_a.py::one",
        "tests/test_a.py::two",
        "tests/test_b.py::three",
    ]
    document["measured"] = {
        "command": "python -m pytest -q",
        "date": "2026-12-07 20:00 UTC",
        "commit": "abc1234",
        "machine": "a CPU (AVX2), x86_64",
        "cores": 2,
        "load_before": "0.10",
        "load_after": "1.90",
    }
    text = bench_suite.report(document)
    assert "the tests' CPU time: 12 s (over 2 cores: at least 6 s of wall time)" in text
    assert "| `tests/test_a.py` | 11 | 96% |" in text and "gw0 10 s, gw1 7 s" in text
