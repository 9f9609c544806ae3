"""The prepared GPU check (``benchmarks/gpu_check.py``) runs end to end: here on the CPU with ``--quick``, so that the
script a lent GPU runs unattended cannot rot. Its numbers here say nothing about a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_check_runs_every_baseline_and_writes_its_report(tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "gpu_check.py", "--quick", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT / "benchmarks", capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    runs = report["rl"]["quick"]["runs"]
    assert report["ok"] and [run["baseline"] for run in runs] == ["grpo", "spg", "espo", "trado", "stabledrl"]
    assert all(run["finite"] and run["weights_changed"] and len(run["losses"]) == 2 for run in runs)
    assert report["decoding"]["exact"]["tokens_per_s"] > 0 and report["hardware"]["torch"]
