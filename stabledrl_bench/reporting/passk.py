"""pass@k and maj@k from n sampled decodes of every problem.

Greedy accuracy says what a model does with its single most confident answer; papers on RL for (diffusion) LMs
increasingly ask what it *can* do (does RL narrow or widen the set of problems the model solves at all?). Two
numbers answer that from n samples per problem decoded at a recorded temperature:

* **pass@k** (Chen et al. 2021, arXiv:2107.03374, eq. 1): the chance that at least one of k samples is correct,
  estimated without bias from n >= k samples of which c are correct as ``1 - C(n - c, k) / C(n, k)`` (k samples
  drawn without replacement from the n), computed as a product so that no binomial coefficient overflows.
* **maj@k** (self-consistency, Wang et al. 2022, arXiv:2203.11171): the chance that the most frequent answer of k
  samples is correct. Estimated as the mean over the ``n // k`` disjoint groups of k consecutive samples (each
  group is one unbiased draw; samples are i.i.d.), so it is deterministic and needs no resampling. A sample
  without an extracted answer does not vote; a group in which nobody votes is wrong; a tie goes to the answer
  that appeared first in the group. Answers vote by their extracted text, so equal values written differently
  (``0.5`` and ``1/2``) vote apart, as in lm-eval's ``majority_vote`` filter.

Both are computed per problem and averaged over problems; pass@1 equals the mean accuracy over all samples.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# One sample: (extracted answer or None, graded correct).
Vote = tuple[str | None, bool]

METRIC_PATTERN = re.compile(r"(pass|maj)@([1-9][0-9]*)")
REPEAT_SUFFIX = re.compile(r"#r[0-9]+$")  # a repeated decode's doc_id: "<doc_id>#r<repeat>"


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``correct`` of ``n`` samples correct: 1 - C(n-c, k) / C(n, k).

    C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i): the chance that k draws without replacement miss
    every correct sample. With fewer than k wrong samples, some draw must hit a correct one (pass@k = 1).
    """
    if not 0 <= correct <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= correct <= n and 1 <= k <= n, got n={n}, correct={correct}, k={k}")
    if n - correct < k:
        return 1.0
    miss = 1.0
    for i in range(n - correct + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def majority_correct(votes: Sequence[Vote]) -> bool:
    """Whether the most frequent extracted answer among ``votes`` is a correct one (ties: first seen wins)."""
    counts: dict[str, int] = {}
    verdict: dict[str, bool] = {}
    for answer, correct in votes:
        if answer is None:
            continue
        counts[answer] = counts.get(answer, 0) + 1
        verdict[answer] = verdict.get(answer, False) or correct
    if not counts:
        return False
    winner = max(counts, key=counts.__getitem__)  # max keeps the first of equal counts: dicts keep insertion order
    return verdict[winner]


def maj_at_k(votes: Sequence[Vote], k: int) -> float:
    """maj@k of one problem: the fraction of its ``len(votes) // k`` disjoint groups of k whose majority is right."""
    if not 1 <= k <= len(votes):
        raise ValueError(f"maj@k needs 1 <= k <= n, got k={k}, n={len(votes)}")
    groups = [votes[lo : lo + k] for lo in range(0, len(votes) - k + 1, k)]
    return sum(majority_correct(group) for group in groups) / len(groups)


def k_values(n: int) -> tuple[int, ...]:
    """The k reported for n samples: every power of two below n, and n (n = 16: 1, 2, 4, 8, 16)."""
    powers = [1 << e for e in range(n.bit_length()) if 1 << e < n]
    return (*powers, n)


def per_problem(votes: Sequence[Vote], ks: Sequence[int]) -> dict[str, float]:
    """``pass@k`` and ``maj@k`` of one problem for every k in ``ks``."""
    n, correct = len(votes), sum(flag for _, flag in votes)
    return {f"pass@{k}": pass_at_k(n, correct, k) for k in ks} | {f"maj@{k}": maj_at_k(votes, k) for k in ks}


def sampled_metrics(problems: Sequence[Sequence[Vote]]) -> dict[str, float]:
    """pass@k and maj@k averaged over problems, for k in :func:`k_values` of the samples per problem.

    Every problem must have the same number of samples: a mean of pass@k over problems decoded a different
    number of times is not a pass@k of anything.
    """
    sizes = {len(votes) for votes in problems}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every problem needs the same positive number of samples, got {sorted(sizes)}")
    ks = k_values(sizes.pop())
    rows = [per_problem(votes, ks) for votes in problems]
    return {name: sum(row[name] for row in rows) / len(rows) for name in rows[0]}


def problem_id(doc_id: Any) -> str:
    """The problem a sample row decodes: its ``doc_id`` without the repeat suffix ``#r<k>``."""
    return REPEAT_SUFFIX.sub("", str(doc_id))


def votes_by_problem(samples: Sequence[Mapping[str, Any]]) -> dict[str, list[Vote]]:
    """Sample rows (``doc_id, extracted, correct``) grouped by problem, each group in the rows' order."""
    grouped: dict[str, list[Vote]] = {}
    for sample in samples:
        grouped.setdefault(problem_id(sample["doc_id"]), []).append((sample["extracted"], bool(sample["correct"])))
    return grouped
