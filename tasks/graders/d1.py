"""Answer parsers that reproduce d1's evaluation (``dllm-reasoning/d1: eval/parse_and_get_acc.py``,
``eval/parser_helper.py``; the same helpers back its MATH reward in ``diffu-grpo/math500_utils.py``).

Published LLaDA/d1/SPG/StableDRL accuracies were computed with these parsers, quirks included, so a model must be
scored by them to be comparable (docs/protocols.md#d1). Reproduced behaviour, deliberately:

* GSM8K: the *first* ``\\boxed{...}`` (non-greedy, single line) whose content is not dots and parses as a
  float, else the first number in it; otherwise the *last* number inside the *first* ``<answer>...</answer>``.
  Numbers like ``1,000`` read as ``1`` (d1's number regex has no thousands separators).
* MATH: ``remove_boxed(last_boxed_only_string(text))``. Without any box ``last_boxed_only_string`` returns the
  whole text (so the ``<answer>`` fallback only triggers for an unbalanced box); ``\\boxed `` with a space takes
  everything after the last one up to ``$``; ``\\fbox{..}`` is never unwrapped. Comparison is Hendrycks
  ``strip_string`` equality, falling back to raw equality when normalisation raises (as d1's ``is_equiv``).
* Countdown: the same boxed extraction (whole text without a box), ``\\div \\times \\cdot`` replaced, the
  first ``expr = number`` reduced to ``expr``, all integers must equal the given numbers as a multiset.
* Sudoku: d1's five-pattern regex cascade, whitespace removed.

Differences, both documented where they apply: every regex that is super-linear on adversarial text is
replaced by an equivalent linear scan (:mod:`.text`), and Countdown expressions are evaluated by the safe
evaluator of :mod:`.arithmetic` instead of ``eval`` (``**`` and ``//``, which d1's ``eval`` would accept, are
rejected).
"""

from __future__ import annotations

import re

from .arithmetic import evaluate, uses_numbers
from .text import boxed_nongreedy, first_answer_tag

_NUMBER = re.compile(r"-?\d+\.?\d*")  # d1's number pattern (linear: no nested ambiguity)
_EOT_MARKERS = ("<|eot_id|>", "<|endoftext|>")


class D1ParseError(Exception):
    """Raised where d1's helpers raise (a failed ``assert``, an index or ``int()`` error)."""


# --------------------------------------------------------------------------------------- boxed helpers
def last_boxed_only_string(text: str) -> str | None:
    """d1's ``last_boxed_only_string``: the last ``\\boxed{..}``/``\\fbox{..}``, the whole text if none, None if
    the last box never closes. A ``"\\boxed "`` (with a space) anywhere wins: ``"\\boxed " + rest-up-to-$``."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return text
    depth = 0
    for brace in re.finditer(r"[{}]", text[start:]):
        depth += 1 if brace.group() == "{" else -1
        if brace.group() == "}" and depth == 0:
            return text[start : start + brace.end()]
    return None


def remove_boxed(s: str) -> str:
    """d1's ``remove_boxed``: unwrap ``\\boxed{..}`` or a leading ``\\boxed ``; anything else is returned as is,
    except text containing ``"\\boxed "`` elsewhere, where d1's ``assert`` fails (:class:`D1ParseError`)."""
    if "\\boxed " in s:
        if not s.startswith("\\boxed "):
            raise D1ParseError("remove_boxed: '\\boxed ' not at the start")
        return s[len("\\boxed ") :]
    if s.startswith("\\boxed{") and s.endswith("}"):
        return s[len("\\boxed{") : -1]
    return s


def boxed_or_whole(text: str) -> str | None:
    """``remove_boxed(last_boxed_only_string(text))`` with d1's ``try/except`` turned into None."""
    boxed = last_boxed_only_string(text)
    if boxed is None:
        return None
    try:
        return remove_boxed(boxed)
    except D1ParseError:
        return None


# ------------------------------------------------------------------------------- Hendrycks normalisation
def _remove_right_units(s: str) -> str:
    if "\\text{ " in s:
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise D1ParseError("more than one '\\text{ '")
        return parts[0]
    return s


def _fix_sqrt(s: str) -> str:
    if "\\sqrt" not in s:
        return s
    parts = s.split("\\sqrt")
    out = parts[0]
    for part in parts[1:]:
        if not part:
            raise D1ParseError("'\\sqrt' at the end")
        out += "\\sqrt" + part if part[0] == "{" else "\\sqrt{" + part[0] + "}" + part[1:]
    return out


def _fix_fracs(s: str) -> str:
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if not part:
            raise D1ParseError("'\\frac' at the end")
        if part[0] == "{":
            out += part
        elif len(part) < 2:
            return s
        elif part[1] != "{":
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            out += "{" + part[0] + "}" + part[1] + part[2:]
    return out


def _fix_a_slash_b(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError as exc:  # d1 only catches its AssertionError here
        raise D1ParseError("non-integer a/b") from exc
    return "\\frac{" + str(a) + "}{" + str(b) + "}" if s == f"{a}/{b}" else s


def strip_string(s: str) -> str:
    """Hendrycks MATH normalisation as in d1 (newlines, ``\\!``, ``tfrac/dfrac``, ``\\left/\\right``, degrees,
    ``\\$``, right units, ``\\%``, leading ``.``, short ``k =`` prefix, ``\\sqrt3``, spaces, ``\\frac12``,
    ``0.5``, integer ``a/b``). Raises :class:`D1ParseError` where d1's version raises."""
    for old, new in (
        ("\n", ""),
        ("\\!", ""),
        ("\\\\", "\\"),
        ("tfrac", "frac"),
        ("dfrac", "frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\$", ""),
    ):
        s = s.replace(old, new)
    s = _remove_right_units(s)
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _fix_fracs(_fix_sqrt(s).replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def is_equiv(prediction: str | None, gold: str | None) -> bool:
    """d1's ``is_equiv`` on strings: ``strip_string`` equality, raw equality if normalisation raises."""
    if prediction is None or gold is None:
        return prediction is None and gold is None
    try:
        return strip_string(prediction) == strip_string(gold)
    except D1ParseError:
        return prediction == gold


# --------------------------------------------------------------------------------------- task parsers
def _float_or_first(text: str, pick: int) -> float | None:
    """``float(text)``, else ``float(numbers[pick])`` for d1's number pattern, else None."""
    try:
        return float(text)
    except ValueError:
        numbers = _NUMBER.findall(text)
        return float(numbers[pick]) if numbers else None


def extract_gsm8k(text: str) -> float | None:
    """d1's GSM8K prediction: first usable ``\\boxed{}``, else the first ``<answer>`` tag's last number."""
    for content in boxed_nongreedy(text):
        content = content.strip()
        if content and set(content) != {"."}:
            value = _float_or_first(content, 0)
            if value is not None:
                return value
    answer = first_answer_tag(text)
    if answer is not None and answer.strip():
        return _float_or_first(answer.strip(), -1)
    return None


def extract_math(text: str) -> str | None:
    """d1's MATH prediction: ``remove_boxed(last_boxed_only_string(text))``, else the first ``<answer>`` tag."""
    parsed = boxed_or_whole(text)
    if not parsed:
        answer = first_answer_tag(text)
        if answer is not None:
            parsed = answer.strip()
    return parsed


def _expression_before_equals(equation: str) -> str | None:
    """``re.search(r"([0-9+\\-*/() ]+)=[0-9. ]+", equation).group(1)`` by one scan over maximal runs of the
    expression alphabet: a match starts a run whose next characters are ``=`` and one of ``[0-9. ]``."""
    alphabet, after = set("0123456789+-*/() "), set("0123456789. ")
    i, n = 0, len(equation)
    while i < n:
        if equation[i] not in alphabet:
            i += 1
            continue
        j = i
        while j < n and equation[j] in alphabet:
            j += 1
        if j + 1 < n and equation[j] == "=" and equation[j + 1] in after:
            return equation[i:j]
        i = j
    return None


def extract_countdown(text: str) -> str:
    """d1's Countdown expression: boxed (or whole) text, ``\\div \\times \\cdot`` replaced, ``= N`` removed."""
    equation = boxed_or_whole(text)
    if equation is None:  # d1's except branch
        answer = first_answer_tag(text)
        equation = answer.strip() if answer is not None else text
    equation = equation.replace("\\div", "/").replace("\\times", "*").replace("\\cdot", "*")
    before = _expression_before_equals(equation)
    return before.strip() if before is not None else equation


def countdown_correct(text: str, numbers: list[int], target: int) -> tuple[bool, str]:
    """d1's verdict: the integers of the expression are exactly ``numbers`` and it evaluates within 1e-5."""
    equation = extract_countdown(text)
    integers = _integers_d1(equation)
    if integers is None or not uses_numbers(integers, numbers, "exact"):
        return False, equation
    value = evaluate(equation)
    return value is not None and abs(value - target) < 1e-5, equation


def _integers_d1(equation: str) -> list[int] | None:
    """``[int(n) for n in re.findall(r"\\d+", equation)]`` (Unicode digits, as ``\\d``); None if ``int`` fails."""
    runs, current = [], []
    for ch in equation:
        if ch.isdecimal():
            current.append(ch)
        elif current:
            runs.append("".join(current))
            current = []
    if current:
        runs.append("".join(current))
    try:
        return [int(run) for run in runs]
    except ValueError:  # more digits than int() accepts
        return None


# --------------------------------------------------------------------------------------------- sudoku
def _sudoku_code_block(text: str) -> str | None:
    """``<answer>.*?```\\s*([\\d\\s]+)```` (DOTALL): after the first ``<answer>``, the first triple backtick
    followed by a non-empty run of digits/whitespace that is closed by another triple backtick."""
    opener = text.find("<answer>")
    if opener < 0:
        return None
    fence = text.find("```", opener + len("<answer>"))
    while fence >= 0:
        start = end = fence + 3
        while end < len(text) and (text[end].isdecimal() or text[end].isspace()):
            end += 1
        if end > start and text.startswith("```", end):
            return text[start:end]
        fence = text.find("```", fence + 1)
    return None


def _sudoku_answer_tag(text: str) -> str | None:
    """``<answer>(.*?)(?:<|eot_id|>|<|endoftext|>|</answer>)`` (DOTALL), first ``<answer>``, earliest end."""
    opener = text.find("<answer>")
    if opener < 0:
        return None
    start = opener + len("<answer>")
    ends = [e for marker in (*_EOT_MARKERS, "</answer>") if (e := text.find(marker, start)) >= 0]
    return text[start : min(ends)] if ends else None


def _sudoku_after_close(text: str) -> str | None:
    """``</answer>\\s*(.*?)(?:<|eot_id|>|<|endoftext|>|$)`` (DOTALL); ``$`` also matches before a final newline."""
    closer = text.find("</answer>")
    if closer < 0:
        return None
    start = closer + len("</answer>")
    while start < len(text) and text[start].isspace():
        start += 1
    dollar = len(text) - 1 if text.endswith("\n") and len(text) - 1 >= start else len(text)
    ends = [e for marker in _EOT_MARKERS if (e := text.find(marker, start)) >= 0]
    return text[start : min([*ends, dollar])]


def _decimal_runs(text: str, word: bool) -> list[tuple[int, int]]:
    """Maximal runs of decimal digits (``word=False``) or of ``\\w`` characters (``word=True``)."""
    runs, i, n = [], 0, len(text)
    inside = (lambda c: c.isalnum() or c == "_") if word else str.isdecimal
    while i < n:
        if inside(text[i]):
            j = i
            while j < n and inside(text[j]):
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    return runs


def _sudoku_sixteen_before_close(text: str) -> str | None:
    """``.*?(\\d{16})\\s*</answer>`` (DOTALL): the first 16 digits that end a digit run and are followed by
    optional whitespace and ``</answer>``."""
    for start, end in _decimal_runs(text, word=False):
        if end - start >= 16:
            after = end
            while after < len(text) and text[after].isspace():
                after += 1
            if text.startswith("</answer>", after):
                return text[end - 16 : end]
    return None


def _sudoku_sixteen_word(text: str) -> str | None:
    """``\\b(\\d{16})\\b``: the first ``\\w`` run that is exactly 16 decimal digits."""
    for start, end in _decimal_runs(text, word=True):
        if end - start == 16 and text[start:end].isdecimal():
            return text[start:end]
    return None


_SUDOKU_CASCADE = (
    _sudoku_code_block,
    _sudoku_answer_tag,
    _sudoku_after_close,
    _sudoku_sixteen_before_close,
    _sudoku_sixteen_word,
)


def sudoku_answer_text(text: str) -> str | None:
    """The group of the first cascade pattern that is not blank, as written (None if none)."""
    for pattern in _SUDOKU_CASCADE:
        group = pattern(text)
        if group is not None and group.strip():
            return group
    return None


def extract_sudoku(text: str) -> str:
    """d1's Sudoku answer: :func:`sudoku_answer_text` with whitespace removed ("" if none)."""
    group = sudoku_answer_text(text)
    return "" if group is None else "".join(ch for ch in group if not ch.isspace())
