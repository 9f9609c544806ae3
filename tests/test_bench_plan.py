"""``check-model``'s plan agrees with a measured RL step (``benchmarks/bench_plan.py``) within 15%, category by
category, at the smallest size: 2 CPU processes under DDP, checkpointing off (the committed report has the larger
sizes, FSDP and checkpointing on). A change to the trainer's or the model's memory, or to the plan's arithmetic,
that breaks the agreement fails here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.15  # the bar, and what the plan's docstring promises


def test_the_plan_agrees_with_a_measured_step_at_the_smallest_size(tmp_path):
    out = tmp_path / "plan"
    cmd = [sys.executable, "bench_plan.py", "--sizes", "quick", "--configs", "ddp", "--checkpointing", "off"]
    proc = subprocess.run(
        [*cmd, "--out", str(out)], cwd=ROOT / "benchmarks", capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = json.loads(out.with_suffix(".json").read_text())
    rows = {name: (planned, measured) for name, planned, measured in result["rows"]}
    # every category the plan has for DDP was measured, and the two it has not (FSDP's) are absent
    assert rows["rollout replica"] == (0, 0)
    for name, (planned, measured) in rows.items():
        if planned:
            assert measured == pytest.approx(planned, rel=TOLERANCE), name
    assert "activations + logits (forward)" in rows and rows["gradients"][1] > 0  # DDP's buckets hold them
    assert "Largest disagreement" in out.with_suffix(".md").read_text()
