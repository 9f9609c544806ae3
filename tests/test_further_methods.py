"""The methods beyond the paper's five (CJ-GRPO, AGRPO, JustGRPO, GDSD, BGPO): each loss against values worked out by
hand (derivations in the comments, checked with plain Python floats) and against a slow loop written here from the
official code's formulas one term at a time, with its gradients; how each baseline is wired.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_losses import close

from stabledrl_bench.baselines.agrpo import agrpo_loss
from stabledrl_bench.baselines.bgpo import bgpo_loss
from stabledrl_bench.baselines.cj_grpo import cj_grpo_loss
from stabledrl_bench.baselines.gdsd import gdsd_loss
from stabledrl_bench.baselines.justgrpo import justgrpo_loss
from stabledrl_bench.core.baseline import LossInputs, build_baseline
from stabledrl_bench.core.estimators import (
    ARReplay,
    DenoisePair,
    Estimate,
    StratifiedElbo,
    TraceReplay,
    TraceSample,
)
from stabledrl_bench.errors import UserError

# ----------------------------------------------------------------------------------------------- CJ-GRPO
# Two sequences (A = 1, -2) replayed in two steps each; eps 0.5. Rows (sequence, step, log-ratios of its targets):
#   (0, 0, [0.2]) -> -1.2214028;  (0, 1, [0.0]) -> -1;  (1, 0, [-0.5]) -> +1.2130613;  (1, 1, [0.7, 0.1]) -> +4.0275054,
#   +2.2103418 (rho = e^0.7 passes unclipped for A < 0). Step 0: (-1.2214028 + 1.2130613) / 2 = -0.0041708; step 1:
#   (-1 + 4.0275054 + 2.2103418) / 3 = 1.7459491; loss = mean of the steps = 0.8708892 (a plain token mean over the
#   5 tokens would give 1.0459012).
CJ_MASK = torch.tensor([[True, False, False], [False, False, True], [True, False, False], [False, True, True]])
CJ_LOG_RATIO = torch.tensor([[0.2, 9.0, 9.0], [9.0, 9.0, 0.0], [-0.5, 9.0, 9.0], [9.0, 0.7, 0.1]])
CJ_ADV = torch.tensor([1.0, 1.0, -2.0, -2.0])
CJ_STEP = torch.tensor([0, 1, 0, 1])


def test_cj_grpo_hand_values() -> None:
    logp = torch.full((4, 3), -1.0)
    loss, m = cj_grpo_loss(logp, logp - CJ_LOG_RATIO, None, CJ_MASK, CJ_ADV, CJ_STEP, epsilon=0.5, beta=0.0)
    assert close(loss.item(), 0.8708892) and close(m["clip_ratio"], 0.0)
    assert close(m["ratio_max"], math.exp(0.7))


def test_cj_grpo_baseline_groups_replay_rows_by_step() -> None:
    """Through the registered baseline: the rows' steps come from their place in the replay (sequence-major)."""
    logp = torch.full((4, 3), -1.0)
    new = Estimate(token_logp=logp, token_mask=CJ_MASK, row_to_seq=torch.tensor([0, 0, 1, 1]))
    old = Estimate(token_logp=logp - CJ_LOG_RATIO)
    inputs = LossInputs(new, old, None, torch.tensor([1.0, -2.0]), torch.ones(2, 3, dtype=torch.bool), torch.zeros(2))
    loss, _ = build_baseline("cj_grpo", beta=0.0).loss(inputs)
    assert close(loss.item(), 0.8708892)


def slow_token_ppo(logp, old, ref, mask, adv, eps, beta, kl_times_ratio=False):
    """{(row, token): l} with l = -min(rho A, clip(rho) A) + beta KL3 (x rho), one scalar at a time."""
    terms = {}
    for r in range(logp.shape[0]):
        for k in range(logp.shape[1]):
            if not mask[r, k]:
                continue
            rho = torch.exp(logp[r, k] - old[r, k])
            term = -torch.minimum(rho * adv[r], torch.clamp(rho, 1 - eps, 1 + eps) * adv[r])
            if beta:
                x = ref[r, k] - logp[r, k]
                kl = torch.exp(x) - x - 1
                term = term + beta * (kl * rho if kl_times_ratio else kl)
            terms[(r, k)] = term
    return terms


def random_rows(seed: int, rows: int = 6, length: int = 5):
    gen = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(rows, length, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    old = logp.detach() + torch.randn(rows, length, generator=gen, dtype=torch.float64) * 0.4
    ref = logp.detach() + torch.randn(rows, length, generator=gen, dtype=torch.float64) * 0.3
    mask = torch.rand(rows, length, generator=gen) < 0.6
    mask[:, 0] = True
    adv = torch.randn(rows, generator=gen, dtype=torch.float64)
    return logp, old, ref, mask, adv


def assert_same_loss_and_grad(fast: torch.Tensor, slow: torch.Tensor, leaf: torch.Tensor) -> None:
    (g_fast,) = torch.autograd.grad(fast, leaf, retain_graph=True)
    (g_slow,) = torch.autograd.grad(slow, leaf)
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(g_fast, g_slow)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cj_grpo_against_slow_loop(seed: int) -> None:
    logp, old, ref, mask, adv = random_rows(seed)
    step = torch.tensor([0, 1, 2, 0, 1, 0])  # sequences with 3, 2 and 1 replay steps
    loss, _ = cj_grpo_loss(logp, old, ref, mask, adv, step, epsilon=0.5, beta=0.04)
    terms = slow_token_ppo(logp, old, ref, mask, adv, 0.5, 0.04)
    per_step = []
    for s in sorted(set(step.tolist())):
        chosen = [v for (r, _), v in terms.items() if step[r] == s]
        per_step.append(sum(chosen) / len(chosen))
    assert_same_loss_and_grad(loss, sum(per_step) / len(per_step), logp)


# ----------------------------------------------------------------------------------------------- AGRPO
# K = 2 sampled steps for each of 2 sequences (A = 1, -2), eps 0.2; objectives: row 0: e^0.1 = 1.1051709 and
# e^0.3 = 1.3498588 clipped to 1.2; row 1: e^-0.1 = 0.9048374; row 2: e^0.2 A = -2.4428055 (passes, A < 0); row 3:
# e^-0.4 = 0.6703200 < 0.8, clipped: -1.6. Loss = -(1.1051709 + 1.2 + 0.9048374 - 2.4428055 - 1.6) / 4 = 0.2081993.
def test_agrpo_hand_values() -> None:
    mask = torch.tensor([[True, True], [True, False], [True, False], [True, False]])
    log_ratio = torch.tensor([[0.1, 0.3], [-0.1, 5.0], [0.2, 5.0], [-0.4, 5.0]])
    logp = torch.full((4, 2), -0.5)
    adv = torch.tensor([1.0, 1.0, -2.0, -2.0])
    loss, m = agrpo_loss(logp, logp - log_ratio, None, mask, adv, epsilon=0.2, beta=0.0)
    assert close(loss.item(), 0.2081993) and close(m["clip_ratio"], 2 / 5)


@pytest.mark.parametrize("seed", [0, 1])
def test_agrpo_against_slow_loop_with_the_ratio_weighted_kl(seed: int) -> None:
    logp, old, ref, mask, adv = random_rows(seed)
    loss, _ = agrpo_loss(logp, old, ref, mask, adv, epsilon=0.2, beta=0.1)
    terms = slow_token_ppo(logp, old, ref, mask, adv, 0.2, 0.1, kl_times_ratio=True)
    assert_same_loss_and_grad(loss, sum(terms.values()) / logp.shape[0], logp)


# ----------------------------------------------------------------------------------------------- JustGRPO
# Three completions on a canvas of L = 2 replayed left to right (2 rows each, one target per row), A = 1.5, -0.5, 0;
# eps 0.2. Objectives: 1.5 e^0.1 = 1.6577564; 1.5 x 1.2 (e^0.3 clipped); -0.5 x 0.8 (e^-0.3 = 0.7408182 clipped);
# -0.5 e^0.2 = -0.6107014 (passes); A = 0 rows give 0. V = 2 completions with A != 0:
# loss = -(1.6577564 + 1.8 - 0.4 - 0.6107014) / (2 (2 + 1e-5)) = -0.6117607.
def test_justgrpo_hand_values() -> None:
    log_ratio = torch.tensor([0.1, 0.3, -0.3, 0.2, 0.9, -0.9])
    mask = torch.tensor([[True, False], [False, True]] * 3)
    logp = torch.full((6, 2), -0.7)
    old = logp - torch.stack((log_ratio, log_ratio), dim=1)
    rows = torch.tensor([0, 0, 1, 1, 2, 2])
    loss, _ = justgrpo_loss(logp, old, mask, torch.tensor([1.5, -0.5, 0.0]), rows, canvas=2, epsilon=0.2)
    assert close(loss.item(), -0.6117607)


def test_justgrpo_against_slow_loop() -> None:
    logp, old, _, mask, _ = random_rows(3)
    adv = torch.tensor([0.5, -1.25, 0.0], dtype=torch.float64)
    rows = torch.tensor([0, 0, 1, 1, 2, 2])
    loss, _ = justgrpo_loss(logp, old, mask, adv, rows, canvas=5, epsilon=0.2)
    terms = slow_token_ppo(logp, old, None, mask, adv[rows], 0.2, 0.0)
    valid = sum(1 for a in adv.tolist() if a != 0)
    assert_same_loss_and_grad(loss, sum(terms.values()) / (5 * (valid + 1e-5)), logp)


# ----------------------------------------------------------------------------------------------- GDSD
# B = 2, K = 2, L = 4, eps 0.1 (clamp to [log 0.9, log 1.1] = [-0.1053605, 0.0953102]), psi 2, A = 0.5, -0.25.
# Changes D - D_old: 0.05, -0.2 (clamped to -0.1053605), 0.0, 0.2 (clamped to 0.0953102); targets psi A = 1, -0.5:
# (0.0125 - 1)^2 + (-0.0263401 - 1)^2 + 0.5^2 + (0.0238275 + 0.5)^2 = 2.5529256 over B = 2 -> 1.2764628. KL: D - D_ref
# = 0.1, 0, -0.1, 0 -> 0.5 (0.01 + 0.01) / (B K L = 16) = 0.000625, times beta 0.5 -> total 1.2767753.
GDSD_SAMPLES = torch.tensor([[-10.0, -12.0], [-8.0, -9.0]], dtype=torch.float64)
GDSD_OLD = torch.tensor([[-10.05, -11.8], [-8.0, -9.2]], dtype=torch.float64)
GDSD_REF = torch.tensor([[-10.1, -12.0], [-7.9, -9.0]], dtype=torch.float64)
GDSD_ADV = torch.tensor([0.5, -0.25], dtype=torch.float64)


def test_gdsd_hand_values() -> None:
    options = {"canvas": 4, "epsilon": 0.1, "psi": 2.0}
    loss, m = gdsd_loss(GDSD_SAMPLES, GDSD_OLD, None, GDSD_ADV, beta=0.0, **options)
    assert close(loss.item(), 1.2764628) and close(m["clip_ratio"], 0.5)
    loss, m = gdsd_loss(GDSD_SAMPLES, GDSD_OLD, GDSD_REF, GDSD_ADV, beta=0.5, **options)
    assert close(loss.item(), 1.2767753) and close(m["kl"], 0.000625)


def test_gdsd_against_slow_loop_and_its_clamp_cuts_the_gradient() -> None:
    samples = GDSD_SAMPLES.clone().requires_grad_()
    loss, _ = gdsd_loss(samples, GDSD_OLD, GDSD_REF, GDSD_ADV, canvas=4, epsilon=0.1, psi=2.0, beta=0.5)
    lo, hi = math.log(0.9), math.log(1.1)
    slow = 0.0
    for i in range(2):
        for j in range(2):
            change = torch.clamp(samples[i, j] - GDSD_OLD[i, j], lo, hi)
            slow = slow + (change / 4 - 2.0 * GDSD_ADV[i]) ** 2 / 2
            slow = slow + 0.5 * 0.5 * (samples[i, j] - GDSD_REF[i, j]) ** 2 / 16
    assert_same_loss_and_grad(loss, slow, samples)
    (grad,) = torch.autograd.grad(
        gdsd_loss(samples, GDSD_OLD, None, GDSD_ADV, canvas=4, epsilon=0.1, beta=0.0)[0], samples
    )
    assert grad[0, 1].item() == 0 and grad[1, 1].item() == 0  # the two clamped changes
    # at the first inner step (D = D_old) the gradient is REINFORCE's, -2 psi A / (L B)
    (grad,) = torch.autograd.grad(
        gdsd_loss(samples, samples.detach(), None, GDSD_ADV, canvas=4, psi=2.0, beta=0.0)[0], samples
    )
    torch.testing.assert_close(grad, (-2 * 2.0 * GDSD_ADV / (4 * 2))[:, None].expand(2, 2))


# ----------------------------------------------------------------------------------------------- BGPO
# B = 3 (A = 1, -2, 0), K = 2, L = 2, lengths 2, 1, 2, eps 0.2, c = 3; per-token changes dl = (E - E_old) / L:
#   A = 1:  dl = 0.1 -> r = 1 + dl = 1.1 -> -1.1;  dl = 0.5 -> 1.5, clipped at 1.2 -> -1.2;  mean -1.15
#   A = -2: dl = -0.5 -> e^-0.5 = 0.6065307 < 0.8 -> 2 x 0.8 = 1.6;  dl = 1.5 -> e^1.5 = 4.4816891 > c -> 2 x 3 = 6;
#           mean 3.8
#   A = 0: 0.  Length-weighted: (2 x -1.15 + 1 x 3.8 + 2 x 0) / 5 = 0.3
BGPO_CHANGE = torch.tensor([[0.1, 0.5], [-0.5, 1.5], [0.3, -0.3]], dtype=torch.float64)
BGPO_ADV = torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64)
BGPO_LENGTHS = torch.tensor([2, 1, 2])


def test_bgpo_hand_values() -> None:
    old = torch.full((3, 2), -20.0, dtype=torch.float64)
    loss, m = bgpo_loss(old + 2 * BGPO_CHANGE, old, BGPO_ADV, BGPO_LENGTHS, canvas=2)
    assert close(loss.item(), 0.3)
    assert close(m["clip_ratio"], 2 / 6) and close(m["clip_ratio_dual"], 1 / 6)


def slow_bgpo(samples, old, adv, lengths, canvas, eps=0.2, c=3.0):
    """DARE's ``compute_policy_loss_bgpo`` transcribed term by term (log(1 + dl) for A > 0, PPO max, dual-clip min),
    with verl's token mean over a per-sequence value broadcast to its valid tokens, averaged over the samples."""
    total = 0.0
    for j in range(samples.shape[1]):
        num, den = 0.0, 0
        for i in range(samples.shape[0]):
            dl = (samples[i, j] - old[i, j]) / canvas
            log_ratio = torch.log(1 + dl) if adv[i] > 0 else dl
            ratio = torch.exp(log_ratio)
            pg1, pg2 = -adv[i] * ratio, -adv[i] * torch.clamp(ratio, 1 - eps, 1 + eps)
            clipped = torch.maximum(pg1, pg2)
            pg = torch.minimum(-adv[i] * c, clipped) if adv[i] < 0 else clipped
            num, den = num + pg * int(lengths[i]), den + int(lengths[i])
        total = total + num / den
    return total / samples.shape[1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bgpo_against_a_transcription_of_the_official_loss(seed: int) -> None:
    """Every region of the piecewise loss: A > 0 below / inside / above the clip, A < 0 below the clip, inside, and
    beyond the dual clip c (log 3 = 1.0986), A = 0."""
    gen = torch.Generator().manual_seed(seed)
    grid = torch.tensor([-0.9, -0.3, -0.1, 0.05, 0.15, 0.3, 0.8, 1.5], dtype=torch.float64)
    change = grid + 0.01 * torch.randn(6, 8, generator=gen, dtype=torch.float64)
    old = -torch.rand(6, 8, generator=gen, dtype=torch.float64) * 30
    samples = (old + 8 * change).requires_grad_()
    adv = torch.tensor([1.5, -0.5, 0.0, 2.0, -1.0, 0.25], dtype=torch.float64)
    lengths = torch.randint(1, 9, (6,), generator=gen)
    loss, _ = bgpo_loss(samples, old, adv, lengths, canvas=8)
    assert_same_loss_and_grad(loss, slow_bgpo(samples, old, adv, lengths, 8), samples)


def test_bgpo_stays_finite_where_the_official_log_is_nan() -> None:
    """A > 0 with 1 + dl <= 0: DARE's log(1 + dl) is NaN; the linear term -A (1 + dl) keeps its gradient -A / L."""
    samples = torch.tensor([[-30.0]], dtype=torch.float64, requires_grad=True)
    loss, _ = bgpo_loss(
        samples, torch.tensor([[-26.0]], dtype=torch.float64), torch.tensor([1.0]), torch.tensor([3]), canvas=2
    )
    (grad,) = torch.autograd.grad(loss, samples)
    assert close(loss.item(), 1.0) and close(grad.item(), -0.5)  # dl = -2: -(1 - 2) = 1


# ----------------------------------------------------------------------------------------------- wiring
@pytest.mark.parametrize(
    ("name", "estimator", "advantage", "options", "needs_ref"),
    [
        ("cj_grpo", TraceReplay(shrink=1, post_num=None), "group_mean", {}, True),
        ("agrpo", TraceSample(num_mc=24, low_discrepancy=True), "group_mean", {}, False),
        ("justgrpo", ARReplay(), "reward_zscore", {"epsilon": 1e-4}, False),
        ("gdsd", DenoisePair(num_mc=1, inverse_t=False), "leave_one_out", {}, True),
        ("bgpo", StratifiedElbo(num_mc=16), "reward_zscore", {"epsilon": 1e-6}, False),
    ],
)
def test_each_further_method_declares_its_official_pieces(name, estimator, advantage, options, needs_ref) -> None:
    baseline = build_baseline(name)
    assert baseline.estimator() == estimator and baseline.advantage == advantage
    assert baseline.advantage_options() == options and baseline.needs_ref == needs_ref and baseline.needs_old
    assert baseline.config.coupled


def test_options_reach_the_estimators() -> None:
    assert build_baseline("gdsd", tlc=True, num_mc=2).estimator() == DenoisePair(num_mc=2, inverse_t=True)
    assert build_baseline("agrpo", num_mc=3, low_discrepancy=False).estimator() == TraceSample(
        num_mc=3, low_discrepancy=False
    )
    assert build_baseline("bgpo", num_mc=4).estimator() == StratifiedElbo(num_mc=4)


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("justgrpo", {"beta": 0.04}, "beta must be 0"),
        ("bgpo", {"beta": 0.01}, "beta must be 0"),
        ("bgpo", {"epsilon_low": 1.0}, "epsilon_low"),
        ("bgpo", {"clip_ratio_c": 0.5}, "clip_ratio_c"),
        ("gdsd", {"epsilon": 0.0}, "epsilon"),
        ("agrpo", {"num_mc": 0}, "num_mc"),
        ("cj_grpo", {"post_num": 2}, "unknown option"),
    ],
)
def test_bad_options_are_one_user_error(name, options, match) -> None:
    with pytest.raises(UserError, match=match):
        build_baseline(name, **options).estimator()
