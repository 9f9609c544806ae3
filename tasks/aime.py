"""AIME 2024 and AIME 2025 (30 problems each; integer answers 0-999).

AIME 2024 is read from ``aime2024_test.jsonl`` (the Qwen2.5-Math copy, official answers; the TraDo-format
copy has a wrong label at index 22, 480 instead of 197, and is not shipped). Gold answers are compared
numerically: zero-padded labels such as ``"025"`` are normalised to ``"25"``. Prompts, parsers and rewards are
MATH500's (d1 has no AIME protocol of its own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from .base import read_data_file
from .math500 import MathFamilyTask
from .math_common import answer_field


def canonical_integer(answer: str) -> str:
    """``"025"`` -> ``"25"``; non-integer strings are returned unchanged."""
    return str(int(answer)) if answer.isascii() and answer.isdigit() else answer


class _AimeTask(MathFamilyTask):
    splits = ("test",)
    file: ClassVar[str]

    def gold(self, doc: Mapping[str, Any]) -> str:
        return canonical_integer(answer_field(doc))

    def _read(self, split: str) -> list[dict[str, Any]]:
        return [
            {
                "problem": r["problem"],
                "answer": canonical_integer(str(r["answer"]).strip()),
                "solution": r.get("solution") or "",
                "source_id": str(r["id"]),
                "url": r.get("url") or "",
            }
            for r in read_data_file(self.file)
        ]


class Aime24Task(_AimeTask):
    """AIME 2024: 30 competition problems with integer answers 0-999 (evaluation only)."""

    name = "aime24"
    label = "AIME 2024"
    file = "aime/aime2024_test.jsonl"


class Aime25Task(_AimeTask):
    """AIME 2025: 30 competition problems with integer answers 0-999 (evaluation only)."""

    name = "aime25"
    label = "AIME 2025"
    file = "aime/aime2025_test.jsonl"
