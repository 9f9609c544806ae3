"""The measurement behind ``stress drift`` (steps 2-3 of :mod:`.drift`): every update rule's update norm at a
policy drifted away from the rollout policy, on the real model, estimators and losses, without a training loop.

For each drift level sigma and repeat, a drifted policy theta = theta_0 + sigma * rms(W) * N(0, 1) per parameter
tensor W (one fresh direction per repeat, shared by every variant); for every variant, the rollout-policy estimate
at theta_0 and the current estimate at theta with the method's own masks (coupled for GRPO / ESPO, independent for
the StableDRL family, as their trainers do), optionally the ``exploding`` noise on the rollout estimate, the
method's loss, and the norm of its gradient with respect to all model parameters (autograd: the pre-clip update
norm the trainer logs). Variants (the 2 x 2 of conditional / unconditional clipping and with / without
self-normalisation, plus token- vs sequence-level conditional clipping):

==================  ===============================  =================================================
variant             clipping                         normalisation
==================  ===============================  =================================================
``grpo``            conditional (PPO min), token     1 / (valid tokens)
``espo``            conditional (PPO min), sequence  1 / B
``clip_only``       unconditional, rho <= C          1 / G (fixed)
``selfnorm_only``   none                             self-normalised (group softmax of log rho)
``stabledrl``       unconditional, rho <= C          self-normalised
==================  ===============================  =================================================

GRPO and ESPO run with beta = 0 here (their KL terms do not involve the ratio being studied).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from stabledrl_bench.core.advantages import group_index, group_log_softmax, group_reduce
from stabledrl_bench.core.baseline import Baseline, LossInputs, build_baseline, training_estimator
from stabledrl_bench.core.estimators import Estimate, Estimator
from stabledrl_bench.experiments.stress.common import ExplodingNoise, NoiseInjection, finite

if TYPE_CHECKING:  # annotations only (the training stack is not imported to build the `stress` command line)
    from stabledrl_bench.core.models import DiffusionLM
    from stabledrl_bench.training.trainer import SampledBatch

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {"beta": 0.0}),
    "espo": ("espo", {"beta": 0.0}),
    "clip_only": ("stabledrl_clip_only", {}),
    "selfnorm_only": ("stabledrl_selfnorm_only", {}),
    "stabledrl": ("stabledrl", {}),
    "stabledrl_mc1": ("stabledrl", {"num_mc": 1}),  # one mask sample per ELBO: how much noisier the log-weights are
}
CLIPPING = {
    "grpo": ("conditional (token)", "1/tokens"),
    "espo": ("conditional (sequence)", "1/B"),
    "clip_only": ("unconditional", "1/G"),
    "selfnorm_only": ("none", "self-normalised"),
    "stabledrl": ("unconditional", "self-normalised"),
    "stabledrl_mc1": ("unconditional", "self-normalised"),
}


def variant_estimator(baseline: Baseline, dlm: DiffusionLM, block_length: int) -> tuple[Estimator, tuple]:
    """The estimator the trainer would build for ``baseline`` and a key that groups variants sharing it."""
    estimator = training_estimator(baseline, dlm, block_length=block_length)
    key = (estimator, baseline.config.coupled)  # estimators are frozen settings: equal settings, equal key
    return estimator, key


def perturb_(model: torch.nn.Module, theta0: dict[str, torch.Tensor], sigma: float, generator) -> None:
    """theta = theta_0 + sigma * rms(theta_0 tensor) * N(0, 1), per parameter tensor, in place."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            base = theta0[name]
            direction = torch.randn(base.shape, generator=generator, dtype=base.dtype)
            param.copy_(base + sigma * base.pow(2).mean().sqrt() * direction)


def update_norm(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> float:
    """||d loss / d params||_2 (inf when non-finite), keeping the graph for the next variant's loss."""
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    total = sum(float(g.double().pow(2).sum()) for g in grads if g is not None)
    return math.sqrt(total) if math.isfinite(total) else math.inf


def measure_update_norms(
    dlm: DiffusionLM,
    rollouts: Sequence[SampledBatch],
    variants: Sequence[str],
    levels: Sequence[float],
    repeats: int,
    conditions: Sequence[str],
    noise: ExplodingNoise,
    *,
    seed: int,
    block_length: int,
) -> list[dict[str, Any]]:
    """One record per (level, repeat): the measured policy drift and every variant's update norm per condition.

    The model's parameters are restored to theta_0 afterwards. Randomness (directions, masks, noise) comes from
    generators seeded with (seed, level index, repeat); every variant of a repeat sees the same drifted policy.
    """
    model = dlm.model
    params = [p for p in model.parameters() if p.requires_grad]
    theta0 = {name: p.detach().clone() for name, p in model.named_parameters()}
    built = {v: build_baseline(VARIANTS[v][0], **VARIANTS[v][1]) for v in variants}
    groups: dict[tuple, tuple[Estimator, list[str]]] = {}
    for v, baseline in built.items():
        estimator, key = variant_estimator(baseline, dlm, block_length)
        groups.setdefault(key, (estimator, []))[1].append(v)
    drift_estimator, _ = variant_estimator(build_baseline("stabledrl"), dlm, block_length)
    max_completion_length = rollouts[0].batch.completion_ids.shape[1]
    records = []
    bar = tqdm(total=len(levels) * repeats, desc=f"drift seed {seed}", dynamic_ncols=True, leave=False)
    for li, sigma in enumerate(levels):
        for r in range(repeats):
            base = 2 * (1_000_003 * seed + 10_007 * li + r)
            gen = torch.Generator().manual_seed(base)  # masks and noise
            direction_seed = base + 1  # the drift direction: one stream, replayed for every estimator group
            rollout = rollouts[r % len(rollouts)]
            batch = rollout.batch
            drift_noise = drift_estimator.draw(batch, gen)
            model.load_state_dict(theta0)
            with torch.no_grad():
                e0 = drift_estimator.evaluate(dlm, batch, drift_noise).elbo
                perturb_(model, theta0, sigma, torch.Generator().manual_seed(direction_seed))
                e1 = drift_estimator.evaluate(dlm, batch, drift_noise).elbo
            record = {"level": sigma, "repeat": r, "policy_drift": float((e1 - e0).abs().mean()), "variants": {}}
            for estimator, members in groups.values():
                coupled = built[members[0]].config.coupled
                old_noise = estimator.draw(batch, gen)
                new_noise = old_noise if coupled else estimator.draw(batch, gen)
                model.load_state_dict(theta0)
                with torch.no_grad():
                    old = estimator.evaluate(dlm, batch, old_noise).detach()
                perturb_(model, theta0, sigma, torch.Generator().manual_seed(direction_seed))
                new = estimator.evaluate(dlm, batch, new_noise)
                for v in members:
                    record["variants"][v] = _variant_norms(
                        built[v], rollout, new, old, conditions, noise, max_completion_length, gen, params
                    )
            records.append(record)
            bar.update(1)
    bar.close()
    model.load_state_dict(theta0)
    return records


def log_weight_noise(log_ratio: torch.Tensor, group_ids: torch.Tensor, clip_high: float) -> dict[str, float]:
    """How noisy StableDRL's log-weights log rho_i = E_theta_i - E_old_i are (per-completion ELBOs on the loss's
    scale): their standard deviation in nats, the fraction of ratios above the clip C = exp(``clip_high``), and the
    effective sample size of the clipped, self-normalised weights of each group, (sum w)^2 / sum w^2 / G, averaged
    over groups (1: every completion counts equally; 1/G: one completion carries the whole group).

    At zero drift the policy equals the rollout policy, so every rho is 1 and all of this is estimator noise: the
    quantity the paper's argument is about."""
    x = log_ratio.detach().double()
    weights = group_log_softmax(x.clamp(max=clip_high), group_ids).exp()  # the loss's own weights
    index, num_groups = group_index(group_ids)
    ess = 1.0 / group_reduce(weights.pow(2), index, num_groups) / torch.bincount(index, minlength=num_groups)
    return {
        "log_weight_std": float(x.std(unbiased=False)),
        "at_clip": float((x > clip_high).double().mean()),
        "ess": float(ess.mean()),
    }


def _variant_norms(
    baseline: Baseline,
    rollout: SampledBatch,
    new: Estimate,
    old: Estimate,
    conditions: Sequence[str],
    noise: ExplodingNoise,
    max_completion_length: int,
    generator: torch.Generator,
    params: Sequence[torch.Tensor],
) -> dict[str, dict[str, float | None]]:
    """Update norm and ratio diagnostics of one variant under each condition (the method's own advantages)."""
    advantages, _ = baseline.advantages(rollout.rewards, rollout.group_ids, rollout.correct, rollout.batch.records)
    out = {}
    for condition in conditions:
        injection: NoiseInjection | None = (
            noise.injection(baseline.name, max_completion_length) if condition == "exploding" else None
        )
        inputs = LossInputs(
            new=new,
            old=old if injection is None else injection(old, generator),
            ref=None,
            advantages=advantages,
            completion_mask=rollout.batch.completion_mask,
            group_ids=rollout.group_ids,
        )
        loss, metrics = baseline.loss(inputs)
        norm = update_norm(loss, params)
        out[condition] = {
            "norm": norm if math.isfinite(norm) else None,
            "ratio_max": metrics.get("ratio_max") if finite(metrics.get("ratio_max")) else None,
            "drift": metrics.get("drift") if finite(metrics.get("drift")) else None,
        }
        if condition == "normal" and hasattr(baseline.config, "clip_high"):  # the StableDRL family's weights
            out[condition]["noise"] = log_weight_noise(
                new.elbo - old.elbo, rollout.group_ids, baseline.config.clip_high
            )
    return out
