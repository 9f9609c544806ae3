"""d-TreeRPO (``THU-BPM/d-TreeRPO`` at ``3eb6f21``, ``dtreerpo/dtreerpo_trainer.py``): its values, advantages,
schedules, self-distillation and loss against values worked out by hand from the official lines (derivations in
the comments) and against transcriptions of those lines written here; the ``tree_branches`` rollout against the
resumable sampler run branch by branch; the ``tree_transitions`` replay against one forward per transition on the
parent's state; how the trainer wires them.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from conftest import small_budget
from test_egspo import PROMPTS, TINY, _gen, assert_a_step_trains, recorded_rollout
from test_egspo import _config as egspo_config
from test_losses import close

from stabledrl_bench.baselines.dtreerpo import (
    dtreerpo_advantages,
    dtreerpo_loss,
    node_values,
    self_distillation,
    self_distillation_schedule,
)
from stabledrl_bench.core.baseline import LossInputs, build_baseline
from stabledrl_bench.core.estimators import Estimate, SequenceBatch, TreeTransitions
from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.core.rollouts import TreeBranches, TreeRecords, _branch_generator, tree_bounds
from stabledrl_bench.core.sampling import BlockDecode, FullDecode, generate
from stabledrl_bench.errors import UserError
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.trainer import RLTrainer

# 12 tokens in blocks of 4, 6 steps; a tree of depth 3 (branching before steps 2 and 4): 2 x 2 x 2 = 8 leaves
SETTINGS = FullDecode(max_completion_length=12, block_length=4, steps=6, temperature=1.0)
SCHEME = TreeBranches(num_tree_samples=2, branch_factor=2, contraction_factor=3)


@pytest.fixture(scope="module")
def model():
    dlm = build_tiny(attention="full", seed=0, initializer_range=1.0, **TINY)
    dlm.model.double().eval()
    return dlm


def _official_branch_points(total_steps: int, s: int) -> list[int]:
    """Lines 273-276 transcribed: the steps still to run at each branch point, from T down to 0."""
    branch_points = [total_steps] + [total_steps - int(k * total_steps / s) for k in range(1, s + 1)]
    return sorted(list(set(branch_points)), reverse=True)


@pytest.mark.parametrize(("steps", "s", "expected"), [(128, 2, [0, 64, 128]), (128, 4, [0, 32, 64, 96, 128]),
                                                      (20, 3, [0, 6, 13, 20]), (6, 3, [0, 2, 4, 6])])  # fmt: skip
def test_branch_steps(steps: int, s: int, expected: list[int]) -> None:
    assert tree_bounds(steps, s) == expected
    assert [steps - p for p in _official_branch_points(steps, s)] == expected


# ----------------------------------------------------------------------------------------------- values
# N = 2 children of the root, b = 2, depth 2: leaves (1, 0 | 1, 1).
#   values (lines 351-370): depth 1 = (1/2, 1), root 3/4
#   advantages (lines 395-410): depth 1: 1/2 - 1 = -1/2, 1 - 1/2 = 1/2; depth 2: 1 - 0, 0 - 1, 1 - 1, 1 - 1
# N = 1 (the official default): the root's only child has no sibling, its advantage is its value; b = 3: each leaf
# against the mean of its two siblings: rewards (1, 0, 0) -> V = 1/3, A = 1/3 | 1 - 0, 0 - 1/2, 0 - 1/2.
def test_values_and_advantages_hand_values() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    values = node_values(rewards, 2, 2, 2)
    assert [v.tolist() for v in values] == [[[0.75]], [[0.5, 1.0]], [[1.0, 0.0, 1.0, 1.0]]]
    got = dtreerpo_advantages(rewards, 2, 2, 2)
    assert got.tolist() == [[-0.5, 1.0], [-0.5, -1.0], [0.5, 0.0], [0.5, 0.0]]
    got = dtreerpo_advantages(torch.tensor([1.0, 0.0, 0.0]), 1, 3, 2)
    torch.testing.assert_close(got, torch.tensor([[1 / 3, 1.0], [1 / 3, -0.5], [1 / 3, -0.5]]))
    # two prompts: each tree on its own
    two = dtreerpo_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]), 2, 2, 2)
    assert two[:4].tolist() == [[-0.5, 1.0], [-0.5, -1.0], [0.5, 0.0], [0.5, 0.0]]
    assert two[4:].tolist() == [[-0.5, 0.0], [-0.5, 0.0], [0.5, -1.0], [0.5, 1.0]]


def _official_advantages(rewards: torch.Tensor, n: int, b: int, depth: int, prompts: int) -> torch.Tensor:
    """Lines 278-316, 351-370 and 395-410 transcribed on a tree of node dicts (each node holds every prompt, its
    ``value_vec`` [prompts]); the rewards of leaf k of prompt p are ``rewards[p * leaves + k]`` (leaves in the
    order the official loop creates them). Returns the advantage of each leaf's path [rows, depth]."""
    all_nodes = {"root": {"id": "root", "parent_id": None, "step": depth, "children": [], "value_vec": None}}
    current = [all_nodes["root"]]
    for level in range(depth):
        nxt = []
        for node in current:
            for k in range(n if node["id"] == "root" else b):
                child = {"id": f"{node['id']}/{k}", "parent_id": node["id"], "step": depth - level - 1,
                         "children": [], "value_vec": None}  # fmt: skip
                all_nodes[child["id"]] = child
                node["children"].append(child["id"])
                nxt.append(child)
        current = nxt
    leaves = [node for node in all_nodes.values() if node["step"] == 0]
    per_prompt = rewards.view(prompts, len(leaves))
    for k, leaf in enumerate(leaves):
        leaf["value_vec"] = per_prompt[:, k].clone()

    def aggregate(vecs: list[torch.Tensor]) -> torch.Tensor:
        return torch.nan_to_num(torch.nanmean(torch.stack(vecs, dim=0), dim=0), nan=0.0, posinf=0.0, neginf=0.0)

    for step in range(1, depth + 1):  # reversed(branch_points[:-1]): bottom-up
        for node in [v for v in all_nodes.values() if v["step"] == step]:
            node["value_vec"] = aggregate([all_nodes[c]["value_vec"] for c in node["children"]])
    for node_id, node in all_nodes.items():
        if node_id == "root":
            continue
        siblings = [c for c in all_nodes[node["parent_id"]]["children"] if c != node_id]
        mean = aggregate([all_nodes[c]["value_vec"] for c in siblings]) if siblings else 0 * node["value_vec"]
        node["adv"] = node["value_vec"] - mean
    columns = []
    for d in range(1, depth + 1):
        per_leaf = [all_nodes["/".join(leaf["id"].split("/")[: d + 1])]["adv"] for leaf in leaves]
        columns.append(torch.stack(per_leaf, dim=1).reshape(-1))
    return torch.stack(columns, dim=1)


@pytest.mark.parametrize(("n", "b", "depth"), [(1, 2, 4), (2, 2, 3), (4, 4, 2), (3, 1, 2), (2, 3, 3)])
def test_advantages_equal_the_official_lines(n: int, b: int, depth: int) -> None:
    leaves = n * b ** (depth - 1)
    rewards = torch.randint(0, 5, (3 * leaves,), generator=_gen(n * 10 + b)).float() * 0.25
    want = _official_advantages(rewards, n, b, depth, 3)
    torch.testing.assert_close(dtreerpo_advantages(rewards, n, b, depth), want, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------------------- schedules
# lambda(t) = 3e-3 (e^(2 t/T) - 1) / (e^2 - 1), tau(t) = max(2 (1 - t/T)^0.7, 1e-6) (lines 817-831):
#   t = 0: 0 and 2; t = T/2: 3e-3 (e - 1) / (e^2 - 1) = 3e-3 / (e + 1) and 2 / 2^0.7; t >= T: 3e-3 and 1e-6
def test_schedule_hand_values() -> None:
    options = {"lambda_max": 3e-3, "gamma": 2.0, "tau_max": 2.0, "tau_power": 0.7}
    assert self_distillation_schedule(0, 100, **options) == (0.0, 2.0)
    weight, tau = self_distillation_schedule(50, 100, **options)
    assert close(weight, 3e-3 / (math.e + 1), 1e-12) and close(tau, 2 / 2**0.7, 1e-12)
    for step in (100, 250):
        weight, tau = self_distillation_schedule(step, 100, **options)
        assert close(weight, 3e-3, 1e-12) and tau == 1e-6
    assert self_distillation_schedule(3, 0, **options)[0] == 3e-3  # T = max(1, max_steps)


# ------------------------------------------------------------------------------------------- distillation
# Rows 0-2 are siblings (one parent), row 3 an only child. A = (1, 1, -1 | 2), tau = 1: the positive siblings 0 and
# 1 weigh softmax(1, 1) = (1/2, 1/2); row 2 (A < 0) and row 3 (a group of one) take no part (lines 859-870).
#   position 0: both active, both chose token 5 (log p = -1): q = (1), KL = 1 (log 1 + 1)               = 1
#   position 1: tokens 5 (log p = -2) and 7 (log p = -1/2): q = (1/2, 1/2),
#               KL = 1/2 (log 1/2 + 2) + 1/2 (log 1/2 + 1/2) = log 1/2 + 5/4
#   position 2: only row 0 active, token 9 (log p = -3): q = (1), KL = 3
#   D = (1 + log 1/2 + 5/4 + 3) / 3 positions (lines 880-901; the 1e-8 terms move it by ~1e-8)
DIST_LOGP = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -0.5, -4.0], [-0.25, -0.5, -1.0], [-1.0, -1.0, -1.0]])
DIST_ACTIVE = torch.tensor([[True, True, True], [True, True, False], [True, True, True], [True, True, True]])
DIST_TOKENS = torch.tensor([[5, 5, 9], [5, 7, 9], [3, 3, 3], [5, 5, 5]])
DIST_ADV = torch.tensor([1.0, 1.0, -1.0, 2.0])
DIST_GROUP = torch.tensor([4, 4, 4, 9])
DIST_HAND = (1 + math.log(0.5) + 1.25 + 3) / 3


def test_self_distillation_hand_values() -> None:
    got = self_distillation(DIST_LOGP, DIST_ACTIVE, DIST_TOKENS, DIST_ADV, DIST_GROUP, 1.0)
    assert close(got.item(), DIST_HAND, 1e-7)
    # no sibling with A > 0: no term at all (0)
    none = self_distillation(DIST_LOGP, DIST_ACTIVE, DIST_TOKENS, -DIST_ADV.abs(), DIST_GROUP, 1.0)
    assert none.item() == 0.0
    # a lower temperature sharpens the weights towards the larger advantage: A = (2, 1) at tau -> 0 is row 0 alone
    sharp = self_distillation(
        DIST_LOGP, DIST_ACTIVE, DIST_TOKENS, torch.tensor([2.0, 1.0, -1.0, 2.0]), DIST_GROUP, 1e-6
    )
    assert close(sharp.item(), (1 + 2 + 3) / 3, 1e-7)


def _official_distillation(logits_parent_unique, group_ids, advantages, active_mask, child_completion, tau_t):
    """Lines 833-901 transcribed (the parent logits given per group, in the order of ``torch.unique``)."""
    uniq_groups = torch.unique(group_ids)
    group_to_pos = {g: pos for pos, g in enumerate(uniq_groups.tolist())}
    logp_parent_slice = F.log_softmax(logits_parent_unique, dim=-1)
    eps = 1e-8
    consistency_sum = torch.tensor(0.0, dtype=logits_parent_unique.dtype)
    consistency_count = 0
    lc = child_completion.shape[1]
    for g in uniq_groups.tolist():
        idxs = (group_ids == g).nonzero(as_tuple=False).squeeze(-1)
        if idxs.numel() <= 1:
            continue
        a_full = torch.nan_to_num(advantages[idxs].detach(), nan=0.0, posinf=0.0, neginf=0.0)
        pos_mask = a_full > 0
        if pos_mask.sum().item() == 0:
            continue
        w = F.softmax(a_full[pos_mask] / tau_t, dim=0)
        idxs_pos = idxs[pos_mask]
        group_active = active_mask[idxs_pos] > 0
        toks_group = child_completion[idxs_pos]
        ref_pos = group_to_pos[g]
        for j in range(lc):
            active_k = group_active[:, j]
            if not active_k.any():
                continue
            toks_j = toks_group[active_k, j]
            w_j = w[active_k]
            unique_tokens, inv = torch.unique(toks_j, return_inverse=True)
            q_weights = torch.zeros_like(unique_tokens, dtype=logits_parent_unique.dtype)
            q_weights.index_add_(0, inv, w_j.to(q_weights.dtype))
            ws_sum = q_weights.sum()
            if ws_sum <= 0:
                continue
            q_probs = q_weights / (ws_sum + eps)
            logp_support = logp_parent_slice[ref_pos, j].gather(0, unique_tokens)
            consistency_sum = consistency_sum + torch.sum(q_probs * (torch.log(q_probs + eps) - logp_support))
            consistency_count += 1
    return consistency_sum / float(consistency_count) if consistency_count > 0 else torch.tensor(0.0)


def _official_policy_loss(new, old, ref, child_mask, adv, epsilon, beta):
    """Lines 781-812 transcribed (``new`` already zero off the transition's tokens, as line 193 leaves it)."""
    changed_mask = (new != 0).to(new.dtype)
    active_mask = child_mask.to(new.dtype) * changed_mask
    l_eff = active_mask.sum(dim=1).clamp_min(1)
    ratio = torch.exp(new - old)
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon)
    a = adv.unsqueeze(1)
    obj = torch.min(ratio * a, clipped * a) * active_mask
    loss = (-(obj.sum(dim=1) / l_eff)).mean()
    delta = ref - new
    kl = ((torch.exp(delta) - delta - 1.0) * active_mask).sum(dim=1) / l_eff
    return loss + beta * kl.mean(), active_mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_equals_the_official_lines(seed: int) -> None:
    """Siblings share their parent's logits (one per group); the loss and its gradient with respect to those logits
    equal the official policy, k3 and self-distillation terms, with lambda and tau of mid-training."""
    gen = _gen(seed)
    groups, per_group, length, vocab = 3, 4, 6, 7
    rows = groups * per_group
    group_ids = torch.arange(groups).repeat_interleave(per_group)
    logits = torch.randn(groups, length, vocab, generator=gen, dtype=torch.float64).requires_grad_()
    tokens = torch.randint(0, 3, (rows, length), generator=gen)  # few distinct tokens: siblings often agree
    mask = torch.rand(rows, length, generator=gen) < 0.6
    logp_all = torch.log_softmax(logits, dim=-1)[group_ids]
    logp = torch.where(mask, logp_all.gather(-1, tokens[..., None])[..., 0], 0.0)
    old = logp.detach() + torch.randn(rows, length, generator=gen, dtype=torch.float64) * 0.3
    ref = logp.detach() + torch.randn(rows, length, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(rows, generator=gen, dtype=torch.float64)
    weight, tau = 0.5, 0.7
    loss, metrics = dtreerpo_loss(
        logp, old, ref, mask, adv, group_ids, tokens, epsilon=0.4, beta=0.01, distill_weight=weight, distill_tau=tau
    )
    policy, active = _official_policy_loss(logp, old, ref, mask, adv, 0.4, 0.01)
    distill = _official_distillation(logits, group_ids, adv, active, tokens, tau)
    want = policy + weight * distill
    assert close(loss.item(), want.item(), 1e-10) and close(metrics["self_distillation"], distill.item(), 1e-10)
    (grad,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (want_grad,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(grad, want_grad, rtol=1e-8, atol=1e-12)


# Two rows, L = 3, eps 0.2, beta 0.04 (lines 781-811):
#   row 0 (A = 1, tokens 0 and 1): rho = (1, e^0.5 > 1.2) -> min terms (1, 1.2); n = 2; -(2.2) / 2 = -1.1;
#     ref - logp = (-0.5, 0): k3 = (e^-0.5 + 0.5 - 1, 0); KL_0 = (e^-0.5 - 0.5) / 2
#   row 1 (A = -1/2, tokens 1 and 2): token 2's new log-prob is exactly 0, so it does not count (line 784); token 1:
#     rho = e^-1 < 0.8 with A < 0: min(-e^-1 / 2, -0.4) = -0.4, the term 0.4; n = 1; ref - logp = 1: KL_1 = e - 2
#   loss = (-1.1 + 0.4) / 2 + 0.04 (KL_0 + KL_1) / 2
LOSS_MASK = torch.tensor([[True, True, False], [False, True, True]])
LOSS_LOGP = torch.tensor([[-1.0, -0.5, -7.0], [-7.0, -2.0, 0.0]], dtype=torch.float64)
LOSS_OLD = torch.tensor([[-1.0, -1.0, 3.0], [3.0, -1.0, -1.0]], dtype=torch.float64)
LOSS_REF = torch.tensor([[-1.5, -0.5, 3.0], [3.0, -1.0, -1.0]], dtype=torch.float64)
LOSS_ADV = torch.tensor([1.0, -0.5], dtype=torch.float64)
LOSS_HAND = -0.35 + 0.04 * ((math.exp(-0.5) - 0.5) / 2 + math.e - 2) / 2


def test_loss_hand_values() -> None:
    loss, m = dtreerpo_loss(LOSS_LOGP, LOSS_OLD, LOSS_REF, LOSS_MASK, LOSS_ADV, epsilon=0.2, beta=0.04)
    assert close(loss.item(), LOSS_HAND, 1e-12) and loss.dtype == torch.float64
    assert close(m["clip_ratio"], 2 / 3, 1e-7) and "self_distillation" not in m  # a float32 mean
    # with the distillation term: each row its own group, so the term is 0 whatever its weight
    alone, m = dtreerpo_loss(
        LOSS_LOGP, LOSS_OLD, LOSS_REF, LOSS_MASK, LOSS_ADV, torch.tensor([0, 1]), torch.zeros(2, 3, dtype=torch.long),
        epsilon=0.2, beta=0.04, distill_weight=5.0,
    )  # fmt: skip
    assert close(alone.item(), LOSS_HAND, 1e-12) and m["self_distillation"] == 0.0
    # no token counts (every transition ends before its child's EOS): loss 0 with a zero gradient, no ratio metrics
    logp = LOSS_LOGP.clone().requires_grad_()
    empty, m = dtreerpo_loss(logp, LOSS_OLD, None, torch.zeros_like(LOSS_MASK), LOSS_ADV, beta=0.0)
    (grad,) = torch.autograd.grad(empty, logp)
    assert empty.item() == 0.0 and m == {"loss": 0.0} and not grad.any()


def test_baseline_loss_reads_each_rows_column_and_the_schedule() -> None:
    """Advantages [B, D]: row r takes column ``row_column[r]`` of its sequence; lambda and tau follow the step."""
    advantages = torch.tensor([[5.0, 1.0], [-0.5, 7.0]], dtype=torch.float64)
    new = Estimate(
        token_logp=LOSS_LOGP,
        token_mask=LOSS_MASK,
        row_to_seq=torch.tensor([0, 1]),
        row_column=torch.tensor([1, 0]),
        row_group=torch.tensor([0, 1]),
        token_ids=torch.zeros(2, 3, dtype=torch.long),
    )
    old, ref = Estimate(token_logp=LOSS_OLD), Estimate(token_logp=LOSS_REF)
    inputs = LossInputs(new, old, ref, advantages, LOSS_MASK, torch.tensor([0, 0]), step=5, total_steps=10)
    loss, metrics = build_baseline("dtreerpo", epsilon=0.2).loss(inputs)
    assert close(loss.item(), LOSS_HAND, 1e-12)
    assert close(metrics["lambda_t"], 3e-3 / (math.e + 1), 1e-12) and close(metrics["tau_t"], 2 / 2**0.7, 1e-12)
    off = build_baseline("dtreerpo", epsilon=0.2, enable_self_distillation_loss=False)
    loss, metrics = off.loss(dataclasses.replace(inputs, new=dataclasses.replace(new, row_group=None)))
    assert close(loss.item(), LOSS_HAND, 1e-12) and "lambda_t" not in metrics
    with pytest.raises(ValueError, match="row_group"):
        build_baseline("dtreerpo").loss(dataclasses.replace(inputs, new=dataclasses.replace(new, row_group=None)))


# ------------------------------------------------------------------------------------------------- rollout
def _tree(model, seed: int = 5):
    ids, mask = model.encode_prompts([p for p in PROMPTS[:2] for _ in range(SCHEME.leaves)], chat_template=False)
    with torch.no_grad():
        out = SCHEME.sample(model, ids, mask, SETTINGS, _gen(seed))
    return ids, mask, out


def test_each_branch_is_the_resumed_sampler_with_its_own_stream(model) -> None:
    """Leaves 0 and 4 are the root's two children decoded to the end with the first two streams drawn from the
    rollout generator; leaf 2 resumes leaf 0's decode before step 2 (u_1) with the third, leaf 1 before step 4 (u_2)
    with the fourth (the branches the first decode went through, queued in depth order)."""
    ids, mask, out = _tree(model)
    prompts, masks = ids[:: SCHEME.leaves], mask[:: SCHEME.leaves]
    rollout = _gen(5)
    streams = [_branch_generator(rollout) for _ in range(4)]
    with torch.no_grad():
        leaf0 = generate(model, prompts, masks, SETTINGS, streams[0], snapshots=[2, 4])
        leaf4 = generate(model, prompts, masks, SETTINGS, streams[1])
        leaf2 = generate(model, prompts, masks, SETTINGS, streams[2], start=leaf0.states[2])
        leaf1 = generate(model, prompts, masks, SETTINGS, streams[3], start=leaf0.states[4])
    for leaf, want in ((0, leaf0), (4, leaf4), (2, leaf2), (1, leaf1)):
        rows = torch.tensor([leaf, SCHEME.leaves + leaf])
        assert torch.equal(out.completion_ids[rows], want.completion_ids)
        assert torch.equal(out.unmask_step[rows], want.unmask_step)
    # 2 root decodes of 6 steps, 2 branches from step 2 (4 steps), 4 from step 4 (2 steps): 28 forwards, 8 leaves
    assert out.nfe == math.ceil(28 / 8)


def test_branches_share_the_parents_prefix_exactly(model) -> None:
    _, _, out = _tree(model)
    tree = TreeRecords.of(out.records)
    assert tree.steps.tolist() == [0, 2, 4, 6] and sorted(tree.order.tolist()) == list(range(7))
    rows = out.completion_ids.shape[0]
    local = torch.arange(rows) % SCHEME.leaves
    assert torch.equal(tree.node[:, -1], local) and bool((tree.node[:, 0] == 0).all())
    for row in range(rows):
        for depth in range(4):
            owner = row - int(local[row]) + int(tree.node[row, depth])
            own = tree.state(out.completion_ids[row], out.unmask_step[row], depth, model.mask_id)
            theirs = tree.state(out.completion_ids[owner], out.unmask_step[owner], depth, model.mask_id)
            assert torch.equal(own, theirs)  # the same partial state, token for token
            before = out.unmask_step[row] < tree.steps[depth]
            assert torch.equal(out.unmask_step[row][before], out.unmask_step[owner][before])
    # independent streams: the children of a node differ after they branch (here in most of them)
    differ = [not torch.equal(out.completion_ids[r], out.completion_ids[r + 1]) for r in range(0, rows, 2)]
    assert sum(differ) >= len(differ) // 2
    # another rollout generator, another tree; the same one, the same tree
    assert not torch.equal(_tree(model, seed=6)[2].completion_ids, out.completion_ids)
    assert torch.equal(_tree(model)[2].completion_ids, out.completion_ids)


def test_tree_records_are_linked_parent_to_child(model) -> None:
    """``tree_parent`` numbers a prompt's 7 inner nodes depth-major: the root 0, depth 1: 1-2, depth 2: 3-6."""
    _, _, out = _tree(model)
    tree = TreeRecords.of(out.records)
    assert tree.parent[:8].tolist() == [[0, 1, 3], [0, 1, 3], [0, 1, 4], [0, 1, 4],
                                        [0, 2, 5], [0, 2, 5], [0, 2, 6], [0, 2, 6]]  # fmt: skip
    assert tree.node[:8, 1].tolist() == [0, 0, 0, 0, 4, 4, 4, 4]
    assert tree.node[:8, 2].tolist() == [0, 0, 2, 2, 4, 4, 6, 6]
    assert tree.owned()[:8].tolist() == [[True, True, True], [False, False, True], [False, True, True],
                                         [False, False, True]] * 2  # fmt: skip


def test_tree_branches_refuses_what_it_cannot_branch(model) -> None:
    with pytest.raises(UserError, match="full-attention"):
        SCHEME.check(BlockDecode(max_completion_length=8, block_length=4, steps=4))
    with pytest.raises(UserError, match="exact decoding"):
        SCHEME.check(dataclasses.replace(SETTINGS, cache="dual"))
    with pytest.raises(UserError, match="exceeds"):
        SCHEME.check(dataclasses.replace(SETTINGS, steps=2, block_length=12))
    with pytest.raises(UserError, match="branch_factor"):
        TreeBranches(branch_factor=0)
    ids, mask = model.encode_prompts(PROMPTS[:1] * 7, chat_template=False)
    with pytest.raises(UserError, match="8 times"):
        SCHEME.sample(model, ids, mask, SETTINGS, _gen(0))
    with pytest.raises(UserError, match="tree_branches"):
        TreeRecords.of({})


# ----------------------------------------------------------------------------------------------- estimator
def test_replay_rows_are_the_transitions_on_the_parents_state(model) -> None:
    """Row (i, d): the state of the parent (the tokens i committed before u_(d-1), the rest MASK), one forward of it
    alone; targets: the tokens committed in [u_(d-1), u_d); one row per node, siblings in one ``row_group``."""
    ids, mask, out = _tree(model)
    batch = SequenceBatch(ids, mask, out.completion_ids, model.completion_mask(out.completion_ids), out.unmask_step,
                          dict(out.records))  # fmt: skip
    estimator = TreeTransitions()
    with torch.no_grad():
        estimate = estimator.evaluate(model, batch, estimator.draw(batch, _gen(0)))
    tree = TreeRecords.of(out.records)
    # 2 + 4 + 8 nodes below each of the 2 roots
    assert estimate.row_to_seq.shape[0] == 28
    assert torch.equal(estimate.token_ids, out.completion_ids[estimate.row_to_seq])
    prompt_len, steps = ids.shape[1], tree.steps
    parents: dict[int, set[int]] = defaultdict(set)
    for r, (i, col) in enumerate(zip(estimate.row_to_seq.tolist(), estimate.row_column.tolist(), strict=True)):
        assert int(tree.node[i, col + 1]) == i % SCHEME.leaves  # the row owns the node
        committed = out.unmask_step[i]
        child = tree.state(out.completion_ids[i], committed, col + 1, model.mask_id)
        stop = torch.isin(child, torch.tensor(model.stop_ids)).long()
        before_stop = (torch.cumsum(stop, 0) - stop) == 0
        targets = (committed >= steps[col]) & (committed < steps[col + 1]) & before_stop
        assert torch.equal(estimate.token_mask[r], targets)
        state = tree.state(out.completion_ids[i], committed, col, model.mask_id)
        x = torch.cat((ids[i], state))[None]
        key_valid = torch.cat((mask[i].bool(), torch.ones(12, dtype=torch.bool)))[None]
        with torch.no_grad():
            logp = torch.log_softmax(model.logits(x, attention_mask=key_valid)[0, prompt_len:].double(), dim=-1)
        want = torch.where(targets, logp.gather(-1, out.completion_ids[i][:, None])[:, 0], 0.0)
        torch.testing.assert_close(estimate.token_logp[r], want, rtol=0, atol=1e-10)
        parents[int(estimate.row_group[r])].add(int(tree.parent[i, col]) + 100 * (i // SCHEME.leaves))
    assert all(len(slots) == 1 for slots in parents.values()) and len(parents) == 14  # 7 parents per prompt


def test_replay_stops_at_the_childs_first_stop_token(model) -> None:
    """A hand-made tree (N = 1, b = 2, steps 0 | 2 | 4): leaf 1's child state holds a stop token at position 1, so
    its transition's targets end there; the transition into the depth-1 node sees no stop token before step 2."""
    eos = model.stop_ids[0]
    completion = torch.tensor([[4, 5, 6, 7], [4, eos, 6, 7]])
    unmask_step = torch.tensor([[0, 2, 1, 3], [0, 3, 1, 2]])
    records = {
        "tree_steps": torch.tensor([[0, 2, 4]] * 2),
        "tree_node": torch.tensor([[0, 0, 0], [0, 0, 1]]),
        "tree_parent": torch.tensor([[0, 1], [0, 1]]),
        "tree_order": torch.tensor([[1, 0]] * 2),
    }
    ids, mask = model.encode_prompts(["hi", "hi"], chat_template=False)
    batch = SequenceBatch(ids, mask, completion, model.completion_mask(completion), unmask_step, records)
    estimator = TreeTransitions()
    with torch.no_grad():
        estimate = estimator.evaluate(model, batch, estimator.draw(batch, _gen(0)))
    assert estimate.row_to_seq.tolist() == [0, 0, 1] and estimate.row_column.tolist() == [0, 1, 1]
    assert estimate.token_mask.tolist() == [[True, False, True, False], [False, True, False, True],
                                            [False, True, False, False]]  # fmt: skip
    assert estimate.row_group.tolist() == [0, 1, 1]  # the two leaves are siblings
    # the parents' order shared out over the inner iterations: one run per parent, or several parents per iteration
    assert [estimator.draw_for(batch, _gen(0), it, 4).parents.tolist() for it in range(4)] == [[1], [1], [0], [0]]
    assert [estimator.draw_for(batch, _gen(0), 0, 1).parents.tolist()] == [[1, 0]]
    with torch.no_grad():
        root_only = estimator.evaluate(model, batch, estimator.draw_for(batch, _gen(0), 2, 4))
    assert root_only.row_to_seq.tolist() == [0] and root_only.row_column.tolist() == [0]


# ------------------------------------------------------------------------------------------------- wiring
TREE_OPTIONS = {"num_tree_samples": 2, "tree_branch_factor": 2, "tree_contraction_factor": 2}  # 4 leaves


def test_official_defaults_and_options() -> None:
    method = build_baseline("dtreerpo")
    c = method.config
    assert (c.beta, c.epsilon, c.num_tree_samples, c.tree_branch_factor, c.tree_contraction_factor) == (
        0.04, 0.2, 1, 2, 4)  # fmt: skip
    assert (c.self_distillation_lambda_max, c.self_distillation_gamma, c.self_distillation_tau_max) == (3e-3, 2.0, 2.0)
    assert c.self_distillation_beta == 0.7 and c.enable_self_distillation_loss and c.coupled
    assert method.estimator() == TreeTransitions() and method.rollout() == TreeBranches()
    assert method.rollout().leaves == 8 and method.advantage_record()["rule"] == "dtreerpo_tree"
    method.require_groups(8)
    with pytest.raises(UserError, match="leaves"):
        method.require_groups(4)
    for options, match in (
        ({"coupled": False}, "coupled"),
        ({"epsilon": 1.0}, "epsilon"),
        ({"self_distillation_gamma": 0.0}, "gamma"),
        ({"tree_branch_factor": 0}, "branch_factor"),
    ):
        with pytest.raises(UserError, match=match):
            build_baseline("dtreerpo", **options)


def test_baseline_advantages_need_the_tree() -> None:
    method = build_baseline("dtreerpo", **TREE_OPTIONS)
    records = {
        "tree_steps": torch.tensor([[0, 4, 8]] * 4),
        "tree_node": torch.tensor([[0, 0, 0], [0, 0, 1], [0, 2, 2], [0, 2, 3]]),
        "tree_parent": torch.tensor([[0, 1], [0, 1], [0, 2], [0, 2]]),
        "tree_order": torch.tensor([[2, 0, 1]] * 4),
    }
    advantages, keep = method.advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.zeros(4), records=records)
    assert advantages.tolist() == [[-0.5, 1.0], [-0.5, -1.0], [0.5, 0.0], [0.5, 0.0]] and keep.all()
    with pytest.raises(UserError, match="tree_branches"):
        method.advantages(torch.zeros(4), torch.zeros(4))
    shuffled = {**records, "tree_node": records["tree_node"][[1, 0, 2, 3]]}
    with pytest.raises(UserError, match="tree order"):
        method.advantages(torch.zeros(4), torch.zeros(4), records=shuffled)


def _config(tmp_path, attention: str, budget, **overrides) -> TrainConfig:
    """A tiny d-TreeRPO run on Sudoku, 4 leaves per prompt (EGSPO's tiny run, another method)."""
    options = {"baseline": "dtreerpo", "baseline_options": TREE_OPTIONS, **overrides}
    return egspo_config(tmp_path, attention, budget, **options)


def test_the_trainer_rewards_the_leaves_and_trains_each_parents_transitions(tmp_path) -> None:
    budget = small_budget(max_steps=2, num_iterations=2, diffusion_steps=8, max_completion_length=16)
    trainer, mb, scored = recorded_rollout(_config(tmp_path, "full", budget, per_device_prompts=2))
    rows = budget.prompts_per_step * budget.num_generations
    tree = TreeRecords.of(mb.batch.records)
    assert tree.node.shape == (rows, 3) and tree.steps.tolist() == [0, 4, 8] and len(scored) == 1
    rewards = torch.tensor([len(text) % 3 for text in scored[0]], dtype=torch.float32)
    torch.testing.assert_close(mb.advantages.cpu(), dtreerpo_advantages(rewards, 2, 2, 2))
    # 3 parents per prompt (the root and its 2 children), shared out over mu = 2: the first, then the other two
    order = tree.order.tolist()
    assert [noise.parents.tolist() for noise in mb.noises] == [order[:1], order[1:]]
    # iteration 1's rollout-policy rows: every child of those two parents, for both prompts (2 + 2 per prompt)
    old = mb.old[1]
    slots = tree.parent[old.row_to_seq.cpu(), old.row_column.cpu()]
    assert mb.old[0] is None and sorted(set(slots.tolist())) == sorted(order[1:]) and old.row_to_seq.shape[0] == 8
    for iteration in range(2):
        loss, metrics = trainer._micro_loss(mb, iteration)
        assert math.isfinite(loss.item()) and "kl" in metrics and "self_distillation" in metrics


def test_a_training_step_on_the_tiny_model(tmp_path) -> None:
    budget = small_budget(max_steps=1, num_iterations=1, diffusion_steps=8, max_completion_length=16)
    assert_a_step_trains(_config(tmp_path, "full", budget, baseline_options={**TREE_OPTIONS, "beta": 0.0}))


def test_the_trainer_refuses_what_the_tree_cannot_use(tmp_path) -> None:
    with pytest.raises(UserError, match="full-attention"):
        RLTrainer(_config(tmp_path, "block", small_budget(block_length=4)))
    with pytest.raises(UserError, match="leaves"):
        RLTrainer(_config(tmp_path, "full", small_budget(num_generations=2)))
