"""Adversarial completions: every grader returns a (negative) verdict within 2 seconds and runs nothing.

The 2-second bound is the acceptance criterion of the graders (everything but math-verify is linear-time, and
math-verify has a hard limit per answer, retried once on a fresh worker when a busy machine took the time), so it
is asserted here for each answer's own time: the waits for a started worker (a replacement importing sympy after a
kill) are charged to no answer (``tasks/graders/isolation.py``). GSM8K and MATH500 run with a 0.4 s limit (1.5 s by
default), so that even a retried time-out (on a busy machine) fits the bound, and to keep the suite short.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stabledrl_bench.tasks import REWARD_PROFILES, Task, get_task
from stabledrl_bench.tasks.graders import mathverify
from stabledrl_bench.tasks.graders.isolation import shared_pool
from stabledrl_bench.tasks.graders.mathverify import math_verify, warm_up
from stabledrl_bench.tasks.gsm8k import GSM8KTask
from stabledrl_bench.tasks.math500 import Math500Task

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
    if name in ("gsm8k", "math500"):
        return {"gsm8k": GSM8KTask, "math500": Math500Task}[name](timeout_s=0.4)
    return get_task(name)


@pytest.mark.parametrize("task_name", list(DOCS))
def test_adversarial_completions(task_name: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    task, doc = make_task(task_name), DOCS[task_name]
    pool = shared_pool(mathverify.__name__)
    warm_up()
    slow = {}
    for name, completion in adversarial(marker).items():
        waited, start = pool.waited_s, time.monotonic()
        result = task.grade(completion, doc)
        for profile in REWARD_PROFILES if task_name in ("countdown", "sudoku") else ("d1",):
            task.reward(completion, doc, profile)
        elapsed = time.monotonic() - start - (pool.waited_s - waited)  # waits for started workers: no answer's
        assert not result.correct and result.score < 1.0, name
        assert result.details.get("d1") in (False, None), name
        if elapsed >= LIMIT_S:
            slow[name] = round(elapsed, 2)
    assert slow == {}
    assert not marker.exists()


def test_time_outs_are_reported(tmp_path: Path) -> None:
    result = GSM8KTask(timeout_s=0.3).grade(adversarial(tmp_path / "m")["tower_latex"], DOCS["gsm8k"])
    assert result.details["timed_out"] and not result.details["math_verify"]


def test_under_load_each_answer_is_charged_only_its_own_time() -> None:
    """Every core busy (one spinning process per core: 2 on 2 cores here), plain answers graded right after hostile
    ones that cost the pool both its workers: their replacements import sympy, which takes seconds on a busy machine.
    That wait is no answer's time, so each plain answer gets its right verdict (it was once marked timed out), and
    each hostile one still times out within twice its limit plus the kills (a retry on a fresh worker, since the load
    took part of its time), not counting the waits for started workers (the pool's ``waited_s``)."""
    limit, slack = 0.5, 0.5
    pool = shared_pool(mathverify.__name__)
    answers = ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{9^{9^{9^{9}}}}", "\\boxed{1}", "The answer is \\boxed{1}."]
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        warm_up()  # a warm pool, as in every other test here
        outcomes, charged = [], []
        for answer in answers:
            waited, start = pool.waited_s, time.monotonic()
            outcomes.append(math_verify("1", answer, timeout_s=limit))
            charged.append(time.monotonic() - start - (pool.waited_s - waited))
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert [(outcome.correct, outcome.timed_out) for outcome in outcomes] == [(False, True)] * 2 + [(True, False)] * 2
    assert max(charged) < 2 * (limit + slack), [round(t, 2) for t in charged]
