"""GSM8K (Cobbe et al., 2021): grade-school word problems with an integer answer after ``####``.

Splits: ``train`` (7,473) and ``test`` (1,319), the OpenAI release (``data/gsm8k``). The gold answer of a doc
is ``answer`` (the worked solution ending in ``#### N``) or a bare number; ``gold`` holds N normalised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import RewardResult, read_data_file, require
from .graders.math_answers import gsm8k_gold
from .math_common import (
    D1_GSM8K_SYSTEM_PROMPT,
    D1_TRAIN_SYSTEM_PROMPT,
    MathTask,
    question_field,
    strip_calculator_annotations,
)
from .rewards import gsm8k_correctness, integer_answer, soft_format, strict_format, xmlcount

_FILES = {"train": "gsm8k/gsm8k_train.jsonl", "test": "gsm8k/gsm8k_test.jsonl"}


def d1_gold_string(answer: str | int) -> str:
    """The gold of d1's GSM8K correctness reward: the raw text after ``####`` (commas kept), stripped."""
    text = str(answer)
    return text.split("####")[1].strip() if "####" in text else text.strip()


class GSM8KTask(MathTask):
    """GSM8K: grade-school word problems with a numeric answer."""

    name = "gsm8k"
    label = "GSM8K"
    splits = ("train", "test")
    d1_kind = "gsm8k"
    d1_system_prompt = D1_GSM8K_SYSTEM_PROMPT

    def _read(self, split: str) -> list[dict[str, Any]]:
        rows = read_data_file(_FILES[split])
        return [{"question": r["question"], "answer": r["answer"], "gold": gsm8k_gold(r["answer"])} for r in rows]

    def question(self, doc: Mapping[str, Any]) -> str:
        return question_field(doc, "question")

    def gold(self, doc: Mapping[str, Any]) -> str:
        return gsm8k_gold(require(doc, "answer", (str, int, float), "a solution ending in '#### N', or N"))

    def worked_solution(self, doc: Mapping[str, Any]) -> str | None:
        """The dataset's worked solution (text before ``####``) without calculator annotations."""
        text = str(doc.get("answer", ""))
        steps = strip_calculator_annotations(text.split("####")[0]).strip() if "####" in text else ""
        return steps or super().worked_solution(doc)

    def d1_train_message(self, question: str) -> str:
        return D1_TRAIN_SYSTEM_PROMPT + "\n\n" + question

    def stabledrl_eval_message(self, question: str) -> str:
        """StableDRL's ``math_metrics.py`` feeds GSM8K questions bare (``collate_fn_gsm8k``)."""
        return question

    def d1_train_answer(self, doc: Mapping[str, Any]) -> str:
        return d1_gold_string(doc["answer"])

    def d1_reward(self, completion: str, doc: Mapping[str, Any]) -> RewardResult:
        self.gold(doc)  # validates the gold field
        return RewardResult.of(
            xmlcount=xmlcount(completion),
            soft_format=soft_format(completion),
            strict_format=strict_format(completion),
            int=integer_answer(completion),
            correctness=gsm8k_correctness(completion, d1_gold_string(doc["answer"])),
        )

    def stabledrl_gold(self, doc: Mapping[str, Any]) -> str:
        """StableDRL's GSM8K gold: ``answer.split('####')[-1].strip()``."""
        self.gold(doc)
        return str(doc["answer"]).split("####")[-1].strip()
