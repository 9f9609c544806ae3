"""What GSM8K, MATH500 and AIME share: prompts of each protocol, gold completions, rewards, grading.

Subclasses say where the question, the final answer and a worked solution live in a doc, which d1 system
prompt and d1 parser (``gsm8k`` or ``math``) apply, and how d1's training prompt and reward look for them.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from .base import GradeResult, RewardResult, Task, require, tagged_completion
from .graders.math_answers import D1Kind, grade_math_answers
from .rewards import anti_short_boxed, stabledrl_math_correctness_many

# d1 eval/gsm8k.py (note the space before the first newline).
D1_GSM8K_SYSTEM_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final answer "
    "in a \\boxed{}. \nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n"
    "<answer>\n\\boxed{...}\n</answer>"
)
# d1 eval/math500.py (note the stray quote and space after the closing tag).
D1_MATH_SYSTEM_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final answer "
    "in a \\boxed{}.\nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n"
    '<answer>\n\\boxed{...}\n</answer>" \n'
)
# d1 diffu-grpo/data_utils.py SYSTEM_PROMPT, used by every d1 training prompt.
D1_TRAIN_SYSTEM_PROMPT = (
    "\nRespond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n"
)
# StableDRL dataloaders/math.py collate_fn_mixed: a raw string, so the backslashes really are doubled.
STABLEDRL_MATH_INSTRUCTION = r"(Please put the final answer in \\boxed{} tag, i.e. $\\boxed{answer here}$)"
# StableDRL dataloaders/collate_fn_math.py collate_fn_math, which its evaluation script math_metrics.py uses for
# MATH: the same instruction with single backslashes (GSM8K questions go in bare: collate_fn_gsm8k).
STABLEDRL_EVAL_MATH_INSTRUCTION = r"(Please put the final answer in \boxed{} tag, i.e. $\boxed{answer here}$)"
# dLLM-RL sample/trado_sample.py and sdar_sample.py, the "cot prompt" of TraceRL's math evaluation (the chat
# template around it is SDAR's own, so the harness applies the model's template to this user message).
TRACERL_MATH_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
GENERIC_REASONING = "Work through the problem step by step, checking each step, to reach the final answer."


class MathTask(Task):
    """A task whose answer is a single mathematical value, graded by math-verify and by d1's parser."""

    d1_kind: ClassVar[D1Kind]
    d1_system_prompt: ClassVar[str]

    def __init__(self, timeout_s: float | None = None) -> None:
        """``timeout_s``: hard math-verify limit per graded answer (default: the grader's, 1.5 s)."""
        self.timeout_s = timeout_s

    @abstractmethod
    def question(self, doc: Mapping[str, Any]) -> str:
        """The problem statement."""

    @abstractmethod
    def gold(self, doc: Mapping[str, Any]) -> str:
        """The final answer, normalised as the graders expect it (validated; :class:`UserError` if bad)."""

    def worked_solution(self, doc: Mapping[str, Any]) -> str | None:
        """The doc's own worked solution (``solution``), boxes removed so the final answer is the only box; None
        where the split carries none (MATH's training splits)."""
        solution = doc.get("solution") or ""
        return solution.replace("\\boxed", "").replace("\\fbox", "").strip() or None

    def reasoning(self, doc: Mapping[str, Any]) -> str:
        """A worked solution for gold completions: the doc's own (:meth:`worked_solution`), else a generic line."""
        return self.worked_solution(doc) or GENERIC_REASONING

    @abstractmethod
    def d1_train_message(self, question: str) -> str:
        """d1's RL training user message for ``question``."""

    @abstractmethod
    def d1_train_answer(self, doc: Mapping[str, Any]) -> str:
        """What a perfect answer tag holds under d1's training prompt."""

    def stabledrl_gold(self, doc: Mapping[str, Any]) -> str:
        """The gold text StableDRL passes to ``math_verify.parse`` (for MATH: a solution holding the box)."""
        return "\\boxed{" + self.gold(doc) + "}"

    def user_message(self, doc: Mapping[str, Any], protocol: str) -> str:
        question = self.question(doc)
        if protocol == "d1":
            return self.d1_system_prompt + "\n\n" + question
        if protocol == "d1_train":
            return self.d1_train_message(question)
        if protocol == "stabledrl":
            return question + STABLEDRL_MATH_INSTRUCTION
        if protocol == "stabledrl_eval":
            return self.stabledrl_eval_message(question)
        if protocol == "tracerl":
            return question + TRACERL_MATH_INSTRUCTION
        return question  # tiny

    def stabledrl_eval_message(self, question: str) -> str:
        """What StableDRL's ``math_metrics.py`` feeds the model for ``question`` (MATH's collate function)."""
        return question + STABLEDRL_EVAL_MATH_INSTRUCTION

    def _target(self, doc: Mapping[str, Any], protocol: str) -> str:
        gold = self.gold(doc)
        if protocol == "stabledrl":
            return f"{self.reasoning(doc)}\n\nThe final answer is $\\boxed{{{gold}}}$."
        if protocol == "d1_train":
            return tagged_completion(self.reasoning(doc), self.d1_train_answer(doc), protocol)
        answer = gold if protocol == "tiny" else "\\boxed{" + gold + "}"
        return tagged_completion(self.reasoning(doc), answer, protocol)

    def stabledrl_reward(self, completion: str, doc: Mapping[str, Any]) -> RewardResult:
        return self.stabledrl_rewards([completion], [doc])[0]

    def stabledrl_rewards(self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[RewardResult]:
        """StableDRL's rewards with the whole batch's math-verify checks at once."""
        correctness = stabledrl_math_correctness_many(completions, [self.stabledrl_gold(doc) for doc in docs])
        return [
            RewardResult.of(correctness=value, anti_short_boxed=anti_short_boxed(c))
            for c, value in zip(completions, correctness, strict=True)
        ]

    def grade(self, completion: str, doc: Mapping[str, Any]) -> GradeResult:
        """``correct`` = math-verify's verdict; ``details["d1"]`` = d1's (see :mod:`.graders.math_answers`)."""
        return self.grade_many([completion], [doc])[0]

    def _grade_many(self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[GradeResult]:
        golds = [self.gold(doc) for doc in docs]
        return grade_math_answers(completions, golds, self.d1_kind, timeout_s=self.timeout_s)


def answer_field(doc: Mapping[str, Any]) -> str:
    """``doc["answer"]`` (a string or an integer) as a stripped string."""
    return str(require(doc, "answer", (str, int), "a string or an integer")).strip()


def question_field(doc: Mapping[str, Any], key: str) -> str:
    return require(doc, key, str, "a string")


def strip_calculator_annotations(solution: str) -> str:
    """GSM8K worked solutions mark calculator calls as ``<<48/2=24>>``; drop them."""
    return re.sub(r"<<[^<>]*>>", "", solution)
