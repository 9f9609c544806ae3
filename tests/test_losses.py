"""RL losses: hand-computed values on tiny tensors and gradient properties with torch.autograd.

The hand values were worked out term by term (derivations in the comments) and cross-checked with a plain
Python float calculation; nothing here is produced by the code under test.
"""

import math

import pytest
import torch
from conftest import BUILTIN_BASELINES

from stabledrl_bench.baselines.espo import espo_loss
from stabledrl_bench.baselines.gdpo import gdpo_loss
from stabledrl_bench.baselines.grpo import grpo_loss
from stabledrl_bench.baselines.spg import sandwich_bound, spg_loss
from stabledrl_bench.baselines.stabledrl import importance_weights, log_importance_weights, stabledrl_loss
from stabledrl_bench.baselines.trado import trado_loss
from stabledrl_bench.baselines.wd1 import wd1_loss
from stabledrl_bench.core.advantages import compute_dtype
from stabledrl_bench.core.baseline import LossInputs, build_baseline
from stabledrl_bench.core.estimators import Estimate
from stabledrl_bench.core.losses import (
    anchor_kl,
    conditional_clip,
    k2_kl,
    k3_kl,
    length_weighted,
    mean_over_groups,
    row_mean,
    scaled_exp,
    sequence_mean,
    token_mean,
)
from stabledrl_bench.errors import UserError


def close(actual: float, expected: float, tol: float = 1e-5) -> bool:
    return math.isclose(actual, expected, rel_tol=tol, abs_tol=tol)


# ----------------------------------------------------------------------------------------------------- GRPO (d1)
# Two sequences, three tokens, the last token of sequence 1 is padding; eps = 0.5.
#   seq 0 (A = +1): log rho = 0.2, 0.5, 0 -> rho 1.221403, 1.648721 (> 1.5: clipped to 1.5), 1
#   seq 1 (A = -2): log rho = -0.5, 0.7 -> rho 0.606531 (-> -1.213061), 2.013753 (-> min(-4.027505, -3) = -4.027505:
#                   the unclipped term passes, the conditional-clipping bypass)
#   loss = -(1.221403 + 1.5 + 1 - 1.213061 - 4.027505) / 5 = 0.303833; clip_ratio = 1/5
GRPO_LOGP = torch.tensor([[-1.0, -0.5, -0.5], [-1.5, -0.2, 0.0]])
GRPO_OLD = torch.tensor([[-1.2, -1.0, -0.5], [-1.0, -0.9, 0.0]])
GRPO_REF = torch.tensor([[-1.1, -0.4, -0.5], [-1.5, -0.3, 0.0]])
GRPO_MASK = torch.tensor([[True, True, True], [True, True, False]])
GRPO_ADV = torch.tensor([1.0, -2.0])


def test_grpo_hand_values() -> None:
    loss, m = grpo_loss(GRPO_LOGP, GRPO_OLD, None, GRPO_MASK, GRPO_ADV, epsilon=0.5, beta=0.0)
    assert close(loss.item(), 0.3038328) and close(m["clip_ratio"], 0.2)
    assert close(m["ratio_max"], math.exp(0.7)) and close(m["drift"], (0.2 + 0.5 + 0 + 0.5 + 0.7) / 5)
    # k3 terms x = ref - logp: -0.1, 0.1, 0, 0, -0.1 -> e^x - x - 1 = .0048374, .0051709, 0, 0, .0048374; mean .0029692
    loss, m = grpo_loss(GRPO_LOGP, GRPO_OLD, GRPO_REF, GRPO_MASK, GRPO_ADV, epsilon=0.5, beta=0.04)
    assert close(loss.item(), 0.3038328 + 0.04 * 0.0029692) and close(m["kl"], 0.0029692)


def test_grpo_padding_garbage_does_not_leak() -> None:
    old = GRPO_OLD.clone()
    old[1, 2] = -math.inf  # off-mask position: must not reach the loss or the gradient
    logp = GRPO_LOGP.clone().requires_grad_()
    loss, _ = grpo_loss(logp, old, None, GRPO_MASK, GRPO_ADV, epsilon=0.5, beta=0.0)
    loss.backward()
    assert close(loss.item(), 0.3038328) and torch.isfinite(logp.grad).all() and logp.grad[1, 2] == 0


@pytest.mark.parametrize("rho", [10.0, 100.0, 1e5])
def test_grpo_conditional_clip_lets_negative_outlier_through(rho: float) -> None:
    # One token, A = -1, rho >> 1 + eps: min(-rho, -1.5) = -rho, so loss = rho and d loss / d logp = rho.
    logp = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    old = torch.full((1, 1), -math.log(rho), dtype=torch.float64)
    loss, m = grpo_loss(logp, old, None, torch.ones(1, 1, dtype=torch.bool), torch.tensor([-1.0]), beta=0.0)
    loss.backward()
    assert close(logp.grad.item(), rho, 1e-4) and m["clip_ratio"] == 0.0
    # The same outlier with A > 0 is clipped: zero gradient.
    logp.grad = None
    loss, m = grpo_loss(logp, old, None, torch.ones(1, 1, dtype=torch.bool), torch.tensor([1.0]), beta=0.0)
    loss.backward()
    assert logp.grad.item() == 0.0 and m["clip_ratio"] == 1.0
    # StableDRL with the same outlier (group of 2, the other ratio 1): weight min(rho, 5) / (min(rho, 5) + 1) <= 5/6,
    # so the gradient on its bound stays below |A| = 1 whatever rho is.
    elbo = torch.tensor([-1.0, -1.0], requires_grad=True)
    old_elbo = torch.tensor([-1.0 - math.log(rho), -1.0])
    loss, _ = stabledrl_loss(
        elbo, None, old_elbo, torch.tensor([-1.0, 1.0]), torch.zeros(2, dtype=torch.long), logp_estimation="elbo"
    )
    loss.backward()
    assert close(elbo.grad[0].item(), min(rho, 5.0) / (min(rho, 5.0) + 1))


def test_kl_estimators() -> None:
    torch.testing.assert_close(
        k3_kl(torch.tensor([0.5, -1.0, 0.0])), torch.tensor([math.exp(0.5) - 1.5, math.exp(-1.0), 0.0])
    )
    # dLLM-RL clamps the exponent only: x = -12 -> e^-10 + 12 - 1
    torch.testing.assert_close(k3_kl(torch.tensor([-12.0]), exp_clamp=10.0), torch.tensor([math.exp(-10.0) + 11.0]))
    torch.testing.assert_close(k2_kl(torch.tensor([2.0, -0.5])), torch.tensor([2.0, 0.125]))


def test_the_shared_anchor_by_hand() -> None:
    """k3 of the per-token sequence log-ratio (E_ref - E_theta) / L, averaged over sequences, and its gradient."""
    elbo = torch.tensor([-10.0, -20.0, -6.0], requires_grad=True)
    ref = torch.tensor([-12.0, -20.0, -2.0])
    # x = (-12 + 10) / 4 = -0.5, 0, (-2 + 6) / 4 = 1: k3 = e^-0.5 + 0.5 - 1, 0, e^1 - 1 - 1
    expected = (math.exp(-0.5) - 0.5 + (math.exp(1.0) - 2.0)) / 3
    value = anchor_kl(elbo, ref, length=4)
    torch.testing.assert_close(value, torch.tensor(expected))
    value.backward()
    # d/dE k3((r - E) / L) = (1 - e^x) / L, and 1/3 for the mean: zero where the policy equals the reference
    grads = [(1 - math.exp(x)) / 4 / 3 for x in (-0.5, 0.0, 1.0)]
    torch.testing.assert_close(elbo.grad, torch.tensor(grads))


# ----------------------------------------------------------------------------------------------------------- ESPO
def test_espo_hand_values() -> None:
    # L = 4. log rho = (E - E_old) / 4 = 0.1, -0.5, 0 -> rho 1.105171, 0.606531, 1
    # A = 1, -1, 0.5: 1.105171 (inside), min(-0.606531, -0.8) = -0.8 (clipped), 0.5 -> policy = -0.805171/3
    # k2: (E - E_ref) = -1, 0, 2 -> 0.5 + 0 + 2 = 2.5, / (b L = 12) = 0.208333
    elbo, old, ref = (
        torch.tensor([-10.0, -8.0, -20.0]),
        torch.tensor([-10.4, -6.0, -20.0]),
        torch.tensor([-9.0, -8, -22]),
    )
    loss, m = espo_loss(elbo, old, ref, torch.tensor([1.0, -1.0, 0.5]), max_completion_length=4, epsilon=0.2, beta=0.1)
    assert close(loss.item(), -0.2683903 + 0.1 * 0.2083333) and close(m["kl"], 0.2083333)
    assert close(m["clip_ratio"], 1 / 3) and close(m["ratio_max"], math.exp(0.1))


@pytest.mark.parametrize(
    ("log_rho", "adv", "clipped"),
    [
        (math.log(1.19), 1.0, False),  # inside, A > 0: gradient rho A / L
        (math.log(1.21), 1.0, True),  # above 1 + eps with A > 0: clipped, zero gradient
        (math.log(1.21), -1.0, False),  # above with A < 0: the unclipped term wins (bypass)
        (math.log(0.81), -1.0, False),  # inside, A < 0
        (math.log(0.79), -1.0, True),  # below 1 - eps with A < 0: clipped
        (math.log(0.79), 1.0, False),  # below with A > 0: unclipped
    ],
)
def test_espo_clip_boundaries(log_rho: float, adv: float, clipped: bool) -> None:
    length = 8
    elbo = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    old = torch.tensor([-log_rho * length], dtype=torch.float64)
    loss, m = espo_loss(elbo, old, None, torch.tensor([adv]), max_completion_length=length, epsilon=0.2, beta=0.0)
    loss.backward()
    expected = 0.0 if clipped else -adv * math.exp(log_rho) / length
    assert close(elbo.grad.item(), expected) and m["clip_ratio"] == float(clipped)


# ---------------------------------------------------------------------------------------------------------- TraDo
# Two replay rows of L1 = 4 positions; row 0 belongs to sequence 1 (A = -0.5), row 1 to sequence 0 (A = +1).
#   row 0 targets {0, 1}: delta 0.5, -1 -> rho 1.648721 (A<0: -0.824361 passes), 0.367879 (A<0: clipped to -0.4)
#   row 1 targets {2, 3}: delta -0.2, 12 -> clamped to 10 -> rho 0.818731, e^10 (A>0: clipped to 1.2)
#   policy ("length") = -((-1.224361) / 4 + 2.018731 / 4) / 2 = -0.0992963
#   k3 vs old with the unclamped delta: 0.106531 + 0.718282 ; 0.0214028 + (e^-10 + 11) -> (0.206203 + 2.755362) / 2
TRADO_LOGP = torch.tensor([[-1.0, -2.0, 0.0, 0.0], [0.0, 0.0, -0.3, -3.0]])
TRADO_OLD = torch.tensor([[-1.5, -1.0, 0.0, 0.0], [0.0, 0.0, -0.1, -15.0]])
TRADO_MASK = torch.tensor([[True, True, False, False], [False, False, True, True]])


def test_trado_hand_values_through_the_baseline() -> None:
    baseline = build_baseline("trado")
    estimate = Estimate(token_logp=TRADO_LOGP, token_mask=TRADO_MASK, row_to_seq=torch.tensor([1, 0]))
    inputs = LossInputs(
        new=estimate,
        old=Estimate(token_logp=TRADO_OLD),
        ref=None,
        advantages=torch.tensor([1.0, -0.5]),
        completion_mask=torch.ones(2, 4, dtype=torch.bool),
        group_ids=torch.tensor([0, 0]),
    )
    loss, m = baseline.loss(inputs)
    assert close(loss.item(), -0.0992963 + 0.01 * 1.4807826) and close(m["kl"], 1.4807826)
    assert close(m["clip_ratio"], 0.5) and not baseline.needs_ref


def test_trado_counts_answers_that_nearly_fill_the_canvas_as_wrong() -> None:
    # canvas 12, margin 5 (dLLM-RL): lengths 6 and 7 pass, 7 is the boundary (>= 12 - 5), 12 = no stop token
    correct = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0])
    lengths = torch.tensor([0, 6, 7, 3, 12])
    flags = build_baseline("trado").correctness(correct, lengths, canvas=12)
    assert flags.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert build_baseline("trado", overlong_margin=None).correctness(correct, lengths, 12).tolist() == correct.tolist()
    assert build_baseline("grpo").correctness(correct, lengths, 12) is correct  # other methods: the grader's


def test_trado_targets_normalisation() -> None:
    # LLaDA script: policy / |P_r| = 2 per row, KL summed over targets: (0.824812 + 11.021448) / 2 rows
    adv = torch.tensor([-0.5, 1.0])
    loss, m = trado_loss(TRADO_LOGP, TRADO_OLD, TRADO_MASK, adv, normalize="targets", beta=0.01)
    assert close(loss.item(), -0.1985925 + 0.01 * 5.9231303) and close(m["kl"], 5.9231303)


@pytest.mark.parametrize(("delta", "grad"), [(9.0, math.exp(9.0) / 4), (11.0, 0.0)])
def test_trado_log_ratio_clamp_boundary(delta: float, grad: float) -> None:
    # A < 0 and a huge ratio: the PPO min passes it (as in GRPO) until the +-10 clamp, which zeroes the gradient.
    logp = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, False, False, False]])
    loss, _ = trado_loss(logp, torch.full((1, 4), -delta, dtype=torch.float64), mask, torch.tensor([-1.0]), beta=0.0)
    loss.backward()
    assert close(logp.grad[0, 0].item(), grad, 1e-6)


# ------------------------------------------------------------------------------------------------------------ SPG
SPG_ELBO, SPG_EUBO = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-0.6, -1.0, -0.2])
SPG_ADV, SPG_LEN = torch.tensor([1.0, -1.0, 0.0]), torch.tensor([4, 2, 2])


@pytest.mark.parametrize(
    ("estimation", "expected"),
    # bound_1 (A < 0) = mix -1.5 | elbo -2 | eubo -1 | zero 0; bound_0 (A > 0) = E_0 = -1 always; A_2 = 0.
    # loss = -(1 * -1 * 4 + -1 * bound_1 * 2) / 8
    [("mix", 0.125), ("elbo", 0.0), ("eubo", 0.25), ("zero", 0.5)],
)
def test_spg_hand_values(estimation: str, expected: float) -> None:
    loss, _ = spg_loss(SPG_ELBO, SPG_EUBO, SPG_ADV, SPG_LEN, omega=0.5, logp_estimation=estimation)
    assert close(loss.item(), expected)


def test_spg_sandwich_branch_selection() -> None:
    elbo, eubo = SPG_ELBO.clone().requires_grad_(), SPG_EUBO.clone().requires_grad_()
    loss, _ = spg_loss(elbo, eubo, SPG_ADV, SPG_LEN)
    loss.backward()
    # A > 0 -> the ELBO only: d/dE_0 = -A_0 l_0 / 8 = -0.5, d/dU_0 = 0.
    # A <= 0 -> the mixture: d/dE_1 = d/dU_1 = -(-1) * 0.5 * 2 / 8 = 0.125; A = 0 contributes nothing.
    torch.testing.assert_close(elbo.grad, torch.tensor([-0.5, 0.125, 0.0]))
    torch.testing.assert_close(eubo.grad, torch.tensor([0.0, 0.125, 0.0]))


# ------------------------------------------------------------------------------------------------------ StableDRL
# Groups 5 = {0, 1, 2} and 8 = {3, 4}; log rho = E - E_old = 0.5, 0, 2.5, -0.2, 0; A = 1, -1, 0, 0.5, -0.5.
# bounds: E_0 = -1, mix(-1, -2) = -1.5, (A = 0), E_3 = -1.2, mix(-0.4, -0.8) = -0.6.
SD_ELBO = torch.tensor([-1.0, -2.0, -0.5, -1.2, -0.8])
SD_EUBO = torch.tensor([-0.6, -1.0, -0.2, -0.9, -0.4])
SD_OLD = torch.tensor([-1.5, -2.0, -3.0, -1.0, -0.8])
SD_ADV = torch.tensor([1.0, -1.0, 0.0, 0.5, -0.5])
SD_GROUPS = torch.tensor([5, 5, 5, 8, 8])


@pytest.mark.parametrize(
    ("name", "options", "weights", "loss", "clip_ratio"),
    [
        # official: min(rho, 5) = 1.648721, 1, 5 (sum 7.648721) | 0.818731, 1 (sum 1.818731)
        ("stabledrl", {}, [0.2155552, 0.1307408, 0.6537040, 0.4501660, 0.5498340], 0.0622967, 0.2),
        # paper: clip to [0.8, 1.2]: 1.2, 1, 1.2 (sum 3.4) | 0.818731, 1
        ("stabledrl", {"mode": "paper"}, [0.3529412, 0.2941176, 0.3529412, 0.4501660, 0.5498340], 0.0084571, 0.4),
        # clip only: min(rho, 5) / G
        ("stabledrl_clip_only", {}, [0.5495738, 1 / 3, 5 / 3, 0.4093654, 0.5], 0.0725965, 0.2),
        # self-normalisation only: e^0.5, 1, e^2.5 (sum 14.831215) | unchanged
        ("stabledrl_selfnorm_only", {}, [0.1111656, 0.0674254, 0.8214090, 0.4501660, 0.5498340], 0.0575885, 0.0),
    ],
)
def test_stabledrl_family_hand_values(
    name: str, options: dict, weights: list[float], loss: float, clip_ratio: float
) -> None:
    # loss = mean over the 2 groups of -sum_i w_i A_i bound_i
    config = build_baseline(name, **options).config
    self_normalize = name != "stabledrl_clip_only"
    w = importance_weights(
        SD_ELBO - SD_OLD, SD_GROUPS, clip_low=config.clip_low, clip_high=config.clip_high, self_normalize=self_normalize
    )
    torch.testing.assert_close(w, torch.tensor(weights), atol=1e-6, rtol=1e-6)
    inputs = LossInputs(
        new=Estimate(elbo=SD_ELBO, eubo=SD_EUBO),
        old=Estimate(elbo=SD_OLD),
        ref=None,
        advantages=SD_ADV,
        completion_mask=torch.ones(5, 4, dtype=torch.bool),
        group_ids=SD_GROUPS,
    )
    value, m = build_baseline(name, **options).loss(inputs)
    assert close(value.item(), loss) and close(m["clip_ratio"], clip_ratio)
    assert close(m["weight_max"], max(weights)) and close(m["iw_max"], math.exp(2.5))
    assert close(m["iw_mean"], 3.3299892) and close(m["drift"], 0.64)


def test_stabledrl_replaces_non_finite_estimates_by_zero() -> None:
    clean, _ = stabledrl_loss(SD_ELBO, SD_EUBO, SD_OLD, SD_ADV, SD_GROUPS)
    # A non-finite E_old entry counts as 0, exactly like writing 0 there.
    for bad in (math.nan, math.inf, -math.inf):
        old = SD_OLD.clone()
        old[3] = bad
        zeroed = SD_OLD.clone()
        zeroed[3] = 0.0
        loss, _ = stabledrl_loss(SD_ELBO, SD_EUBO, old, SD_ADV, SD_GROUPS)
        assert torch.isfinite(loss) and loss.item() == stabledrl_loss(SD_ELBO, SD_EUBO, zeroed, SD_ADV, SD_GROUPS)[0]
    # A NaN ELBO zeroes that sample's bound and enters its log-weight as 0; the gradient stays finite.
    elbo = SD_ELBO.clone().requires_grad_()
    loss, _ = stabledrl_loss(elbo + torch.tensor([0.0, math.nan, 0, 0, 0]), SD_EUBO, SD_OLD, SD_ADV, SD_GROUPS)
    loss.backward()
    assert torch.isfinite(loss) and loss.item() != clean.item() and torch.isfinite(elbo.grad).all()
    assert elbo.grad[1] == 0


def _bounds_and_grads(theta: torch.Tensor, w_e: torch.Tensor, w_u: torch.Tensor, base: torch.Tensor, adv: torch.Tensor):
    """Differentiable per-sample ELBO/EUBO of a parameter vector, the SPG bound and its per-sample gradients."""
    elbo = base + torch.tanh(w_e @ theta).mean(-1)
    eubo = base + 0.3 + torch.sin(w_u @ theta).mean(-1)
    bound = torch.where(adv > 0, elbo, 0.5 * eubo + 0.5 * elbo)  # written out again, independent of spg.py
    grads = torch.stack([torch.autograd.grad(bound[i], theta, retain_graph=True)[0] for i in range(len(bound))])
    return elbo, eubo, grads


def _reference_weights(log_ratio: list[float], groups: list[int], low: float, high: float) -> list[float]:
    weights = []
    for i, g in enumerate(groups):
        members = [min(max(log_ratio[j], low), high) for j in range(len(groups)) if groups[j] == g]
        top = max(members)
        weights.append(math.exp(min(max(log_ratio[i], low), high) - top) / sum(math.exp(x - top) for x in members))
    return weights


@pytest.mark.parametrize(
    ("name", "options"), [("stabledrl", {}), ("stabledrl", {"mode": "paper"}), ("stabledrl_selfnorm_only", {})]
)
def test_stabledrl_gradient_is_a_convex_combination(name: str, options: dict) -> None:
    """grad L = -(1/#groups) sum_i w_i A_i g_i with w on each group's simplex, so ||grad|| <= max|A| max||g||."""
    gen = torch.Generator().manual_seed(1)
    baseline = build_baseline(name, **options)
    low, high = baseline.config.clip_low, baseline.config.clip_high
    for trial in range(60):
        batch, dim = 6, 5
        groups = torch.tensor([0, 0, 0, 7, 7, 7]) if trial % 2 else torch.zeros(batch, dtype=torch.long)
        theta = torch.randn(dim, generator=gen, requires_grad=True)
        w_e, w_u = torch.randn(batch, 3, dim, generator=gen), torch.randn(batch, 3, dim, generator=gen)
        base = -torch.rand(batch, generator=gen) * 3
        adv = torch.randn(batch, generator=gen)
        scale = (0.1, 10.0, 1e3, 1e5)[trial % 4]  # up to exploding log-ratios
        log_ratio = torch.randn(batch, generator=gen) * scale
        log_ratio[trial % batch] = scale  # one outlier per trial
        elbo, eubo, grads = _bounds_and_grads(theta, w_e, w_u, base, adv)
        old = elbo.detach() - log_ratio
        if trial % 5 == 0:
            old[(trial + 1) % batch] = (math.nan, math.inf, -math.inf)[trial % 3]  # non-finite old estimate -> 0
        loss, m = baseline.loss(
            LossInputs(
                new=Estimate(elbo=elbo, eubo=eubo),
                old=Estimate(elbo=old),
                ref=None,
                advantages=adv,
                completion_mask=torch.ones(batch, 4, dtype=torch.bool),
                group_ids=groups,
            )
        )
        (grad,) = torch.autograd.grad(loss, theta)
        sanitised_old = torch.nan_to_num(old, nan=0.0, posinf=0.0, neginf=0.0)
        weights = torch.tensor(_reference_weights((elbo.detach() - sanitised_old).tolist(), groups.tolist(), low, high))
        n_groups = len(set(groups.tolist()))
        for g in set(groups.tolist()):
            assert close(weights[groups == g].sum().item(), 1.0) and (weights >= 0).all()
        expected = -(weights[:, None] * adv[:, None] * grads).sum(0) / n_groups
        torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-4)
        assert grad.norm() <= adv.abs().max() * grads.norm(dim=1).max() * (1 + 1e-5)
        assert m["weight_max"] <= 1 + 1e-6


def test_stabledrl_coupled_step_zero_is_spg_with_group_mean() -> None:
    """Coupled (docs/methods.md#stabledrl): E_theta == E_old -> w_i = 1/G -> mean over groups of -(1/G) sum A bound."""
    elbo = SD_ELBO.clone().requires_grad_()
    loss, m = stabledrl_loss(elbo, SD_EUBO, SD_ELBO, SD_ADV, SD_GROUPS)
    assert m["weight_max"] == pytest.approx(0.5) and m["clip_ratio"] == 0.0
    # group 5: -(1 * -1 + -1 * -1.5 + 0) / 3 = -0.5/3 ; group 8: -(0.5 * -1.2 + -0.5 * -0.6) / 2 = 0.15
    assert close(loss.item(), (-0.5 / 3 + 0.15) / 2)
    # With equal lengths and group sizes this is exactly SPG's length-weighted loss.
    groups = torch.tensor([0, 0, 1, 1])
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    sd, _ = stabledrl_loss(SD_ELBO[:4], SD_EUBO[:4], SD_ELBO[:4], adv, groups)
    spg, _ = spg_loss(SD_ELBO[:4], SD_EUBO[:4], adv, torch.full((4,), 3))
    assert close(sd.item(), spg.item())


def test_loss_options_validated() -> None:
    with pytest.raises(UserError, match="beta must be 0"):
        build_baseline("spg", beta=0.1)
    with pytest.raises(UserError, match="beta must be 0"):
        build_baseline("stabledrl", beta=0.1)
    with pytest.raises(UserError, match="mode"):
        build_baseline("stabledrl", mode="loose")
    with pytest.raises(UserError, match="epsilon"):
        build_baseline("stabledrl", mode="paper", epsilon=1.5)
    with pytest.raises(UserError, match="logp_estimation"):
        build_baseline("spg", logp_estimation="upper")
    with pytest.raises(UserError, match="normalize"):
        build_baseline("trado", normalize="tokens")
    with pytest.raises(UserError, match="overlong_margin"):
        build_baseline("trado", overlong_margin=-1)
    with pytest.raises(UserError, match="correctness"):
        build_baseline("trado").advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="token_logp"):
        build_baseline("grpo").loss(
            LossInputs(Estimate(), None, None, torch.zeros(1), torch.ones(1, 1, dtype=torch.bool), torch.zeros(1))
        )


# ------------------------------------------------------------------------------------------ precision and overflow
# Every built-in baseline through its registered class, on one set of inputs that carries every estimate any of them
# reads: two groups of two sequences, three token positions, a completion canvas of width 1 (so ESPO's L = 1 and its
# log-ratio Delta ELBO / L equals StableDRL's Delta ELBO). Group 0 gets advantage ``adv`` and log-ratio ``x`` on
# every token and sequence; group 1 is ordinary (A = +-0.5). Values are dyadic, hence exact in bf16 / fp16 too.
UNCLAMPED = {"trado": {"log_ratio_clamp": math.inf}, "stabledrl_clip_only": {"clip_threshold": math.inf}}
HUGE = [(torch.float64, 100.0), (torch.float64, 500.0), (torch.float64, 1000.0), (torch.float32, 100.0)]


def _inputs(dtype: torch.dtype, x: float = 0.0, adv: float = 0.0) -> LossInputs:
    def t(values: list, grad: bool = False) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, requires_grad=grad)

    shift = t([x, x, 0.25, -0.125])
    logp = t([[-1.0, -0.5, -2.0], [-0.75, -1.25, -0.25], [-1.5, -0.375, -1.0], [-0.25, -2.25, -1.125]], grad=True)
    elbo, eubo = t([-3.0, -2.5, -4.0, -1.5], grad=True), t([-2.0, -2.0, -3.0, -1.0], grad=True)
    return LossInputs(
        new=Estimate(
            token_logp=logp,
            token_mask=torch.ones(4, 3, dtype=torch.bool),
            elbo=elbo,
            eubo=eubo,
            row_group=torch.tensor([0, 0, 1, 1]),  # d-TreeRPO's siblings: each group's two rows
            token_ids=torch.tensor([[1, 2, 3], [1, 4, 3], [5, 5, 5], [5, 6, 5]]),
        ),
        old=Estimate(token_logp=logp.detach() - shift[:, None], elbo=elbo.detach() - shift),
        ref=Estimate(token_logp=logp.detach() - 0.125, elbo=elbo.detach() - 0.5),
        advantages=t([adv, adv, 0.5, -0.5]),
        completion_mask=torch.ones(4, 1, dtype=torch.bool),
        group_ids=torch.tensor([0, 0, 1, 1]),
    )


def _loss_and_grads(name: str, inputs: LossInputs, **options: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The baseline's loss and its gradients with respect to every current-policy estimate it uses."""
    leaves = [inputs.new.token_logp, inputs.new.elbo, inputs.new.eubo]
    loss, _ = build_baseline(name, **options).loss(inputs)
    return loss, [g for g in torch.autograd.grad(loss, leaves, allow_unused=True) if g is not None]


def _finite(loss: torch.Tensor, grads: list[torch.Tensor]) -> bool:
    return bool(torch.isfinite(loss)) and all(bool(torch.isfinite(g).all()) for g in grads)


def test_compute_dtype_rule() -> None:
    f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
    cases = [((bf16,), f32), ((f16,), f32), ((f32,), f32), ((f64,), f64), ((bf16, f64), f64), ((torch.bool,), f32)]
    for dtypes, expected in cases:
        assert compute_dtype(*(torch.zeros(1, dtype=d) for d in dtypes), None) == expected


BETAS = {
    "grpo": 0.04,
    "espo": 1e-3,
    "trado": 0.01,
    "cj_grpo": 0.04,
    "agrpo": 0.01,
    "gdsd": 1e-3,
    "egspo": 0.04,
    "mdpo": 0.04,
    "igpo": 0.04,
}


@pytest.mark.parametrize("name", BUILTIN_BASELINES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_every_loss_computes_and_returns_at_least_the_input_precision(name: str, dtype: torch.dtype) -> None:
    """float64 in -> float64 out; bf16 / fp16 in -> computed in float32: the very number float32 inputs give."""
    beta = BETAS.get(name, 0.0)
    loss, grads = _loss_and_grads(name, _inputs(dtype, x=0.5, adv=1.0), beta=beta)
    single, _ = _loss_and_grads(name, _inputs(torch.float32, x=0.5, adv=1.0), beta=beta)
    assert loss.dtype == torch.promote_types(dtype, torch.float32) and all(g.dtype == dtype for g in grads)
    if dtype == torch.float64:
        torch.testing.assert_close(loss.float(), single, rtol=1e-6, atol=1e-7)
    else:
        assert torch.equal(loss, single)


@pytest.mark.parametrize("name", BUILTIN_BASELINES)
def test_every_loss_stays_float32_inside_bf16_autocast(name: str) -> None:
    """The trainer computes the losses inside the forward's autocast: none of them has a matrix product autocast
    would run in bf16, so the loss and its gradients are float32's to the bit (non-dyadic values: bf16 would
    round them)."""
    beta = BETAS.get(name, 0.0)
    plain, plain_grads = _loss_and_grads(name, _inputs(torch.float32, x=0.3, adv=0.7), beta=beta)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast, cast_grads = _loss_and_grads(name, _inputs(torch.float32, x=0.3, adv=0.7), beta=beta)
    assert cast.dtype == torch.float32 and torch.equal(cast, plain)
    assert all(torch.equal(a, b) for a, b in zip(cast_grads, plain_grads, strict=True))


def test_building_blocks_return_the_compute_dtype() -> None:
    groups = torch.zeros(2, dtype=torch.long)
    for dtype, expected in ((torch.bfloat16, torch.float32), (torch.float32, torch.float32), (torch.float64,) * 2):
        x, a = torch.tensor([0.25, -0.125], dtype=dtype), torch.tensor([1.0, -1.0], dtype=dtype)
        outputs = [conditional_clip(x, a, 0.2)[0], k3_kl(x), k2_kl(x), sandwich_bound(x, x, a)]
        outputs += [importance_weights(x, groups), log_importance_weights(x, groups)]
        assert all(out.dtype == expected for out in outputs)


def _textbook_ppo(log_ratio: torch.Tensor, adv: torch.Tensor, eps: float) -> torch.Tensor:
    """min(rho A, clip(rho, 1 - eps, 1 + eps) A) as written in the papers (and as this code computed it before)."""
    ratio = torch.exp(log_ratio)
    return torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conditional_clip_equals_the_textbook_min_on_ordinary_inputs(dtype: torch.dtype) -> None:
    """Bit for bit, value and gradient, wherever rho is representable: only the overflow behaviour changed."""
    gen = torch.Generator().manual_seed(3)
    for eps in (0.2, 0.5):
        log_ratio = (torch.randn(64, 8, generator=gen) * 2).to(dtype)
        adv = torch.randn(64, 1, generator=gen).to(dtype)
        adv[::7] = 0.0
        x, x_ref = log_ratio.clone().requires_grad_(), log_ratio.clone().requires_grad_()
        objective, _ = conditional_clip(x, adv, eps)
        expected = _textbook_ppo(x_ref, adv, eps)
        assert torch.equal(objective, expected)
        weights = torch.randn(objective.shape, generator=gen).to(dtype)
        (grad,) = torch.autograd.grad((objective * weights).sum(), x)
        (expected_grad,) = torch.autograd.grad((expected * weights).sum(), x_ref)
        assert torch.equal(grad, expected_grad)


@pytest.mark.parametrize("self_normalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_space_weights_equal_the_plain_normalisation(self_normalize: bool, dtype: torch.dtype) -> None:
    """exp(log w) = clip(rho) / sum_g clip(rho) (or / G) to rounding, for ratios well inside the range."""
    gen = torch.Generator().manual_seed(4)
    log_ratio, groups = (torch.randn(24, generator=gen) * 3).to(dtype), torch.randint(0, 5, (24,), generator=gen)
    clipped = torch.exp(log_ratio.clamp(max=math.log(5.0)))
    index = torch.unique(groups, return_inverse=True)[1]
    summed = clipped if self_normalize else torch.ones_like(clipped)
    norm = torch.zeros(int(index.max()) + 1, dtype=dtype).index_add(0, index, summed)
    weights = importance_weights(log_ratio, groups, self_normalize=self_normalize)
    tol = {"rtol": 1e-6, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 1e-14, "atol": 1e-15}
    torch.testing.assert_close(weights, clipped / norm[index], **tol)


@pytest.mark.parametrize(
    ("log_scale", "factor", "dtype", "expected"),
    [
        (100.0, 1e-30, torch.float32, math.exp(100.0) * 1e-30),  # e^100 overflows float32, the product does not
        (100.0, -1e-30, torch.float32, -math.exp(100.0) * 1e-30),
        (1000.0, 1e-300, torch.float64, math.exp(1000.0 + math.log(1e-300))),
        (1000.0, 0.0, torch.float64, 0.0),  # was inf x 0 = NaN
        (1000.0, -1.0, torch.float64, -math.inf),  # the product itself is beyond float64's range
        (5.0, 2.0, torch.float32, math.exp(5.0) * 2.0),
    ],
)
def test_scaled_exp(log_scale: float, factor: float, dtype: torch.dtype, expected: float) -> None:
    x = torch.tensor([log_scale], dtype=dtype, requires_grad=True)
    value = scaled_exp(x, torch.tensor([factor], dtype=dtype))
    (grad,) = torch.autograd.grad(value.sum(), x)  # d/dx a e^x = a e^x
    assert value.dtype == dtype and not torch.isnan(value).any() and not torch.isnan(grad).any()
    if math.isinf(expected) or expected == 0:
        assert value.item() == expected and grad.item() == expected
    else:
        assert close(value.item(), expected, 1e-5) and close(grad.item(), expected, 1e-5)
    if log_scale < 80:  # ordinary inputs: exactly the plain product
        assert torch.equal(value, torch.exp(x.detach()) * factor)


# GDSD regresses the clamped change of D on psi A, so A = 0 still pulls the change back towards 0: group 0 adds the
# square of its saturated clamp, (log(1 + eps) / L)^2 for each of its 2 completions, over B = 4 (L = 1), with zero
# gradient. Every other method's A = 0 term is exactly 0.
ZERO_ADVANTAGE_TERM = {"gdsd": 2 * math.log(1 + 4e-4) ** 2 / 4}


@pytest.mark.parametrize("name", BUILTIN_BASELINES)
@pytest.mark.parametrize(("dtype", "x"), HUGE)
def test_zero_advantage_contributes_exactly_zero_at_huge_ratios(name: str, dtype: torch.dtype, x: float) -> None:
    """A = 0 with rho = e^x far beyond the dtype's range (every clamp removed): loss and gradient are exactly those
    of rho = 1, where they used to be NaN (inf x 0)."""
    options = {"beta": 0.0, **UNCLAMPED.get(name, {})}
    loss, grads = _loss_and_grads(name, _inputs(dtype, x=x), **options)
    calm, calm_grads = _loss_and_grads(name, _inputs(dtype), **options)
    assert _finite(loss, grads)
    if name in ZERO_ADVANTAGE_TERM:
        assert close(loss.item() - calm.item(), ZERO_ADVANTAGE_TERM[name], 1e-6 if dtype == torch.float32 else 1e-12)
    else:
        assert torch.equal(loss, calm)
    assert all(torch.equal(g, c) for g, c in zip(grads, calm_grads, strict=True))


@pytest.mark.parametrize("name", BUILTIN_BASELINES)
@pytest.mark.parametrize(("dtype", "x"), HUGE)
def test_clipped_branch_stays_finite_at_huge_ratios(name: str, dtype: torch.dtype, x: float) -> None:
    """A > 0 and rho = e^x: the PPO clip (GRPO, ESPO, TraDo, also unclamped) or StableDRL's clip / self-normalisation
    caps the term, so loss and gradient equal those of rho = e^5 (clipped as well), where the gradient used to be
    NaN (0 x inf through the discarded branch). Group 0's two samples share the ratio, so their weights are 1/2."""
    for options in ({"beta": 0.0}, {"beta": 0.0, **UNCLAMPED.get(name, {})}):
        if options.get("clip_threshold") == math.inf:
            continue  # unclipped and unnormalised: rho A / G is the weight itself, see the overflow test below
        loss, grads = _loss_and_grads(name, _inputs(dtype, x=x, adv=1.0), **options)
        calm, calm_grads = _loss_and_grads(name, _inputs(dtype, x=5.0, adv=1.0), **options)
        assert _finite(loss, grads) and torch.equal(loss, calm)
        assert all(torch.equal(g, c) for g, c in zip(grads, calm_grads, strict=True))


def test_zero_bound_under_an_infinite_weight_contributes_exactly_zero() -> None:
    """Clip-only with C = inf and logp_estimation="zero": the A < 0 samples' bound is the constant 0, so however far
    beyond the range their weight rho / G is, they contribute 0 (not inf x 0 = NaN), with zero gradient."""
    options = {"clip_threshold": math.inf, "logp_estimation": "zero"}
    for dtype, x in HUGE:
        loss, grads = _loss_and_grads("stabledrl_clip_only", _inputs(dtype, x=x, adv=-1.0), **options)
        calm, calm_grads = _loss_and_grads("stabledrl_clip_only", _inputs(dtype, adv=-1.0), **options)
        assert _finite(loss, grads) and torch.equal(loss, calm)
        assert all(torch.equal(g, c) for g, c in zip(grads, calm_grads, strict=True))


# Loss / e^t when group 0 has A = -e^(t - x): GRPO -(1/12) sum over 6 tokens of rho A; ESPO -(1/4) sum over two
# sequences; TraDo (length) -(1/4) sum of the two rows' (1/3) sum of 3 tokens; clip-only with C = inf:
# -(1/2) sum_i (rho / 2) A_i bound_i, bounds mix(-2, -3) = -2.5 and mix(-2, -2.5) = -2.25. CJ-GRPO: one replay step,
# so GRPO's token mean; AGRPO: -(1/4) sum over the 6 tokens (rows of 3 tokens summed, 4 rows averaged); JustGRPO:
# -(1/(L (V + 1e-5))) sum over the 6 tokens with L = 1 and V = 4 completions with A != 0.
PASSING_FACTOR = {
    "cj_grpo": 0.5,
    "agrpo": 1.5,
    "justgrpo": 6 / 4.00001,
    "grpo": 0.5,
    "coupled_grpo": 0.5,
    "espo": 0.5,
    "gdpo": 0.5,
    "trado": 0.5,
    "stabledrl_clip_only": -0.25 * 4.75,
    "egspo": 1 / 6,  # one ratio per row (the product over its 3 tokens), each row's term over 3 tokens, 4 rows
}
# EGSPO's ratio is a step's: the product of its tokens' ratios, so a row of three tokens at log-ratio x / 3 has x
STEP_TOKENS = {"egspo": 3}


@pytest.mark.parametrize("name", BUILTIN_BASELINES)
@pytest.mark.parametrize(("dtype", "x"), HUGE)
def test_unclipped_term_is_finite_when_its_value_is(name: str, dtype: torch.dtype, x: float) -> None:
    """A < 0 and rho = e^x beyond the range, but rho |A| = e^t representable (t = 20 below the dtype's log max):
    the passing term is the finite number it is, not inf (nor NaN), for the methods that let it pass."""
    t = min(x, math.log(torch.finfo(dtype).max) - 20)
    options = {"beta": 0.0, **UNCLAMPED.get(name, {})}
    per_token = x / STEP_TOKENS.get(name, 1)
    loss, grads = _loss_and_grads(name, _inputs(dtype, x=per_token, adv=-math.exp(t - x)), **options)
    assert _finite(loss, grads)
    if name in PASSING_FACTOR:
        assert close(loss.item() / math.exp(t), PASSING_FACTOR[name], 1e-4)


@pytest.mark.parametrize(
    ("name", "adv", "sign"),
    [
        ("grpo", -1, 1),
        ("espo", -1, 1),
        ("trado", -1, 1),
        ("stabledrl_clip_only", -1, -1),
        ("stabledrl_clip_only", 1, 1),
    ],
)
def test_exploding_term_beyond_the_range_is_inf_not_nan(name: str, adv: float, sign: int) -> None:
    """rho |A| = e^1000 / N exceeds float64 (all clamps removed): the passing term, hence the loss, is +-inf as the
    method's maths says (PPO with A < 0: -rho A > 0; clip-only with C = inf: -(rho / G) A bound with bound < 0), its
    gradient is +-inf, and nothing is NaN."""
    inputs = _inputs(torch.float64, x=1000.0, adv=adv)
    loss, grads = _loss_and_grads(name, inputs, beta=0.0, **UNCLAMPED.get(name, {}))
    assert loss.item() == sign * math.inf
    assert all(not torch.isnan(g).any() for g in grads) and any(torch.isinf(g).any() for g in grads)


def test_named_aggregations_against_hand_computed_values() -> None:
    """Each aggregation on a 2 x 3 example whose value is worked out by hand."""
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 5.0, 7.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    assert token_mean(values, mask).item() == pytest.approx((1 + 2 + 3 + 5 + 7) / 5)
    norm = torch.tensor([3.0, 3.0])  # TraDo: the padded length
    assert row_mean(values, mask, norm).item() == pytest.approx(((1 + 2) / 3 + (3 + 5 + 7) / 3) / 2)
    targets = mask.sum(1).float()  # dLLM-RL's LLaDA script: the row's own targets
    assert row_mean(values, mask, targets).item() == pytest.approx(((1 + 2) / 2 + (3 + 5 + 7) / 3) / 2)
    per_seq, lengths = torch.tensor([2.0, -1.0, 4.0]), torch.tensor([1, 3, 4])
    assert sequence_mean(per_seq).item() == pytest.approx(5 / 3)
    assert length_weighted(per_seq, lengths).item() == pytest.approx((2 * 1 - 1 * 3 + 4 * 4) / 8)
    assert mean_over_groups(per_seq, torch.tensor([7, 7, 9])).item() == pytest.approx(5 / 2)
    inf_off_mask = torch.tensor([[1.0, float("inf")]])
    assert token_mean(inf_off_mask, torch.tensor([[True, False]])).item() == 1.0  # dropped, not multiplied by 0


# ------------------------------------------------------------------------------------------------------------ wd1
def test_wd1_loss_hand_computed() -> None:
    """Group 0: A = (1, -1), so softmax(A) = (s(2), s(-2)) with s the logistic, and w- - w+ = (-tanh 1, tanh 1);
    group 1: A = (0.5, 0.5), equal weights both ways, coefficient 0. l_i sums the masked token log-probs."""
    logp = torch.tensor([[-1.0, -0.5, -9.0], [-2.0, -0.25, -0.75], [-1.0, -1.0, -1.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    logp.requires_grad_()
    loss, metrics = wd1_loss(logp, mask, torch.tensor([1.0, -1.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1]))
    t = math.tanh(1.0)
    assert close(loss.item(), (-t * (-1.5) + t * (-3.0)) / 2, 1e-6)  # mean over the two groups
    (grad,) = torch.autograd.grad(loss, logp)
    expected = torch.tensor([[-t, -t, 0.0], [t, t, t], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]) / 2
    torch.testing.assert_close(grad, expected * mask)
    assert close(metrics["weight_max"], 1 / (1 + math.exp(-2.0)), 1e-6)


def _wd1_loop(logp, mask, advantages, group_ids, row_to_seq) -> torch.Tensor:
    """The same loss with Python loops and math.exp, one sequence at a time (the independent implementation)."""
    groups = sorted(set(group_ids.tolist()))
    total = logp.new_zeros(())
    for g in groups:
        members = [i for i in range(len(group_ids)) if group_ids[i].item() == g]
        up = [math.exp(advantages[i].item()) for i in members]
        down = [math.exp(-advantages[i].item()) for i in members]
        for k, i in enumerate(members):
            coefficient = down[k] / sum(down) - up[k] / sum(up)
            for r in range(logp.shape[0]):
                if row_to_seq[r].item() == i:
                    for t in range(logp.shape[1]):
                        if mask[r, t]:
                            total = total + coefficient * logp[r, t]
    return total / len(groups)


def test_wd1_loss_equals_a_loop_implementation_over_replay_rows() -> None:
    """Random rewards in three groups of four, two estimator rows per sequence (as trajectory replay has)."""
    gen = torch.Generator().manual_seed(11)
    group_ids = torch.arange(3).repeat_interleave(4)
    advantages = torch.randn(12, generator=gen, dtype=torch.float64)
    row_to_seq = torch.arange(12).repeat_interleave(2)
    logp = (-torch.rand(24, 5, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    mask = torch.rand(24, 5, generator=gen) > 0.3
    loss, _ = wd1_loss(logp, mask, advantages, group_ids, row_to_seq)
    reference = _wd1_loop(logp, mask, advantages, group_ids, row_to_seq)
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(loss, logp)
    (expected,) = torch.autograd.grad(reference, logp)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------- GDPO
def test_gdpo_loss_hand_computed() -> None:
    """NeMo RL's masked means by hand: rho_i = exp(dELBO_i / (l_i + 1e-8)), each row weighted l_i / (l_i + 1e-8),
    the sum over (B + 1e-8). (1) dELBO 4 over 8 tokens, A = 1: rho ~ e^0.5 > 1.5, the clipped 1.5 (no gradient);
    (2) dELBO 3 over 2 tokens, A = -2: rho ~ e^1.5 > 1.5 and A < 0, so rho A passes (the conditional clip's
    bypass); (3) no scored token, A = 5: counts in B and adds 0 (a clamped length of 1 would add -A / B = -5/3)."""
    elbo = torch.tensor([-10.0, -3.0, 0.0], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([-14.0, -6.0, 0.0], dtype=torch.float64)
    advantages = torch.tensor([1.0, -2.0, 5.0], dtype=torch.float64)
    loss, metrics = gdpo_loss(elbo, old, torch.tensor([8, 2, 0]), advantages)
    rho2 = math.exp(3 / (2 + 1e-8))
    w1, w2 = 8 / (8 + 1e-8), 2 / (2 + 1e-8)
    assert close(loss.item(), -(w1 * 1.5 + w2 * (-2 * rho2)) / (3 + 1e-8), 1e-12)
    assert close(metrics["clip_ratio"], 1 / 3, 1e-7)
    (grad,) = torch.autograd.grad(loss, elbo)
    expected = [0.0, -(w2 * -2 * rho2 / (2 + 1e-8)) / (3 + 1e-8), 0.0]
    torch.testing.assert_close(grad, torch.tensor(expected, dtype=torch.float64), rtol=1e-13, atol=0)


def test_gdpo_loss_is_espos_when_every_completion_fills_the_canvas() -> None:
    """Same shape as ESPO's loss (no KL): with l_i = L for every sequence the two agree exactly."""
    gen = torch.Generator().manual_seed(5)
    elbo = (torch.randn(12, generator=gen, dtype=torch.float64) * 20).requires_grad_()
    old, adv = torch.randn(12, generator=gen, dtype=torch.float64) * 20, torch.randn(12, generator=gen).double()
    ours, _ = gdpo_loss(elbo, old, torch.full((12,), 16), adv, epsilon=0.5)
    theirs, _ = espo_loss(elbo, old, None, adv, max_completion_length=16, epsilon=0.5, beta=0.0)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(*(torch.autograd.grad(x, elbo)[0] for x in (ours, theirs)))
