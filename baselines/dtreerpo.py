"""d-TreeRPO, tree-structured rollouts with step-wise advantages and a time-scheduled self-distillation (``THU-BPM/
d-TreeRPO``, arXiv 2512.09675; ``dtreerpo/dtreerpo_trainer.py`` at ``3eb6f21``: the tree search and the segments of
``_perform_tree_search_and_compute_advantages`` lines 238-472, ``_get_local_transition_logps`` lines 165-214, the
value and advantage rule lines 216-222 and 359-410, ``_prepare_inputs`` lines 645-697, ``compute_loss`` lines
757-928; ``dtreerpo/dtreerpo_config.py`` and ``dtreerpo/slurm_scripts/dtreerpo.yaml``).

Decoding branches at the steps T/s, 2T/s, ...: the root (all MASK) has N children, every other inner node b, each
a continuation of its parent's partial state (the ``tree_branches`` rollout); the N b^(s-1) leaves are the
completions. Leaf rewards become node values, each transition parent -> child is trained with the child's value
against its siblings', scored by one forward pass on the parent's partial state (docs/methods.md#d-treerpo)::

    V(leaf) = r                     V(node) = mean_{children c} V(c)                      (lines 216-222, 359-370)
    A(c)    = V(c) - mean_{siblings c' != c} V(c')        (0 for an only child: A = V)    (lines 395-410)
    log pi(c) = log p_theta(x_c^k | z_parent)   per position k masked in the parent, committed in c, not after
                                                c's first EOS (the tree_transitions estimator, lines 165-214)
    rho     = exp(log pi(c) - log pi_old(c))    per token
    l_c     = -sum_k min(rho A, clip(rho, 1 - eps, 1 + eps) A) / n_c + beta sum_k k3(log pi_ref - log pi) / n_c
    L       = mean_c l_c + lambda(t) D                                               (lines 776-812, 902)
    D       = mean over (sibling group, position k) of KL(q_k || p_theta(. | z_parent)_k)           (lines 816-901)
    q_k     = the tokens the siblings with A > 0 committed at k, weighted softmax(A / tau(t)) over those siblings
    lambda(t) = lambda_max (e^(gamma t / T) - 1) / (e^gamma - 1),   tau(t) = max(tau_max (1 - t / T)^beta_tau, 1e-6)

n_c counts the tokens of c's row whose new log-prob is not exactly 0 (the official ``changed_mask = new != 0``, line
784), t the optimizer steps done and T the run's length (``state.global_step``, ``max_steps``). The self-distillation
pulls the parent's distribution at each position towards the advantage-weighted empirical distribution of its better
children's choices, more and more sharply (tau falls) and strongly (lambda rises) as training goes on.

Official defaults (``DTreeRPOConfig`` and ``DiffuGRPOConfig``): N = 1, b = 2, s = 4, eps 0.2, beta 0.04,
self-distillation on with lambda_max 3e-3, gamma 2, tau_max 2, beta_tau 0.7. The recipe (``slurm_scripts/
dtreerpo.yaml``): N = 4, b = 4, s = 2 (16 leaves per prompt, branching at step 64 of 128), eps 0.4, beta 0.01, LoRA
r 128, lr 3e-5, 4 prompts per device on 8 GPUs, ``num_iterations`` 12 optimizer steps on each parent's transitions,
one parent per step: the 5 parents of a tree take 60 steps (``configs/recipes/dtreerpo/``).

Official line -> here (the full table is in docs/methods.md#d-treerpo):

* the tree search (lines 262-316, ``_generate_partial`` lines 506-642) -> ``core.rollouts.TreeBranches``;
* leaf rewards (lines 323-357) -> the trainer scores the leaves (the completions) with the task's reward profile;
* values and advantages (lines 216-222, 359-410) -> :func:`node_values`, :func:`dtreerpo_advantages`;
* segments, old and reference log-probs (lines 412-487) and the parents' training order (lines 645-697) ->
  ``core.estimators.TreeTransitions`` (old: the rollout policy's replay; reference: the adapter-free model);
* the loss (lines 757-902) -> :func:`dtreerpo_loss`, :func:`self_distillation`, :func:`self_distillation_schedule`.

Where it departs from the official code, each a convention of this harness or a case the official code leaves
undefined: every number of the sampler is the harness's (LLaDA's Gumbel-max draw in float64 with MASK excluded,
prompts' left padding not attended; the official sampler draws its Gumbel noise in the model's dtype, bf16, and
attends the padding); each branch has its own random stream where the official branches share the global one,
and a node's first child is the decode that made the node, run on (the same forwards, each transition decoded once);
the tree is decoded and the old log-probs are computed in eval mode (the official ``_prepare_inputs`` runs inside
the HF trainer's ``training_step``, after ``model.train()``: under the LoRA dropout); a child's targets stop at the
harness's stop tokens (the official at ``eos_token_id`` only); texts are cut at the first stop token before they are
rewarded (the official code decodes the whole canvas, skipping special tokens); the siblings' self-distillation reads
each support token's log-prob from the row of a sibling that chose it (all siblings are scored on the same parent
state, so it is the official parent forward's value); the sibling groups' KL terms are summed in one batched pass
(the official loop's order of summation differs by rounding).
Not reproduced: ``parents_per_step`` > 1 (its buffer top-up mixes two trees in one step; here the inner iterations
share out the parents, :class:`~stabledrl_bench.core.estimators.TreeTransitions`), sampler steps fewer than s
(refused), the unused ``consistency_*`` options of ``DTreeRPOConfig`` and the tree printouts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import TreeTransitions
from stabledrl_bench.core.losses import need, token_ppo, token_ppo_metrics
from stabledrl_bench.core.rollouts import TreeBranches, TreeRecords
from stabledrl_bench.errors import UserError

from .egspo import row_advantages

DISTILL_EPSILON = 1e-8  # in q's denominator and inside log(q + eps) (lines 855, 894, 897)
TAU_FLOOR = 1e-6  # the smallest temperature of the schedule (line 831)


def _nanmean(values: torch.Tensor, dim: int) -> torch.Tensor:
    """``torch.nanmean`` then NaN / inf -> 0, as the official aggregations (lines 220-221, 407-408)."""
    return torch.nan_to_num(torch.nanmean(values, dim=dim), nan=0.0, posinf=0.0, neginf=0.0)


def node_values(rewards: torch.Tensor, num_tree_samples: int, branch_factor: int, depth: int) -> list[torch.Tensor]:
    """The value of every node [groups, n_d] at each depth d = 0..D (root first), from the leaves' rewards [B] in
    tree order (:class:`~stabledrl_bench.core.rollouts.TreeRecords`): a leaf's value is its reward, an inner node's
    the mean of its children's values, bottom-up (lines 351-370). In ``compute_dtype`` of the rewards."""
    leaves = num_tree_samples * branch_factor ** (depth - 1)
    values = [rewards.to(compute_dtype(rewards)).reshape(-1, leaves)]
    for d in range(depth - 1, -1, -1):
        children = num_tree_samples if d == 0 else branch_factor
        above = values[0]
        values.insert(0, _nanmean(above.reshape(above.shape[0], -1, children), dim=2))
    return values


def dtreerpo_advantages(rewards: torch.Tensor, num_tree_samples: int, branch_factor: int, depth: int) -> torch.Tensor:
    """The advantage of every transition on each leaf's path [B, D] (column d - 1: the transition into the row's
    node at depth d): the node's value minus the mean of its siblings' values, 0 for an only child (lines 395-410).
    Rows in tree order; in ``compute_dtype`` of the rewards."""
    values = node_values(rewards, num_tree_samples, branch_factor, depth)
    leaves = values[-1].shape[1]
    columns = []
    for d in range(1, depth + 1):
        children = num_tree_samples if d == 1 else branch_factor
        siblings = values[d].reshape(values[d].shape[0], -1, children)
        if children == 1:
            others = torch.zeros_like(siblings)
        else:
            others = torch.stack(
                [
                    _nanmean(torch.cat((siblings[..., :k], siblings[..., k + 1 :]), dim=-1), dim=-1)
                    for k in range(children)
                ],
                dim=-1,
            )
        advantage = (siblings - others).reshape(values[d].shape)
        columns.append(advantage.repeat_interleave(leaves // advantage.shape[1], dim=1).reshape(-1))
    return torch.stack(columns, dim=1)


def self_distillation_schedule(
    step: int, total_steps: int, *, lambda_max: float, gamma: float, tau_max: float, tau_power: float
) -> tuple[float, float]:
    """``(lambda(t), tau(t))`` at optimizer step ``step`` of ``total_steps`` (lines 817-831): lambda rises from 0 to
    lambda_max as (e^(gamma p) - 1) / (e^gamma - 1), tau falls from tau_max as (1 - p)^tau_power (at least 1e-6),
    p = t / T clamped to [0, 1]."""
    progress = min(1.0, max(0.0, step / max(1, total_steps)))
    weight = lambda_max * (math.exp(gamma * progress) - 1.0) / (math.exp(gamma) - 1.0)
    return weight, max(tau_max * max(0.0, 1.0 - progress) ** tau_power, TAU_FLOOR)


def self_distillation(
    logp: torch.Tensor,
    active: torch.Tensor,
    tokens: torch.Tensor,
    advantages: torch.Tensor,
    row_group: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """The self-distillation term D (lines 833-901) over rows [R, L] of transitions: ``logp`` their tokens'
    log-probs under the parent state, ``active`` the positions that count, ``tokens`` the rows' tokens,
    ``advantages`` [R] and ``row_group`` [R] (rows of one value are siblings).

    In each sibling group of more than one row, the siblings with A > 0 get weights w = softmax(A / tau); at every
    position k where some of them is active, q_k is their tokens' distribution weighted by w (q = Q / (W + 1e-8)),
    and the term is KL(q_k || p) = sum_u q_u (log(q_u + 1e-8) - log p(u)) over q's support; D is the mean of these
    terms over (group, position) pairs (0 when there is none). Summed here over rows: each active row adds
    w / (W + 1e-8) (log(q of its token + 1e-8) - its log-prob), which is the official sum over the support when the
    siblings share their parent state. In ``compute_dtype`` of the log-probs and advantages.
    """
    dtype = compute_dtype(logp, advantages)
    adv = torch.nan_to_num(advantages.detach().to(dtype), nan=0.0, posinf=0.0, neginf=0.0)
    same_group = row_group[:, None] == row_group[None, :]  # [R, R]
    positive = (adv > 0) & (same_group.sum(dim=1) > 1)
    scaled = torch.where(positive, adv / tau, -torch.inf)
    top = torch.where(same_group, scaled[None, :], -torch.inf).amax(dim=1)
    exp = torch.where(positive, torch.exp(scaled - torch.where(positive, top, 0.0)), 0.0)
    weight = exp / torch.where(positive, (same_group * exp[None, :]).sum(dim=1), 1.0)
    act = active.bool() & positive[:, None]
    peers = same_group[:, :, None] & act[None, :, :]  # [R, R', L]: row r' counts in row r's group at position k
    total = (peers * weight[None, :, None]).sum(dim=1)  # W
    mass = ((peers & (tokens[:, None, :] == tokens[None, :, :])) * weight[None, :, None]).sum(dim=1)  # Q of r's token
    q = mass / (total + DISTILL_EPSILON)
    share = weight[:, None] / (total + DISTILL_EPSILON)
    terms = torch.where(act, share * (torch.log(q + DISTILL_EPSILON) - logp.to(dtype)), 0.0)
    rows = torch.arange(row_group.shape[0], device=row_group.device)
    first = ~(same_group & (rows[None, :] < rows[:, None])).any(dim=1)  # one row stands for its group
    count = (first[:, None] & (total > 0)).sum()
    return terms.sum() / count if bool(count > 0) else terms.sum() * 0.0


def dtreerpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    row_group: torch.Tensor | None = None,
    tokens: torch.Tensor | None = None,
    *,
    epsilon: float = 0.2,
    beta: float = 0.04,
    distill_weight: float = 0.0,
    distill_tau: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """d-TreeRPO's loss (module docstring): token tensors [R, L] of the replayed transitions, ``advantages`` [R] per
    row; the self-distillation term (``row_group`` and ``tokens`` given) weighted by ``distill_weight`` = lambda(t) at
    temperature ``distill_tau`` = tau(t). The tokens that count are ``mask`` where the new log-prob is not exactly 0
    (line 784); each row's PPO and k3 terms are summed over them and divided by their count (at least 1), then
    averaged over the rows (lines 786-811); without any such token the loss is 0 (and its metrics only ``loss`` and
    the distillation's). In ``compute_dtype`` of the inputs.
    """
    active = mask.bool() & (logp.detach() != 0)
    terms = token_ppo(logp, old_logp, ref_logp, active, advantages, epsilon=epsilon, beta=beta)
    count = active.sum(dim=1).clamp(min=1).to(terms.per_token.dtype)
    loss = (torch.where(active, terms.per_token, 0.0).sum(dim=1) / count).mean()
    metrics: dict[str, float] = {}
    if row_group is not None and tokens is not None:
        distill = self_distillation(logp, active, tokens, advantages, row_group, distill_tau)
        loss = loss + distill_weight * distill
        metrics = {"self_distillation": distill.item(), "lambda_t": distill_weight, "tau_t": distill_tau}
    # a parent whose children commit nothing before their first EOS leaves no token: loss 0, no ratio to describe
    shared = token_ppo_metrics(loss, terms, active) if bool(active.any()) else {"loss": loss.item()}
    return loss, shared | metrics


@dataclass
class DTreeRPOConfig(BaselineConfig):
    beta: float = 0.04  # k3 KL to the reference (DiffuGRPOConfig; the recipe sets 0.01)
    epsilon: float = 0.2  # clip range (DiffuGRPOConfig; the recipe sets 0.4)
    num_tree_samples: int = 1  # N: children of the root
    tree_branch_factor: int = 2  # b: children of every other inner node
    tree_contraction_factor: int = 4  # s: branch steps at T / s, 2T / s, ...
    enable_self_distillation_loss: bool = True
    self_distillation_lambda_max: float = 3e-3
    self_distillation_gamma: float = 2.0  # lambda's growth (the e^(gamma t / T) schedule)
    self_distillation_tau_max: float = 2.0
    self_distillation_beta: float = 0.7  # tau's decay exponent

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.epsilon < 1:
            raise UserError(f"d-TreeRPO: need 0 < epsilon < 1, got {self.epsilon}")
        if not self.coupled:
            raise UserError("d-TreeRPO: coupled must be true (the old policy replays the same transitions)")
        if self.self_distillation_gamma == 0 or self.self_distillation_tau_max <= 0:
            raise UserError(
                "d-TreeRPO: self_distillation_gamma must be nonzero and self_distillation_tau_max positive, got "
                f"{self.self_distillation_gamma} and {self.self_distillation_tau_max}"
            )
        if self.self_distillation_lambda_max < 0:
            raise UserError(
                f"d-TreeRPO: self_distillation_lambda_max must be >= 0, got {self.self_distillation_lambda_max}"
            )
        self.tree()  # checks N, b and s

    def tree(self) -> TreeBranches:
        return TreeBranches(
            num_tree_samples=self.num_tree_samples,
            branch_factor=self.tree_branch_factor,
            contraction_factor=self.tree_contraction_factor,
        )


@register_baseline("dtreerpo")
class DTreeRPO(Baseline):
    """d-TreeRPO: token PPO on the transitions of a rollout tree, sibling-relative values, self-distillation."""

    description: ClassVar[str] = "d-TreeRPO: token PPO on rollout-tree transitions, sibling advantages, self-distill"
    Config: ClassVar[type[BaselineConfig]] = DTreeRPOConfig
    advantage: ClassVar[str] = "group_mean"  # its tree rule is dtreerpo_advantages
    needs_old: ClassVar[bool] = True
    config: DTreeRPOConfig

    def estimator(self) -> TreeTransitions:
        return TreeTransitions()

    def rollout(self) -> TreeBranches:
        return self.config.tree()

    def advantage_record(self) -> dict[str, Any]:
        return {"rule": "dtreerpo_tree", "options": {}}

    def require_groups(self, num_generations: int) -> None:
        leaves = self.rollout().leaves
        if num_generations != leaves:
            c = self.config
            raise UserError(
                f"budget.num_generations={num_generations}: d-TreeRPO's completions are the leaves of one tree per "
                f"prompt, N b^(s-1) = {c.num_tree_samples} x {c.tree_branch_factor}^{c.tree_contraction_factor - 1} "
                f"= {leaves}"
            )

    def advantages(
        self,
        rewards: torch.Tensor,
        group_ids: torch.Tensor,
        correct: torch.Tensor | None = None,
        records: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages [B, D], keep [B])``: :func:`dtreerpo_advantages` of the leaves' rewards over the tree the
        rollout recorded (``records``, in tree order); no group is dropped."""
        del group_ids, correct
        tree = TreeRecords.of(records or {})
        c = self.config
        leaves = c.num_tree_samples * c.tree_branch_factor ** (tree.depth - 1)
        order = torch.arange(rewards.shape[0], device=tree.node.device) % leaves
        if not torch.equal(tree.node[:, -1], order):
            raise UserError("d-TreeRPO: the rows are not the leaves of the recorded trees in tree order")
        advantages = dtreerpo_advantages(rewards, c.num_tree_samples, c.tree_branch_factor, tree.depth)
        return advantages, torch.ones_like(rewards, dtype=torch.bool)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        new, c = inputs.new, self.config
        weight, tau = self_distillation_schedule(
            inputs.step,
            inputs.total_steps,
            lambda_max=c.self_distillation_lambda_max,
            gamma=c.self_distillation_gamma,
            tau_max=c.self_distillation_tau_max,
            tau_power=c.self_distillation_beta,
        )
        distill = c.enable_self_distillation_loss
        return dtreerpo_loss(
            need(new, "token_logp", self.name),
            need(inputs.old, "token_logp", self.name),
            inputs.ref.token_logp if inputs.ref is not None else None,
            need(new, "token_mask", self.name),
            row_advantages(inputs),
            need(new, "row_group", self.name) if distill else None,
            need(new, "token_ids", self.name) if distill else None,
            epsilon=c.epsilon,
            beta=c.beta,
            distill_weight=weight,
            distill_tau=tau,
        )
