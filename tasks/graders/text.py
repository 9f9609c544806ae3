"""Linear-time extraction of tagged and boxed answers from completion text.

The reference code extracts answers with regular expressions such as ``<answer>(.*?)</answer>`` (DOTALL) or
``\\boxed{(.*?)}``. Python's regex engine retries every start position, so on adversarial text (thousands of
unclosed ``<answer>`` or ``\\boxed{`` openers, 100 kB completions) these take quadratic time and cannot be
interrupted. The functions here return exactly what the reference ``findall``/``search`` calls return, using
``str.find`` scans whose total work is linear in the text length; ``tests/test_graders_text.py`` checks the
equivalence against the original patterns. :func:`final_answer` builds the harness's own rule (which answer a
completion commits to) from the same scans.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_BOX_OPENERS = ("\\boxed{", "\\fbox{")
_BRACES = re.compile(r"[{}]")
REPORT_CHARS = 500  # extracted strings are clipped in reports (d1's MATH parser may return the whole text)


def clip(text: str | None) -> str | None:
    """Shorten a diagnostic string for reports; verdicts are always computed on the full text."""
    if text is None or len(text) <= REPORT_CHARS:
        return text
    return text[:REPORT_CHARS] + f"...[{len(text) - REPORT_CHARS} more chars]"


def answer_tag_spans(text: str) -> Iterator[tuple[int, int]]:
    """Content spans of ``re.finditer(r"<answer>(.*?)</answer>", text, re.DOTALL)``, in order.

    A match starts at the first opener at or after the scan position and ends at the first closer after it;
    when an opener has no closer after it, no later opener has one either, so the scan stops.
    """
    pos = 0
    while True:
        start = text.find(ANSWER_OPEN, pos)
        if start < 0:
            return
        end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end < 0:
            return
        yield start + len(ANSWER_OPEN), end
        pos = end + len(ANSWER_CLOSE)


def first_answer_tag(text: str) -> str | None:
    """``re.search(r"<answer>(.*?)</answer>", text, re.DOTALL).group(1)``, or None (unstripped)."""
    span = next(answer_tag_spans(text), None)
    return None if span is None else text[span[0] : span[1]]


def _last_answer_tag_span(text: str) -> tuple[int, int] | None:
    """Content span of the last closed tag (spans, not text, so :func:`final_answer` can order tag and box)."""
    spans = deque(answer_tag_spans(text), maxlen=1)
    return spans[0] if spans else None


def last_answer_tag(text: str) -> str | None:
    """``re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)[-1]``, or None (unstripped)."""
    span = _last_answer_tag_span(text)
    return None if span is None else text[span[0] : span[1]]


def split_answer(text: str) -> str:
    """``text.split("<answer>")[-1].split("</answer>")[0].strip()``: d1/TRL's ``extract_xml_answer``."""
    return text.split(ANSWER_OPEN)[-1].split(ANSWER_CLOSE)[0].strip()


class _NextIndex:
    """``text.find(needle, start)`` for non-decreasing ``start`` values, scanning each character once."""

    def __init__(self, text: str, needle: str) -> None:
        self.text, self.needle = text, needle
        self.cached = -2  # nothing computed yet

    def at(self, start: int) -> int:
        if self.cached == -2 or (self.cached != -1 and self.cached < start):
            self.cached = self.text.find(self.needle, start)
        return self.cached


def boxed_nongreedy(text: str) -> list[str]:
    """``re.findall(r"\\\\boxed{(.*?)}", text)`` (no DOTALL: the content may not cross a newline).

    Each ``\\boxed{`` takes the text up to the next ``}`` unless a newline comes first, in which case the scan
    moves on to the next opener; a successful match resumes after its ``}``.
    """
    opener = "\\boxed{"
    close, newline = _NextIndex(text, "}"), _NextIndex(text, "\n")
    found, pos = [], 0
    while (start := text.find(opener, pos)) >= 0:
        content_start = start + len(opener)
        end, line_end = close.at(content_start), newline.at(content_start)
        if end >= 0 and (line_end < 0 or end < line_end):
            found.append(text[content_start:end])
            pos = end + 1
        else:
            pos = start + 1
    return found


def _last_balanced_boxed_span(text: str) -> tuple[int, int] | None:
    """Content span of the last ``\\boxed{...}`` or ``\\fbox{...}`` whose braces balance, or None.

    One left-to-right pass pairs every ``{`` with its ``}``; openers whose brace never closes are skipped, so
    an unbalanced trailing box falls back to the previous complete one.
    """
    closing: dict[int, int] = {}
    stack: list[int] = []
    for match in _BRACES.finditer(text):
        if match.group() == "{":
            stack.append(match.start())
        elif stack:
            closing[stack.pop()] = match.start()
    best: tuple[int, int, int] | None = None  # opener position, content span
    for opener in _BOX_OPENERS:
        pos = text.rfind(opener)
        while pos >= 0 and (best is None or pos > best[0]):
            brace = pos + len(opener) - 1
            if brace in closing:
                best = (pos, brace + 1, closing[brace])
                break
            pos = text.rfind(opener, 0, pos)
    return None if best is None else (best[1], best[2])


def last_balanced_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` whose braces balance, or None (see above)."""
    span = _last_balanced_boxed_span(text)
    return None if span is None else text[span[0] : span[1]]


class FinalAnswer(NamedTuple):
    """The answer a completion commits to last: the (unstripped) text, and whether it was boxed."""

    text: str
    boxed: bool


def final_answer(text: str) -> FinalAnswer | None:
    """The completion's final answer: whichever of the last balanced box and the last closed ``<answer>`` tag
    comes last, or None when it has neither.

    A model that corrects itself is graded on its last answer, not its first. A box inside the final tag is that
    tag's answer (the d1 prompts ask for ``<answer>\\boxed{..}</answer>``); a box before it is a superseded
    attempt. The text is returned as written: callers treat a blank one as "no answer", never as a reason to
    read other text.
    """
    tag, box = _last_answer_tag_span(text), _last_balanced_boxed_span(text)
    if box is not None and (tag is None or box[1] > tag[0]):  # the box closes inside or after the final tag
        return FinalAnswer(text[box[0] : box[1]], boxed=True)
    return None if tag is None else FinalAnswer(text[tag[0] : tag[1]], boxed=False)
