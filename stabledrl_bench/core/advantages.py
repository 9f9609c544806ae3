"""Group-relative advantages, as each method's official code computes them (pure functions of tensors).

A *group* is the set of completions sampled for one prompt. Groups are identified by ``group_ids`` [B]: any
integers, in any order, not necessarily contiguous. Of the paper's five methods only TraceRL divides by a std
(docs/methods.md#side-by-side); of the further ones JustGRPO and BGPO (through verl) do, and the names say which is
which:

=================  =============================  =========================================  ==================
rule (registered)  function                       A_i                                        used by
=================  =============================  =========================================  ==================
``group_mean``     ``group_mean_advantage``       r_i - mean_{j in g} r_j                    d1/GRPO, SPG,
                                                                                             StableDRL
``leave_one_out``  ``leave_one_out_advantage``    r_i - mean_{j in g, j != i} r_j            ESPO, GDSD,
                                                                                             coupled-GRPO
``group_zscore``   ``group_zscore_advantage``     (c_i - mean_g c) / std_g c (population)    TraceRL / TraDo
``reward_zscore``  ``reward_zscore_advantage``    (r_i - mean_g r) / (std_g r + epsilon),    JustGRPO, BGPO
                                                  sample std (Bessel's n - 1)
=================  =============================  =========================================  ==================

A baseline names its rule (``Baseline.advantage``); the rules share one signature,
``rule(rewards, group_ids, correct, **options) -> (advantages [B], keep [B] bool)``, and live in the
``ADVANTAGES`` registry, which packages extend through the ``stabledrl_bench.advantages`` entry-point group, as
verl's ``core_algos.py`` registers its advantage estimators by name.

A singleton group has advantage 0 under every rule: there is nothing to compare against (for leave-one-out
the mean over the empty set is undefined; 0 is the value that makes the sample contribute no gradient). So every
rule here declares ``min_group_size = 2`` (:func:`min_group_size`), and a run whose groups are smaller is refused
before it starts: it would train for hours on advantages that are all 0. A registered rule may declare its own.

``compute_dtype`` is the one precision rule of every advantage rule here and of every loss in ``baselines/``
(which import it from this module, the lowest one they all share).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from stabledrl_bench.core.registry import Registry
from stabledrl_bench.errors import UserError


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """The dtype an advantage rule or loss computes in and returns: promote_types(input dtypes..., float32).

    Half-precision inputs (bf16 / fp16) are upcast to float32, as the official trainers do before their losses;
    float32 stays float32 and float64 stays float64, so a caller never gets less precision than it passed in, and
    integer or bool inputs (rewards, correctness flags) give float32. ``None`` entries (optional inputs) are skipped.
    """
    dtype = torch.float32
    for tensor in tensors:
        if tensor is not None:
            dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids [B] to dense indices 0..G-1 (``index`` [B]) and return ``(index, G)``."""
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must be 1-D [B], got shape {tuple(group_ids.shape)}")
    _, index = torch.unique(group_ids, return_inverse=True)
    return index, int(index.max().item()) + 1 if index.numel() else 0


def group_reduce(values: torch.Tensor, index: torch.Tensor, num_groups: int, reduce: str = "sum") -> torch.Tensor:
    """Per-group ``sum`` / ``amax`` / ``mean`` of ``values`` [B] (differentiable), shaped [G]."""
    out = values.new_zeros(num_groups)
    return out.scatter_reduce(0, index, values, reduce=reduce, include_self=False)


def group_log_softmax(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """log softmax of ``values`` [B] within each group (``group_ids`` [B]), computed around each group's max:
    StableDRL's self-normalised log-weights, wd1's advantage weights."""
    index, num_groups = group_index(group_ids)
    top = group_reduce(values, index, num_groups, "amax")[index]
    return values - top - group_reduce(torch.exp(values - top), index, num_groups, "sum").log()[index]


def _check(values: torch.Tensor, group_ids: torch.Tensor, what: str) -> None:
    if values.dim() != 1 or values.shape != group_ids.shape:
        raise ValueError(
            f"{what} [B] and group_ids [B] must be 1-D of equal length, got {tuple(values.shape)} "
            f"and {tuple(group_ids.shape)}"
        )


def group_mean_advantage(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """A_i = r_i - (1/G) sum_{j in g(i)} r_j  (d1, SPG, StableDRL: no std division), in ``compute_dtype``."""
    _check(rewards, group_ids, "rewards")
    rewards = rewards.to(compute_dtype(rewards))
    index, num_groups = group_index(group_ids)
    mean = group_reduce(rewards, index, num_groups, "mean")
    return rewards - mean[index]


def leave_one_out_advantage(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """A_i = r_i - (S_g - r_i) / (G - 1), S_g the group's sum (ESPO, coupled-GRPO, RLOO); 0 for a singleton group.

    Evaluated in the official codes' order (``ML-GSAI/ESPO: espo/espo_trainer.py`` lines 706-710,
    ``apple/ml-diffucoder: src/open_r1/coupled_grpo.py`` lines 557-561: ``baseline = (sum_group - rewards) /
    (num_generations - 1)``, then ``rewards - baseline``), so the advantage is theirs to the last bit for the same
    group sum; algebraically it is (G r_i - S_g) / (G - 1), which rounds differently. In ``compute_dtype``.
    """
    _check(rewards, group_ids, "rewards")
    rewards = rewards.to(compute_dtype(rewards))
    index, num_groups = group_index(group_ids)
    total = group_reduce(rewards, index, num_groups, "sum")[index]
    size = torch.bincount(index, minlength=num_groups)[index].to(rewards.dtype)
    baseline = (total - rewards) / (size - 1).clamp(min=1)
    return torch.where(size > 1, rewards - baseline, torch.zeros_like(rewards))


def reward_zscore_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, epsilon: float = 1e-4) -> torch.Tensor:
    """A_i = (r_i - mean_g r) / (std_g r + epsilon), std with Bessel's correction; 0 for a singleton group.

    Textbook GRPO as TRL computes it (``rewards.view(-1, G).std(dim=1)``, which is the n - 1 std, and ``+ 1e-4``):
    JustGRPO (``LeapLabTHU/JustGRPO: grpo.py: compute_group_advantages``, epsilon 1e-4) and verl's GRPO estimator
    that BGPO trains with (``yjyddq/DARE: verl/trainer/ppo/core_algos.py: compute_grpo_outcome_advantage``,
    epsilon 1e-6). A group whose rewards are all equal gets 0, as (r - mean) is 0 there. A singleton group has no
    sample std (verl gives it (r - 0) / (1 + epsilon), TRL NaN): 0 here, the module's rule. In ``compute_dtype``.
    """
    _check(rewards, group_ids, "rewards")
    rewards = rewards.to(compute_dtype(rewards))
    index, num_groups = group_index(group_ids)
    size = torch.bincount(index, minlength=num_groups)[index].to(rewards.dtype)
    centred = rewards - group_reduce(rewards, index, num_groups, "mean")[index]
    variance = group_reduce(centred**2, index, num_groups, "sum")[index] / (size - 1).clamp(min=1)
    return torch.where(size > 1, centred / (variance.sqrt() + epsilon), torch.zeros_like(rewards))


def group_zscore_advantage(
    correct: torch.Tensor, group_ids: torch.Tensor, keep_range: tuple[float, float] = (0.2, 0.8)
) -> tuple[torch.Tensor, torch.Tensor]:
    """TraceRL (dLLM-RL ``reward/rl_reward.py``): z-score of binary correctness, plus its accuracy filter.

    A_i = (c_i - p_g) / sigma_g with p_g the group accuracy and sigma_g the *population* std
    (sqrt(p_g (1 - p_g)) for 0/1 values); A = 0 for every member when sigma_g = 0 (all equal).
    ``keep`` [B] bool is False for every member of a group whose accuracy lies outside
    ``[keep_range[0], keep_range[1]]`` (bounds inclusive, as ``p > 0.8 or p < 0.2`` drops a group).
    The accuracy is compared in float64 so that e.g. 1/5 == 0.2 exactly as in the Python original; the
    advantages are returned in ``compute_dtype(correct)`` (float32 for bool or 0/1 flags, float64 stays float64).
    """
    _check(correct, group_ids, "correct")
    c = correct.to(torch.float64)
    if not bool(((c == 0) | (c == 1)).all()):
        raise ValueError("correct must be binary (bool or 0/1 values)")
    low, high = keep_range
    index, num_groups = group_index(group_ids)
    p = group_reduce(c, index, num_groups, "mean")[index]
    std = group_reduce((c - p) ** 2, index, num_groups, "mean").sqrt()[index]
    adv = torch.where(std > 0, (c - p) / std.clamp(min=torch.finfo(c.dtype).tiny), torch.zeros_like(c))
    keep = (p >= low) & (p <= high)
    return adv.to(compute_dtype(correct)), keep


# ====================================================================================== registered rules
AdvantageRule = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _callable(name: str, rule: AdvantageRule) -> AdvantageRule:
    if not callable(rule):
        raise TypeError(f"advantage rule {name!r} must be callable, got {rule!r}")
    return rule


ADVANTAGES: Registry[AdvantageRule] = Registry("advantage rule", "advantages", check=_callable)


def min_group_size(rule: AdvantageRule) -> int:
    """The fewest completions per prompt under which ``rule`` gives any non-zero advantage: its ``min_group_size``
    attribute (1 when it declares none, so a plugin rule is never refused on a guess)."""
    return int(getattr(rule, "min_group_size", 1))


def _compares_within_groups(rule: AdvantageRule) -> AdvantageRule:
    """Declare that ``rule`` compares the completions of a group: a singleton group's advantage is always 0."""
    rule.min_group_size = 2  # type: ignore[attr-defined]
    return rule


def _keeping_every_group(advantage: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> AdvantageRule:
    """The rule of a reward-based ``advantage`` function that keeps every group (all but TraceRL's)."""

    def rule(
        rewards: torch.Tensor, group_ids: torch.Tensor, correct: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        del correct
        return advantage(rewards, group_ids), torch.ones_like(group_ids, dtype=torch.bool)

    rule.__doc__ = advantage.__doc__
    return rule


ADVANTAGES.register("group_mean", _compares_within_groups(_keeping_every_group(group_mean_advantage)))
ADVANTAGES.register("leave_one_out", _compares_within_groups(_keeping_every_group(leave_one_out_advantage)))


@ADVANTAGES.register("reward_zscore")
@_compares_within_groups
def reward_zscore(
    rewards: torch.Tensor, group_ids: torch.Tensor, correct: torch.Tensor | None = None, *, epsilon: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r - group mean) / (group sample std + epsilon), every group kept (JustGRPO; BGPO with epsilon 1e-6)."""
    del correct
    return reward_zscore_advantage(rewards, group_ids, epsilon), torch.ones_like(group_ids, dtype=torch.bool)


@ADVANTAGES.register("group_zscore")
@_compares_within_groups
def group_zscore(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    correct: torch.Tensor | None = None,
    *,
    keep_range: tuple[float, float] = (0.2, 0.8),
) -> tuple[torch.Tensor, torch.Tensor]:
    """z-score of 0/1 correctness in the group, groups outside keep_range dropped (TraceRL; ignores rewards)."""
    del rewards
    if correct is None:
        raise UserError(
            "the group_zscore advantage needs per-completion correctness (the task's `correct` flags); the "
            "rewards alone do not say which completions are right"
        )
    return group_zscore_advantage(correct, group_ids, keep_range=keep_range)
