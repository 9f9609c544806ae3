"""Adversarial completions: every grader returns a (negative) verdict within 2 seconds and runs nothing.

The 2-second bound is the acceptance criterion of the graders (math-verify's hard limit is 1.5 s per answer,
everything else is linear-time), so it is asserted here, with warm worker processes (a cold start of the
pool is a one-off cost per process). MATH500 runs with the default limit; GSM8K shares its grader code and
runs with a 0.5 s limit to keep the suite short.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stabledrl_bench.tasks import REWARD_PROFILES, Task, get_task
from stabledrl_bench.tasks.graders.mathverify import math_verify, warm_up
from stabledrl_bench.tasks.gsm8k import GSM8KTask

LIMIT_S = 2.0


def adversarial(marker: Path) -> dict[str, str]:
    code = f"__import__('os').system('touch {marker}')"
    return {
        "tower_latex": "\\boxed{9^{9^{9^{9}}}}",
        "tower_python": "The answer is 9**9**9**9",
        "tower_inline": "so $9^{9^{9^9}}$ and <answer>9**9**9**9</answer>",
        "unclosed_boxes": "\\boxed{" * 20_000,
        "deep_braces": "\\boxed{" + "{" * 30_000 + "1" + "}" * 30_000 + "}",
        "unbalanced_braces": "}" * 30_000 + "{" * 30_000,
        "deep_parens": "<answer>" + "(" * 40_000 + "1" + ")" * 40_000 + "</answer>",
        "code_boxed": f"\\boxed{{{code}}}",
        "code_tag": f"<answer>{code}</answer>",
        "long_sum": "1+" * 50_000 + "1",
        "long_text": "word " * 20_000,
        "many_tags": "<answer>" * 12_500,
        "many_fences": "<answer>" + "```1 " * 20_000,
        "digits": "7" * 100_000,
        "whitespace": "</answer>" + " " * 100_000 + "x",
        "degree_signs": "\\boxed{" + "°" * 30_000 + "}",
        "label_colons": "Solution:\n" * 10_000 + ":" * 50_000,
        "grid_separators": "<answer>" + "1|-" * 30_000 + "</answer>",
        "blank_answers": "<answer> </answer>\\boxed{}" * 5_000,
    }


DOCS = {
    "gsm8k": {"answer": "#### 72"},
    "math500": {"answer": "\\frac{1}{2}"},
    "countdown": {"numbers": [9, 9, 9, 9], "target": 22},
    "sudoku": {"puzzle": "1034340221034301", "solution": "1234341221434321"},
}


def make_task(name: str) -> Task:
    return GSM8KTask(timeout_s=0.5) if name == "gsm8k" else get_task(name)


@pytest.mark.parametrize("task_name", list(DOCS))
def test_adversarial_completions(task_name: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    task, doc = make_task(task_name), DOCS[task_name]
    warm_up()
    slow = {}
    for name, completion in adversarial(marker).items():
        start = time.monotonic()
        result = task.grade(completion, doc)
        for profile in REWARD_PROFILES if task_name in ("countdown", "sudoku") else ("d1",):
            task.reward(completion, doc, profile)
        elapsed = time.monotonic() - start
        assert not result.correct and result.score < 1.0, name
        assert result.details.get("d1") in (False, None), name
        if elapsed >= LIMIT_S:
            slow[name] = round(elapsed, 2)
    assert slow == {}
    assert not marker.exists()


def test_time_outs_are_reported(tmp_path: Path) -> None:
    result = GSM8KTask(timeout_s=0.3).grade(adversarial(tmp_path / "m")["tower_latex"], DOCS["gsm8k"])
    assert result.details["timed_out"] and not result.details["math_verify"]


def test_hard_limits_hold_for_a_stream_of_hostile_answers_on_a_busy_machine() -> None:
    """Every call returns within its limit plus the kill, even while replacement workers start slowly.

    Each hostile answer costs a worker; its replacement imports sympy, which takes seconds when every core is
    busy. Waiting for it must count against the next call's limit instead of adding to it.
    """
    limit, slack = 0.5, 0.5
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        warm_up()  # a warm pool, as in every other test here
        times, timed_out = [], []
        for i in range(10):
            answer = "\\boxed{1}" if i % 5 == 4 else "\\boxed{9^{9^{9^{9}}}}"
            start = time.monotonic()
            outcome = math_verify("1", answer, timeout_s=limit)
            times.append(time.monotonic() - start)
            timed_out.append(outcome.timed_out)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert max(times) < limit + slack, [round(t, 2) for t in times]
    assert all(timed_out[i] for i in range(10) if i % 5 != 4)  # the hostile answers never got a verdict
