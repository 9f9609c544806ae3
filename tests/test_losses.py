"""RL losses: hand-computed values on tiny tensors and gradient properties with torch.autograd.

The hand values were worked out term by term (derivations in the comments) and cross-checked with a plain
Python float calculation; nothing here is produced by the code under test.
"""

import math

import pytest
import torch

from stabledrl_bench.baselines.espo import espo_loss, k2_kl
from stabledrl_bench.baselines.grpo import grpo_loss, k3_kl
from stabledrl_bench.baselines.spg import spg_loss
from stabledrl_bench.baselines.stabledrl import importance_weights, stabledrl_loss
from stabledrl_bench.baselines.trado import trado_loss
from stabledrl_bench.errors import UserError
from stabledrl_bench.estimators import Estimate
from stabledrl_bench.registry import LossInputs, build_baseline


def close(actual: float, expected: float, tol: float = 1e-5) -> bool:
    return math.isclose(actual, expected, rel_tol=tol, abs_tol=tol)


# ----------------------------------------------------------------------------------------------------- GRPO (d1)
# Two sequences, three tokens, the last token of sequence 1 is padding; eps = 0.5.
#   seq 0 (A = +1): log rho = 0.2, 0.5, 0 -> rho 1.221403, 1.648721 (> 1.5: clipped to 1.5), 1
#   seq 1 (A = -2): log rho = -0.5, 0.7 -> rho 0.606531 (-> -1.213061), 2.013753 (-> min(-4.027505, -3) = -4.027505:
#                   the unclipped term passes, the conditional-clipping bypass)
#   loss = -(1.221403 + 1.5 + 1 - 1.213061 - 4.027505) / 5 = 0.303833; clip_frac = 1/5
GRPO_LOGP = torch.tensor([[-1.0, -0.5, -0.5], [-1.5, -0.2, 0.0]])
GRPO_OLD = torch.tensor([[-1.2, -1.0, -0.5], [-1.0, -0.9, 0.0]])
GRPO_REF = torch.tensor([[-1.1, -0.4, -0.5], [-1.5, -0.3, 0.0]])
GRPO_MASK = torch.tensor([[True, True, True], [True, True, False]])
GRPO_ADV = torch.tensor([1.0, -2.0])


def test_grpo_hand_values() -> None:
    loss, m = grpo_loss(GRPO_LOGP, GRPO_OLD, None, GRPO_MASK, GRPO_ADV, epsilon=0.5, beta=0.0)
    assert close(loss.item(), 0.3038328) and close(m["clip_frac"], 0.2)
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
    assert close(logp.grad.item(), rho, 1e-4) and m["clip_frac"] == 0.0
    # The same outlier with A > 0 is clipped: zero gradient.
    logp.grad = None
    loss, m = grpo_loss(logp, old, None, torch.ones(1, 1, dtype=torch.bool), torch.tensor([1.0]), beta=0.0)
    loss.backward()
    assert logp.grad.item() == 0.0 and m["clip_frac"] == 1.0
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
    loss, m = espo_loss(elbo, old, ref, torch.tensor([1.0, -1.0, 0.5]), gen_length=4, epsilon=0.2, beta=0.1)
    assert close(loss.item(), -0.2683903 + 0.1 * 0.2083333) and close(m["kl"], 0.2083333)
    assert close(m["clip_frac"], 1 / 3) and close(m["ratio_max"], math.exp(0.1))


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
    loss, m = espo_loss(elbo, old, None, torch.tensor([adv]), gen_length=length, epsilon=0.2, beta=0.0)
    loss.backward()
    expected = 0.0 if clipped else -adv * math.exp(log_rho) / length
    assert close(elbo.grad.item(), expected) and m["clip_frac"] == float(clipped)


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
    assert close(m["clip_frac"], 0.5) and not baseline.needs_ref


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
    ("name", "options", "weights", "loss", "clip_frac"),
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
    name: str, options: dict, weights: list[float], loss: float, clip_frac: float
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
    assert close(value.item(), loss) and close(m["clip_frac"], clip_frac)
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
    """§10.10: E_theta == E_old -> uniform weights 1/G -> mean over groups of -(1/G) sum_i A_i bound_i."""
    elbo = SD_ELBO.clone().requires_grad_()
    loss, m = stabledrl_loss(elbo, SD_EUBO, SD_ELBO, SD_ADV, SD_GROUPS)
    assert m["weight_max"] == pytest.approx(0.5) and m["clip_frac"] == 0.0
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
    with pytest.raises(UserError, match="correctness"):
        build_baseline("trado").advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="token_logp"):
        build_baseline("grpo").loss(
            LossInputs(Estimate(), None, None, torch.zeros(1), torch.ones(1, 1, dtype=torch.bool), torch.zeros(1))
        )
