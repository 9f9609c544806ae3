"""The linear-time extractors return exactly what the reference regular expressions return.

Each linear scan in ``graders.text`` / ``graders.d1`` / ``rewards`` replaces a regex from d1 or StableDRL. The
regexes are the independent reference here: both are run on thousands of random strings built from the
tokens that matter (tags, braces, fences, digits, whitespace), where edge cases are dense.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from stabledrl_bench.tasks import rewards
from stabledrl_bench.tasks.graders import d1, text

TOKENS = [
    "<answer>", "</answer>", "\\boxed{", "\\boxed ", "\\fbox{", "{", "}", "\n", " ", "\t", "a", "x", "_", "=",
    "1", "2", "3", "4", "7", "12", "1234123412341234", "3412", "```", "`", "<|eot_id|>", "<|endoftext|>",
    "$", ".", "+", "-", "*", "/", "(", ")", "٣",
]  # fmt: skip


FENCE_TOKENS = ["<answer>", "</answer>", "```", "`", "12", "3", " ", "\n", "x"]  # dense in code-block cases


def random_texts(count: int, seed: int, max_tokens: int = 14, tokens: list[str] = TOKENS) -> list[str]:
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(count):
        n = int(rng.integers(0, max_tokens + 1))
        texts.append("".join(tokens[int(i)] for i in rng.integers(0, len(tokens), size=n)))
    return texts


TEXTS = random_texts(4000, seed=0)


def group_or_none(pattern: str, s: str, flags: int = 0) -> str | None:
    match = re.search(pattern, s, flags)
    return None if match is None else match.group(1)


def test_answer_tags_match_findall() -> None:
    for s in TEXTS:
        expected = re.findall(r"<answer>(.*?)</answer>", s, re.DOTALL)
        assert [s[a:b] for a, b in text.answer_tag_spans(s)] == expected
        assert text.first_answer_tag(s) == (expected[0] if expected else None)
        assert text.last_answer_tag(s) == (expected[-1] if expected else None)
        assert text.split_answer(s) == s.split("<answer>")[-1].split("</answer>")[0].strip()


def test_boxed_nongreedy_matches_findall() -> None:
    for s in TEXTS:
        assert text.boxed_nongreedy(s) == re.findall(r"\\boxed{(.*?)}", s)


def reference_balanced_boxed(s: str) -> str | None:
    """Slow: try every box opener from the right, walking braces one character at a time."""
    starts = sorted({m.start() for m in re.finditer(r"\\boxed\{|\\fbox\{", s)}, reverse=True)
    for start in starts:
        brace = s.index("{", start)
        depth = 0
        for i in range(brace, len(s)):
            depth += {"{": 1, "}": -1}.get(s[i], 0)
            if depth == 0:
                return s[brace + 1 : i]
    return None


def test_last_balanced_boxed_matches_slow_reference() -> None:
    for s in TEXTS:
        assert text.last_balanced_boxed(s) == reference_balanced_boxed(s)
    assert text.last_balanced_boxed("\\boxed{\\frac{1}{2}} and \\boxed{3") == "\\frac{1}{2}"


def reference_final_answer(s: str) -> text.FinalAnswer | None:
    """Slow: the regex's last closed tag, and the last box whose brace walk closes, compared by where they end."""
    tags = list(re.finditer(r"<answer>(.*?)</answer>", s, re.DOTALL))
    box = None
    for opener in re.finditer(r"\\boxed\{|\\fbox\{", s):
        depth = 0
        for i in range(opener.end() - 1, len(s)):
            depth += {"{": 1, "}": -1}.get(s[i], 0)
            if depth == 0:
                box = (i, s[opener.end() : i])
                break
    if box is not None and (not tags or box[0] > tags[-1].start(1)):
        return text.FinalAnswer(box[1], boxed=True)
    return text.FinalAnswer(tags[-1].group(1), boxed=False) if tags else None


def test_final_answer_matches_slow_reference() -> None:
    answer_tokens = ["<answer>", "</answer>", "\\boxed{", "\\fbox{", "{", "}", "5", " "]  # dense in tag/box mixes
    for s in [*TEXTS, *random_texts(4000, seed=4, max_tokens=12, tokens=answer_tokens)]:
        assert text.final_answer(s) == reference_final_answer(s), s
    assert text.final_answer("\\boxed{5} then <answer>6</answer>") == ("6", False)  # a later tag wins
    assert text.final_answer("<answer>\\boxed{5} or \\boxed{6}</answer> 7") == ("6", True)  # a box in the last tag
    assert text.final_answer("<answer>5</answer> then \\fbox{ }") == (" ", True)  # blank, returned as written
    assert text.final_answer("5 \\boxed{6") is None


SUDOKU_PATTERNS = [
    (d1._sudoku_code_block, r"<answer>.*?```\s*([\d\s]+)```"),
    (d1._sudoku_answer_tag, r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)"),
    (d1._sudoku_after_close, r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)"),
    (d1._sudoku_sixteen_before_close, r".*?(\d{16})\s*</answer>"),
    (d1._sudoku_sixteen_word, r"\b(\d{16})\b"),
]


@pytest.mark.parametrize(("scan", "pattern"), SUDOKU_PATTERNS, ids=[p[0].__name__ for p in SUDOKU_PATTERNS])
def test_sudoku_cascade_patterns_match_regex(scan, pattern: str) -> None:
    fences = random_texts(5000, seed=2, max_tokens=20, tokens=FENCE_TOKENS)
    texts = [*TEXTS, *random_texts(2000, seed=1, max_tokens=30), *fences]
    for s in texts:
        expected = group_or_none(pattern, s, re.DOTALL)
        got = scan(s)
        if expected is None:
            assert got is None, s
        else:  # the cascade strips the group and removes whitespace, so only non-blank content must agree
            assert got is not None and re.sub(r"\s", "", got) == re.sub(r"\s", "", expected), s


def test_expression_before_equals_matches_regex() -> None:
    for s in TEXTS:
        assert d1._expression_before_equals(s) == group_or_none(r"([0-9+\-*/() ]+)=[0-9. ]+", s)


def reference_anti_short_boxed(s: str) -> float:
    """StableDRL's ``anti_short_boxed_reward`` transcribed directly (regexes on the raw text)."""
    stripped = s.strip()
    non_ws = re.sub(r"\s+", "", stripped)
    pure = bool(re.fullmatch(r"[\s$]*\\boxed\{[^}]*\}[\s$]*[.?!'\"“”’]*\s*", stripped))
    without = re.sub(r"\s+", "", re.sub(r"\\boxed\{.*?\}", "", stripped, flags=re.DOTALL))
    ratio = len(without) / (len(non_ws) + 1e-6)
    return 0.0 if len(non_ws) < 200 and (pure or ratio < 0.85) else 1.0


def test_anti_short_boxed_matches_direct_transcription() -> None:
    texts = [*TEXTS, "\\boxed{72}", "  $\\boxed{7 2}$ .  ", "x" * 199 + "\\boxed{1}", "y" * 250, "\\boxed{1}\n\n!"]
    for s in texts:
        assert rewards.anti_short_boxed(s) == reference_anti_short_boxed(s), s
