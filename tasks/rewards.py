"""Reward components of the ``d1`` and ``stabledrl`` profiles, exactly as in the official code.

d1 (``dllm-reasoning/d1: diffu-grpo/reward_func.py``, ``math500_utils.py``; docs/methods.md#reward-profiles), all
components summed with weight 1:

* GSM8K: ``xmlcount`` + ``soft_format`` + ``strict_format`` + ``int`` + ``correctness`` (2.0 for exact string
  equality of the ``<answer>`` text with the ``####`` gold). The format regexes have no DOTALL (as at d1
  commit ``837888f``): ``.`` does not cross newlines, so the canonical multi-line layout cannot satisfy
  ``soft_format`` and the attainable maximum for it is 3.5.
* MATH: ``correctness`` (2.0 if ``is_equiv(strip(remove_boxed(last_boxed_only_string(.))))``) +
  ``boxed_and_answer_tags_format`` = 0.5 * (1[``<answer>`` present] + (1.0 if ``"\\boxed"`` in the answer
  else 0.5)), where d1's non-raw ``"\\boxed"`` is a backspace followed by ``oxed`` (kept: the value is
  in practice 0.25 or 0.75).
* Countdown: 1.0 if the last ``<answer>`` expression uses exactly the numbers and hits the target within
  1e-5, 0.1 if an answer tag is present otherwise, 0.0 without a tag.
* Sudoku: fraction of the puzzle's empty cells filled as in the solution (digits of the last ``<answer>``,
  right-padded with ``0`` / truncated to 16).

StableDRL (``JianyuanZhong/StableDRL: networks/llada_svpo.py``, ``dataloaders/*``): base + ``anti_short_boxed`` (0 for a
response that is short, < 200 non-whitespace characters, *and* a bare ``\\boxed{..}`` or mostly box, else 1).
GSM8K/MATH base: +1 if ``math_verify.verify(parse(gold), parse(response))`` else -1 (errors and time-outs
-1). Countdown base: as d1 but the numbers only need to form a sub-multiset. Sudoku base: d1's cell fraction.

Deliberate differences, none of which changes a reward on well-formed completions: Countdown expressions are
evaluated by the safe evaluator (:mod:`.graders.arithmetic`; ``**`` and ``//``, which the reference ``eval``
accepts, score as invalid), math-verify runs under a hard time limit in a worker process, and every pattern
that is super-linear on adversarial text is computed in linear time with the same result.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .graders import d1
from .graders.arithmetic import NumberRule, evaluate, uses_numbers
from .graders.mathverify import math_verify_many
from .graders.text import last_answer_tag, split_answer

_STRICT_FORMAT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$")
_SOFT_FORMAT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>")
_PURE_BOXED = re.compile(r"[\s$]*\\boxed\{[^}]*\}[\s$]*[.?!'\"“”’]*\s*")
_BOXED_LAZY = re.compile(r"\\boxed\{.*?\}", re.DOTALL)
_WHITESPACE = re.compile(r"\s+")
_D1_BOXED_QUIRK = "\boxed"  # sic: d1 wrote a non-raw "\boxed", i.e. backspace + "oxed"

# ------------------------------------------------------------------------------------------- d1 GSM8K


def xmlcount(text: str) -> float:
    """d1's ``count_xml``: 0.125 per well-formed tag occurring exactly once, minus 0.001 per trailing char."""
    count = 0.0
    if text.count("<reasoning>\n") == 1:
        count += 0.125
    if text.count("\n</reasoning>\n") == 1:
        count += 0.125
    if text.count("\n<answer>\n") == 1:
        count += 0.125 - len(text.split("\n</answer>\n")[-1]) * 0.001
    if text.count("\n</answer>") == 1:
        count += 0.125 - (len(text.split("\n</answer>")[-1]) - 1) * 0.001
    return count


def soft_format(text: str) -> float:
    """0.5 if ``re.match(r"<reasoning>.*?</reasoning>\\s*<answer>.*?</answer>", text)`` (no DOTALL)."""
    return 0.5 if _SOFT_FORMAT.match(text) else 0.0


def strict_format(text: str) -> float:
    """0.5 if the whole text is ``<reasoning>\\n..\\n</reasoning>\\n<answer>\\n..\\n</answer>\\n`` (no DOTALL)."""
    return 0.5 if _STRICT_FORMAT.match(text) else 0.0


def integer_answer(text: str) -> float:
    """0.5 if the ``<answer>`` text (d1's ``extract_xml_answer``) is all digits (``str.isdigit``)."""
    return 0.5 if split_answer(text).isdigit() else 0.0


def gsm8k_correctness(text: str, gold: str) -> float:
    """2.0 if the ``<answer>`` text equals the gold string (the text after ``####``, commas kept)."""
    return 2.0 if split_answer(text) == gold else 0.0


# -------------------------------------------------------------------------------------------- d1 MATH
def math_correctness(text: str, gold_answer: str) -> float:
    """2.0 if d1's boxed extraction of ``text`` is ``is_equiv`` to the gold answer, else 0.0.

    The gold is d1's ``remove_boxed(last_boxed_only_string(solution))``; docs carry the final answer, so the
    solution is represented by ``\\boxed{answer}``.
    """
    gold = d1.boxed_or_whole("\\boxed{" + gold_answer + "}")
    extracted = d1.boxed_or_whole(text)
    return 2.0 if d1.is_equiv(text if extracted is None else extracted, gold) else 0.0


def boxed_and_answer_tags_format(text: str) -> float:
    """d1's ``boxed_in_answer`` * 0.5, backspace quirk included (see the module docstring)."""
    parts = text.split("<answer>")
    has_tag = len(parts) > 1
    answer = parts[1].split("</answer>")[0] if has_tag else text
    return 0.5 * (float(has_tag) + (1.0 if _D1_BOXED_QUIRK in answer else 0.5))


# --------------------------------------------------------------------------------------- Countdown
def countdown_score(text: str, numbers: Sequence[int], target: int, rule: NumberRule) -> float:
    """1.0 / 0.1 / 0.0 as d1's ``compute_score`` (``rule="subset"`` is StableDRL's validator)."""
    answer = last_answer_tag(text)
    if answer is None:
        return 0.0
    equation = answer.strip()
    try:
        used = [int(n) for n in re.findall(r"\d+", equation)]
    except ValueError:  # more digits than int() accepts: d1's ``except`` returns False
        return 0.1
    if not uses_numbers(used, numbers, rule):
        return 0.1
    value = evaluate(equation)
    return 1.0 if value is not None and abs(value - target) < 1e-5 else 0.1


# ------------------------------------------------------------------------------------------ Sudoku
def sudoku_cells(text: str, puzzle: str, solution: str) -> float:
    """d1's ``validate_sudoku_solution`` on the digits of the last ``<answer>`` (0.0 without a tag)."""
    answer = last_answer_tag(text)
    if answer is None:
        return 0.0
    digits = "".join(ch for ch in answer.strip() if ch.isdigit())
    if not digits:
        return 0.0
    grid = digits[:16].ljust(16, "0")
    empty = [i for i in range(16) if puzzle[i] == "0"]
    return sum(grid[i] == solution[i] for i in empty) / len(empty) if empty else 0.0


# --------------------------------------------------------------------------------------- StableDRL
def anti_short_boxed(text: str, min_total_chars: int = 200, non_boxed_ratio_threshold: float = 0.85) -> float:
    """StableDRL's ``anti_short_boxed_reward``: 0.0 iff short and (a bare box or mostly box), else 1.0.

    Equivalent linear-time form: responses with >= ``min_total_chars`` non-whitespace characters return 1.0
    before any regex runs, and the regexes then see whitespace runs collapsed to one space, which changes
    neither match (every pattern element next to whitespace absorbs any amount of it) nor the counts.
    """
    stripped = text.strip()
    total = len(_WHITESPACE.sub("", stripped))
    if total >= min_total_chars:
        return 1.0
    compact = _WHITESPACE.sub(" ", stripped)
    pure_boxed = _PURE_BOXED.fullmatch(compact) is not None
    without_boxed = _WHITESPACE.sub("", _BOXED_LAZY.sub("", compact))
    ratio_non_boxed = len(without_boxed) / (total + 1e-6)
    return 0.0 if pure_boxed or ratio_non_boxed < non_boxed_ratio_threshold else 1.0


def stabledrl_math_correctness_many(texts: Sequence[str], golds: Sequence[str]) -> list[float]:
    """Per pair, +1 if ``verify(parse(gold), parse(text))`` (math-verify defaults, hard time limit), else -1.

    A batch because a rollout scored one answer at a time leaves all math-verify workers but one idle; the
    checks run concurrently, each under its own limit, and every value is what that pair alone gets (a time-out
    is -1).
    """
    return [1.0 if outcome.correct else -1.0 for outcome in math_verify_many(golds, texts, style="stabledrl")]
