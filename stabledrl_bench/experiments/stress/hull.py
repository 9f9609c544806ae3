"""The convex-hull property (docs/published-numbers.md §5.5), checked on the real loss functions with random inputs.

StableDRL's update is, per group g with detached weights w_i = clip(rho_i) / sum_{j in g} clip(rho_j),

    grad L = -(1/N_g) sum_g sum_{i in g} w_i A_i grad bound_i,     w_i >= 0, sum_{i in g} w_i = 1,

a mean over groups of convex combinations of the per-sample terms t_i = A_i grad bound_i, hence

    ||grad L|| <= (1/N_g) sum_g max_{i in g} ||t_i|| =: B       whatever the (estimated) ratios are.

GRPO's token term is rho A grad log pi whenever the PPO min picks the unclipped branch, so its norm relative to the
same kind of bound grows with the largest passing ratio; ESPO's sequence-level version does the same; the clip-only
ablation (1/G instead of the group sum) is bounded by C x B instead of B.

Each trial draws, from one ``torch.Generator``: ``groups`` x ``group_size`` samples with per-sample gradient vectors
of random scale (log-uniform over two decades) in ``dim`` dimensions (``tokens`` of them per sample for GRPO),
rewards U[0, 1] turned into group-mean advantages, and log-ratios ``scale`` x Cauchy (the scale cycles through
``scales``, so the set includes mild and exploding ratios). Every loss is linear in a parameter vector theta, so
autograd gives the update exactly; the bound uses the same per-sample terms (for GRPO and ESPO the loosest analog:
the largest per-token / per-sample term over the whole batch). For StableDRL the update is also
rebuilt from ``importance_weights`` as an explicit convex combination (``residual``: relative difference).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stabledrl_bench.baselines.espo import espo_loss
from stabledrl_bench.baselines.grpo import grpo_loss
from stabledrl_bench.baselines.stabledrl import importance_weights, stabledrl_loss
from stabledrl_bench.errors import comma_list, positive_int
from stabledrl_bench.experiments.stress.common import (
    band,
    colors,
    figure,
    runtime,
    save_figure,
    stability_dir,
    write_record,
)
from stabledrl_bench.experiments.stress.observations import hull_claims
from stabledrl_bench.experiments.stress.options import (
    EXPERIMENTS,
    Experiment,
    StressOptions,
    check_positive,
    option,
    recorded_settings,
)
from stabledrl_bench.experiments.stress.tables import hull_block

HULL_VARIANTS = ("stabledrl", "selfnorm_only", "clip_only", "espo", "grpo")
OMEGA = 0.5  # SPG/StableDRL mixture weight of the EUBO in the A <= 0 bound
ESPO_LENGTH = 40  # L of ESPO's Delta ELBO / L (the stress canvas)
TOLERANCE = 1e-5  # rounding allowance of the bound check: a ratio up to 1 + 1e-5 is "at the bound"


def _cauchy(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    return torch.tan(math.pi * (torch.rand(shape, generator=generator, dtype=torch.float64) - 0.5))


def _vectors(shape: tuple[int, ...], dim: int, generator: torch.Generator) -> torch.Tensor:
    """Random vectors [*shape, dim] with norms spread over two decades (log-uniform scale in [0.1, 10])."""
    scale = torch.exp((torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * math.log(10.0))
    return scale[..., None] * torch.randn((*shape, dim), generator=generator, dtype=torch.float64) / math.sqrt(dim)


def _grad(loss: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss, theta, retain_graph=True)  # elbo / eubo are shared by several losses
    return grad


@dataclass
class HullInputs:
    """One random trial: N = groups x group_size samples, gradient vectors of the per-sample likelihood terms."""

    group_ids: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N] group-mean advantages of U[0, 1] rewards
    elbo_vec: torch.Tensor  # [N, D] grad of E_i (StableDRL family), grad of E_i / L (ESPO)
    eubo_vec: torch.Tensor  # [N, D] grad of U_i
    token_vec: torch.Tensor  # [N, K, D] grad of log pi_ik (GRPO)
    log_ratio: torch.Tensor  # [N] sequence log-ratios
    token_log_ratio: torch.Tensor  # [N, K] token log-ratios

    @property
    def num_groups(self) -> int:
        return int(self.group_ids.max()) + 1


def draw_inputs(
    generator: torch.Generator, scale: float, *, groups: int = 4, group_size: int = 8, dim: int = 16, tokens: int = 4
) -> HullInputs:
    n = groups * group_size
    rewards = torch.rand(n, generator=generator, dtype=torch.float64)
    return HullInputs(
        group_ids=torch.arange(groups).repeat_interleave(group_size),
        advantages=rewards - rewards.view(groups, group_size).mean(1).repeat_interleave(group_size),
        elbo_vec=_vectors((n,), dim, generator),
        eubo_vec=_vectors((n,), dim, generator),
        token_vec=_vectors((n, tokens), dim, generator),
        log_ratio=scale * _cauchy((n,), generator),
        token_log_ratio=scale * _cauchy((n, tokens), generator),
    )


def sample_terms(x: HullInputs) -> torch.Tensor:
    """StableDRL's per-sample terms t_i = A_i grad bound_i [N, D] (bound = E if A > 0, else the EUBO mixture)."""
    bound_grad = torch.where((x.advantages > 0)[:, None], x.elbo_vec, OMEGA * x.eubo_vec + (1 - OMEGA) * x.elbo_vec)
    return x.advantages[:, None] * bound_grad


def updates(x: HullInputs, clip_threshold: float = 5.0) -> dict[str, torch.Tensor]:
    """The gradient of every variant's real loss with respect to theta; each loss is linear in theta, so the
    likelihood terms are E = <elbo_vec, theta>, U = <eubo_vec, theta>, ESPO's E = L <elbo_vec, theta> and
    log pi_ik = <token_vec_ik, theta>, and the rollout-policy estimates are set so that log rho = the drawn ratios."""
    theta = torch.zeros(x.elbo_vec.shape[1], dtype=torch.float64, requires_grad=True)
    elbo, eubo = x.elbo_vec @ theta, x.eubo_vec @ theta
    family = {
        "stabledrl": {"clip_high": math.log(clip_threshold), "self_normalize": True},
        "selfnorm_only": {"clip_high": math.inf, "self_normalize": True},
        "clip_only": {"clip_high": math.log(clip_threshold), "self_normalize": False},
    }
    out = {}
    for name, kwargs in family.items():
        old = elbo.detach() - x.log_ratio
        loss, _ = stabledrl_loss(elbo, eubo, old, x.advantages, x.group_ids, omega=OMEGA, **kwargs)
        out[name] = _grad(loss, theta)
    e = ESPO_LENGTH * (x.elbo_vec @ theta)
    loss, _ = espo_loss(
        e, e.detach() - ESPO_LENGTH * x.log_ratio, None, x.advantages, max_completion_length=ESPO_LENGTH, beta=0.0
    )
    out["espo"] = _grad(loss, theta)
    logp = x.token_vec @ theta
    mask = torch.ones(logp.shape, dtype=torch.bool)
    loss, _ = grpo_loss(logp, logp.detach() - x.token_log_ratio, None, mask, x.advantages, beta=0.0)
    out["grpo"] = _grad(loss, theta)
    return out


def bounds(x: HullInputs) -> dict[str, float]:
    """B per variant: mean over groups of the largest ||t_i|| (StableDRL family; its convex-hull bound), the largest
    per-sample term ||A_i grad(E_i / L)|| (ESPO) or per-token term ||A_i grad log pi_ik|| (GRPO)."""
    group_size = x.group_ids.numel() // x.num_groups
    family = float(sample_terms(x).norm(dim=1).view(x.num_groups, group_size).max(1).values.mean())
    return {
        "stabledrl": family,
        "selfnorm_only": family,
        "clip_only": family,
        "espo": float((x.advantages[:, None] * x.elbo_vec).norm(dim=1).max()),
        "grpo": float((x.advantages[:, None, None] * x.token_vec).norm(dim=2).max()),
    }


def hull_trial(generator: torch.Generator, scale: float, *, clip_threshold: float = 5.0, **shape: int) -> dict:
    """Update norm, bound, their ratio and the largest ratio rho of one random trial, per variant; for StableDRL
    also the residual of the explicit convex combination and the weights' range."""
    x = draw_inputs(generator, scale, **shape)
    u, b = updates(x, clip_threshold), bounds(x)
    rho_seq, rho_tok = float(torch.exp(x.log_ratio.max())), float(torch.exp(x.token_log_ratio.max()))
    out = {v: _entry(u[v], b[v], rho_tok if v == "grpo" else rho_seq) for v in HULL_VARIANTS}
    weights = importance_weights(x.log_ratio, x.group_ids, clip_high=math.log(clip_threshold)).double()
    rebuilt = -(weights[:, None] * sample_terms(x)).sum(0) / x.num_groups
    out["stabledrl"]["residual"] = float((u["stabledrl"] - rebuilt).norm() / rebuilt.norm().clamp(min=1e-300))
    out["stabledrl"]["weight_min"] = float(weights.min())
    out["stabledrl"]["weight_sum_error"] = float((weights.view(x.num_groups, -1).sum(1) - 1).abs().max())
    return out


def _norm(vector: torch.Tensor) -> float:
    """Euclidean norm without overflow in the squares: entries above ~1e154 are finite, their squares are not."""
    scale = vector.abs().max()
    if not bool(torch.isfinite(scale)) or float(scale) == 0.0:
        return float(scale)
    return float(scale * (vector / scale).norm())


def _entry(update: torch.Tensor, bound: float, rho_max: float) -> dict[str, float]:
    norm = _norm(update)
    return {
        "norm": norm,
        "bound": bound,
        "ratio": norm / bound if math.isfinite(norm) else math.inf,
        "rho_max": rho_max,
    }


def run_hull(trials: int, scales: Sequence[float], seed: int, **shape: int) -> list[dict[str, Any]]:
    """``trials`` random trials (the Cauchy scale cycles through ``scales``); one record per trial."""
    generator = torch.Generator().manual_seed(seed)
    records = []
    for t in range(trials):
        scale = scales[t % len(scales)]
        records.append({"trial": t, "scale": scale, "variants": hull_trial(generator, scale, **shape)})
    return records


def summarize(records: list[dict[str, Any]], scales: Sequence[float]) -> list[dict[str, Any]]:
    """Per variant x scale: max / median of ||update|| / bound, fraction above 1, non-finite updates."""
    rows = []
    for variant in HULL_VARIANTS:
        for scale in (*scales, "all"):
            at = [r["variants"][variant] for r in records if scale == "all" or r["scale"] == scale]
            ratios = [x["ratio"] for x in at]
            finite_ratios = sorted(x for x in ratios if math.isfinite(x))
            row = {
                "variant": variant,
                "scale": scale,
                "trials": len(at),
                "ratio_max": max(finite_ratios) if finite_ratios else None,
                "ratio_median": finite_ratios[len(finite_ratios) // 2] if finite_ratios else None,
                "fraction_above_1": sum(x > 1 + TOLERANCE for x in ratios) / len(ratios),
                "nonfinite": sum(not math.isfinite(x) for x in ratios),
                "rho_max": band([x["rho_max"] for x in at if math.isfinite(x["rho_max"])]),
            }
            if variant == "stabledrl":
                row["residual_max"] = max(x["residual"] for x in at)
                row["weight_min"] = min(x["weight_min"] for x in at)
                row["weight_sum_error_max"] = max(x["weight_sum_error"] for x in at)
            rows.append(row)
    return rows


def plot(records: list[dict[str, Any]], results_dir, clip_threshold: float) -> str:
    """``hull.png``: ||update|| / bound against the largest ratio of the trial, per variant (log-log)."""
    fig, axes = figure(1, width=6.0, height=4.2)
    ax = axes[0]
    for color, variant in zip(colors(len(HULL_VARIANTS)), HULL_VARIANTS, strict=True):
        pts = [
            (math.log10(x["rho_max"]), math.log10(x["ratio"]))
            for x in (r["variants"][variant] for r in records)
            if math.isfinite(x["ratio"]) and x["ratio"] > 0 and 0 < x["rho_max"] < math.inf
        ]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=4, alpha=0.35, color=color, label=variant)
    ax.axhline(0.0, color="black", lw=1, ls="--", label="convex-hull bound (ratio 1)")
    ax.axhline(math.log10(clip_threshold), color="gray", lw=1, ls=":", label=f"C = {clip_threshold:g}")
    ax.set_xlabel("log10 largest importance ratio in the trial", fontsize=8)
    ax.set_ylabel("log10 ||update|| / bound", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, markerscale=3)
    return save_figure(fig, stability_dir(results_dir) / "hull.png", "Update norm relative to the per-sample bound")


# ----------------------------------------------------------------------------------------------- command
@dataclass(frozen=True)
class HullOptions:
    """``stress hull``: how many random trials at which Cauchy scales, the seed, and StableDRL's clip threshold."""

    trials: int = option(4000, "random trials (inputs of the update rules), cycled over the scales", parse=positive_int)
    scales: str = option("0.1,0.3,1,3,10", "Cauchy scales of the log-ratios, cycled over trials")
    seed: int = option(0, "seed of the random trials")
    clip_threshold: float = option(5.0, "StableDRL's clip threshold C")


def _rederive(record: Mapping[str, Any]) -> dict[str, Any]:
    """The summary recomputed by running the recorded trials again: they are seeded and take seconds."""
    settings = record["settings"]
    records = run_hull(
        settings["trials"], record["scales"], settings["seed"], clip_threshold=settings["clip_threshold"]
    )
    return {"summary": summarize(records, record["scales"])}


def _run_hull(stress: StressOptions, options: HullOptions) -> Path:
    start = (time.perf_counter(), time.process_time())
    scales = comma_list(options.scales, "--scales", kind=float, what="scale")
    check_positive(trials=options.trials, clip_threshold=options.clip_threshold, **{f"scale {s:g}": s for s in scales})
    records = run_hull(options.trials, scales, options.seed, clip_threshold=options.clip_threshold)
    summary = summarize(records, scales)
    figure_name = plot(records, Path(stress.results), options.clip_threshold)
    payload = {
        "title": "Convex-hull property",
        "settings": recorded_settings("hull", options),
        "seeds": [options.seed],
        "scales": scales,
        "tolerance": TOLERANCE,
        "summary": summary,
        "plots": {"hull": figure_name},
        **runtime(start, 1, None),
    }
    return write_record(stress.results, "hull", payload)


EXPERIMENTS.register(
    "hull",
    Experiment(
        "hull",
        "convex-hull property of the update on random inputs (no model)",
        HullOptions,
        _run_hull,
        report=hull_block,
        observations=hull_claims,
        rederive=_rederive,
    ),
)
