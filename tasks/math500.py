"""MATH500 (Lightman et al., 2023; the prm800k 500-problem test split of Hendrycks MATH) and MATH training data.

Splits:

* ``test``: the 500 problems (``answer`` is the final answer string, ``solution`` the worked solution);
* ``train``: Hendrycks MATH train with final answers only (7,474 rows, as used by DeepScaleR; stand-in for d1's
  12k prm800k train split, which is not available offline);
* ``train_l3to5``: TraceRL's MATH training set, levels 3-5 (8,523 rows).

Neither training file overlaps the test problems (``data/README.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import RewardResult, read_data_file
from .math_common import D1_MATH_SYSTEM_PROMPT, D1_TRAIN_SYSTEM_PROMPT, MathTask, answer_field, question_field
from .rewards import boxed_and_answer_tags_format, math_correctness

# d1 diffu-grpo/data_utils.py get_math_questions: the generic format prompt, then this instruction.
D1_TRAIN_MATH_INSTRUCTION = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. "
    "Wrap the final answer in a \\boxed{}. \n\n"
)


def _math_row(problem: str, answer: str, solution: str, subject: str, level: int, unique_id: str) -> dict[str, Any]:
    return {
        "problem": problem,
        "answer": answer,
        "solution": solution,
        "subject": subject,
        "level": level,
        "unique_id": unique_id,
    }


class MathFamilyTask(MathTask):
    """Competition mathematics with free-form LaTeX answers: d1's ``math`` parser and rewards."""

    d1_kind = "math"
    d1_system_prompt = D1_MATH_SYSTEM_PROMPT

    def question(self, doc: Mapping[str, Any]) -> str:
        return question_field(doc, "problem")

    def gold(self, doc: Mapping[str, Any]) -> str:
        return answer_field(doc)

    def d1_train_message(self, question: str) -> str:
        return D1_TRAIN_SYSTEM_PROMPT + "\n\n" + D1_TRAIN_MATH_INSTRUCTION + question

    def d1_train_answer(self, doc: Mapping[str, Any]) -> str:
        return "\\boxed{" + self.gold(doc) + "}"

    def d1_reward(self, completion: str, doc: Mapping[str, Any]) -> RewardResult:
        return RewardResult.of(
            correctness=math_correctness(completion, self.gold(doc)),
            boxed_and_answer_tags_format=boxed_and_answer_tags_format(completion),
        )


class Math500Task(MathFamilyTask):
    """MATH500: competition mathematics with free-form LaTeX answers (the 500-problem test subset)."""

    name = "math500"
    label = "MATH500"
    splits = ("train", "train_l3to5", "test")

    def _read(self, split: str) -> list[dict[str, Any]]:
        if split == "test":
            rows = read_data_file("math/math500_test.jsonl")
            return [
                _math_row(r["problem"], r["answer"], r["solution"], r["subject"], r["level"], r["unique_id"])
                for r in rows
            ]
        if split == "train":
            rows = read_data_file("math/math_train_hendrycks_answers.json")
            return [_math_row(r["problem"], r["answer"], "", r["type"], int(r["difficulty"]), "") for r in rows]
        rows = read_data_file("math/genverse_MATH_train_l3to5.json")
        return [_math_row(r["question"], r["ground_truth_answer"], "", r["subject"], int(r["level"]), "") for r in rows]
