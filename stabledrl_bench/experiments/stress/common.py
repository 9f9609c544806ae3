"""Shared pieces of the stability experiments: the stress model and its warm start, the exploding-noise condition,
the precise spike and collapse definitions, result records and seed-band plots.

Why a dedicated stress model: the mechanism under test (estimated ratios -> bypassed clip -> gradient spikes ->
drift -> collapse) lives in the loss, not in model size, and every experiment must fit ~15 minutes on 2 CPU cores
including its warm start. The stress model is the built-in tiny transformer shrunk to 2 layers of width 64 (about
0.1 M parameters, ~5x cheaper than the ``tiny`` preset model), SFT'd on procedurally generated 4x4 Sudoku with the
``tiny`` protocol, which brings its reward (d1 cell accuracy of the blanks) from 0 to ~0.4, above the 0.25 of
guessing, with non-zero spread inside a group (so advantages are non-zero). All runs of all experiments start from
this one checkpoint.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stabledrl_bench.errors import UserError
from stabledrl_bench.plots import new_figure, save_png
from stabledrl_bench.reporting.results import STABILITY_DIR, read_json_record, write_json_record
from stabledrl_bench.training.runlog import finite, running_mean

if TYPE_CHECKING:
    import torch

    from stabledrl_bench.core.estimators import Estimate
    from stabledrl_bench.experiments.runner import WarmStart

SCHEMA = "stabledrl-bench/stability/v1"
CONDITIONS = ("normal", "exploding")


# ----------------------------------------------------------------------------------------------- warm start
STRESS_MODEL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 176,
    "seed": 0,
}
STRESS_TASK, STRESS_PROTOCOL = "sudoku", "tiny"
SFT_STEPS = 1000


def stress_warm_start(sft_steps: int = SFT_STEPS) -> WarmStart:
    """The shared starting point: a freshly initialised stress model, then masked-diffusion SFT on Sudoku."""
    from stabledrl_bench.experiments.runner import WarmStart  # the training stack: not for the leaderboard
    from stabledrl_bench.training.optim import OptimConfig
    from stabledrl_bench.training.sft import SFTConfig

    sft = SFTConfig(
        task=STRESS_TASK,
        protocol=STRESS_PROTOCOL,
        train_split="generated",
        max_steps=sft_steps,
        batch_size=64,
        max_completion_length=40,
        optim=OptimConfig(
            learning_rate=3e-3, weight_decay=0.01, lr_scheduler_type="cosine", warmup_steps=20, max_grad_norm=1.0
        ),
        seed=0,
    )
    return WarmStart(sft=sft, init=STRESS_MODEL)


# ------------------------------------------------------------------------------------------- exploding noise
@dataclass(frozen=True)
class ExplodingNoise:
    """The ``exploding`` condition: heavy-tailed noise on every estimated importance log-ratio.

    Each log-ratio a method exponentiates (per token for GRPO, per sequence for ESPO / StableDRL and its
    ablations) gets an independent additive draw ``scale * StudentT(df)`` with probability ``probability``
    (default: Cauchy, scale 1, every ratio), i.e. rho_hat = rho * exp(-xi). ``df = 1`` makes rho_hat have no
    finite moments: the paper's "exploding weights" (a single ratio around 10^5 needs xi ~ 11.5; the largest of
    64 Cauchy(0, 1) draws is ~20 on average). The trainer adds the draw to the rollout-policy estimate
    (:class:`NoiseInjection`, its ``old_estimate_hook``), never to the gradient path. Methods that compute
    no ratio (SPG) are unaffected by construction.
    """

    df: float = 1.0
    scale: float = 1.0
    probability: float = 1.0

    def __post_init__(self) -> None:
        if not (self.df > 0 and self.scale > 0 and 0 < self.probability <= 1):
            raise UserError(
                f"exploding noise needs df > 0, scale > 0 and 0 < probability <= 1; got df={self.df}, "
                f"scale={self.scale}, probability={self.probability}"
            )

    def injection(self, baseline: str, max_completion_length: int) -> NoiseInjection:
        """The trainer hook for ``baseline``: the noise lands on the estimate in the units the ratio uses.

        ESPO's log-ratio is Delta ELBO / L on a summed ELBO, so its ELBO noise is scaled by L to give the same
        ``scale`` on the log-ratio; every other method's estimate is already on its log-ratio scale.
        """
        factor = max_completion_length if baseline == "espo" else 1
        return NoiseInjection(df=self.df, scale=self.scale * factor, probability=self.probability)

    def describe(self) -> str:
        dist = "Cauchy" if self.df == 1 else f"Student-t(df={self.df:g})"
        return (
            f"log rho_hat = log rho - xi, xi = {self.scale:g} x {dist}, independently per ratio (token for GRPO, "
            f"sequence otherwise) with probability {self.probability:g}"
        )


@dataclass(frozen=True)
class NoiseInjection:
    """One run's noise on the *estimated* rollout log-likelihoods: a trainer ``old_estimate_hook``.

    Each completion (sequence-level estimators) or token (token-level estimators) gets an independent draw
    ``scale * StudentT(df)`` with probability ``probability``, from the generator the trainer passes (its private
    ``noise`` stream). The noise enters the log-ratio with a minus sign; it never touches the gradient path.
    """

    df: float = 1.0
    scale: float = 1.0
    probability: float = 1.0

    def __call__(self, old: Estimate, generator: torch.Generator) -> Estimate:
        from stabledrl_bench.core.estimators import Estimate

        return Estimate(
            token_logp=self._perturb(old.token_logp, generator),
            token_mask=old.token_mask,
            row_to_seq=old.row_to_seq,
            elbo=self._perturb(old.elbo, generator),
            eubo=old.eubo,
        )

    def _perturb(self, t: torch.Tensor | None, generator: torch.Generator) -> torch.Tensor | None:
        import torch

        if t is None:
            return None
        # Student-t(df) = N(0,1) / sqrt(Chi2(df) / df), with Chi2(df) = 2 * Gamma(df / 2), all from `generator`.
        normal = torch.randn(t.shape, generator=generator)
        chi2 = 2.0 * torch._standard_gamma(torch.full(t.shape, self.df / 2.0), generator=generator)
        draw = normal / torch.sqrt(chi2 / self.df)
        hit = torch.rand(t.shape, generator=generator) < self.probability
        draw = torch.where(hit, draw, torch.zeros_like(draw)) * self.scale
        return t + draw.to(t.device, t.dtype)


# ------------------------------------------------------------------------------------------ spikes, collapse
@dataclass(frozen=True)
class Definitions:
    """The spike and collapse definitions every experiment reports with (all settable on the command line).

    * spike at step t: the pre-clip gradient norm g_t is non-finite, or g_t > ``spike_k`` x median of the finite
      g over the previous ``spike_window`` steps (needs ``spike_min_history`` of them; earlier steps are never
      spikes unless non-finite);
    * collapse: the trainer stopped on ``max_nonfinite_steps`` consecutive non-finite steps (step of the stop), or
      reward collapse: with R0 = mean rollout reward of the first ``initial_rollouts`` rollouts and R_bar(t) = mean
      over the last ``reward_window`` rollouts up to t, the first rollout step t from which R_bar stays below
      ``collapse_fraction`` x R0 until the end of the run, provided the run continued >= ``confirm_steps`` steps
      after t (a drop in the last steps is not called a collapse).
    """

    spike_k: float = 5.0
    spike_window: int = 20
    spike_min_history: int = 5
    collapse_fraction: float = 0.5
    initial_rollouts: int = 3
    reward_window: int = 5
    confirm_steps: int = 10

    def __post_init__(self) -> None:
        if self.spike_k <= 1 or not 0 < self.collapse_fraction < 1:
            raise UserError("need --spike-k > 1 and 0 < --collapse-fraction < 1")
        if min(self.spike_window, self.spike_min_history, self.initial_rollouts, self.reward_window) < 1:
            raise UserError("spike window, history and reward windows must be >= 1")
        if self.spike_min_history > self.spike_window:
            raise UserError("spike_min_history cannot exceed spike_window")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> dict[str, str]:
        return {
            "spike": (
                f"pre-clip grad norm non-finite, or > {self.spike_k:g} x median of the previous {self.spike_window} "
                f"steps' finite norms (at least {self.spike_min_history} of them)"
            ),
            "collapse": (
                "non-finite divergence (trainer stop), or the first rollout step from which the mean reward of the "
                f"last {self.reward_window} rollouts stays below {self.collapse_fraction:g} x the mean of the first "
                f"{self.initial_rollouts} rollouts until the end, confirmed by >= {self.confirm_steps} later steps"
            ),
        }


def spike_steps(steps: Sequence[int], grad_norms: Sequence[float], d: Definitions) -> list[int]:
    """Steps whose pre-clip gradient norm is a spike (:class:`Definitions`)."""
    spikes, history = [], []
    for step, g in zip(steps, grad_norms, strict=True):
        if not finite(g):
            spikes.append(step)
            continue
        recent = history[-d.spike_window :]
        if len(recent) >= d.spike_min_history and g > d.spike_k * statistics.median(recent):
            spikes.append(step)
        history.append(g)
    return spikes


def collapse_step(
    reward_steps: Sequence[int], rewards: Sequence[float], last_step: int, diverged_at: int | None, d: Definitions
) -> tuple[int | None, str | None]:
    """``(step, kind)`` of the collapse (:class:`Definitions`), kind ``"nonfinite"`` or ``"reward"``; else None."""
    if diverged_at is not None:
        return diverged_at, "nonfinite"
    if len(rewards) <= d.initial_rollouts:
        return None, None
    initial = [r for r in rewards[: d.initial_rollouts] if finite(r)]
    if not initial:
        return None, None
    threshold = d.collapse_fraction * statistics.fmean(initial)
    running = running_mean(rewards, d.reward_window)
    start = None
    for i in range(len(running) - 1, d.initial_rollouts - 1, -1):  # walk back while the tail stays below
        if running[i] is None or running[i] >= threshold:
            break
        start = i
    if start is None or last_step - reward_steps[start] < d.confirm_steps:
        return None, None
    return reward_steps[start], "reward"


# ---------------------------------------------------------------------------------------------- statistics
def band(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and min/max of the finite values (None where there are none)."""
    kept = [v for v in values if finite(v)]
    if not kept:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(kept), "min": min(kept), "max": max(kept), "n": len(kept)}


# ------------------------------------------------------------------------------------------------- records
def stability_dir(results_dir: Path | str) -> Path:
    return Path(results_dir) / STABILITY_DIR


def write_record(results_dir: Path | str, experiment: str, payload: Mapping[str, Any]) -> Path:
    """``results/stability/<experiment>.json`` through the package's one record writer."""
    path = stability_dir(results_dir) / f"{experiment}.json"
    return write_json_record(path, SCHEMA, {"experiment": experiment, **payload})


def read_record(path: Path) -> dict[str, Any]:
    """A stability record, or a one-line error naming the file."""
    return read_json_record(path, SCHEMA)


# --------------------------------------------------------------------------------------------------- plots
@dataclass
class Series:
    """One labelled curve family: per-seed (x, y) lists, which may have different lengths (stopped runs)."""

    label: str
    runs: list[tuple[list[float], list[float]]] = field(default_factory=list)
    stopped: list[float] = field(default_factory=list)  # x where a run stopped on non-finite steps


def seed_band(ax, series: Series, color, *, log: bool = False) -> bool:
    """Mean over the seeds that reached each x (geometric on a log axis), shaded min/max band, a dotted vertical
    line where a run stopped; returns whether any curve was drawn (a log axis needs some positive value)."""
    import numpy as np

    for x in series.stopped:
        ax.axvline(x, color=color, ls=":", lw=1.2)
    xs = sorted({x for run_x, _ in series.runs for x in run_x})
    table: dict[float, list[float]] = {x: [] for x in xs}
    for run_x, run_y in series.runs:
        for x, y in zip(run_x, run_y, strict=True):
            if finite(y) and (y > 0 or not log):
                table[x].append(y)
    kept = [x for x in xs if table[x]]
    if not kept:
        return False
    mean = [float(np.exp(np.mean(np.log(table[x])))) if log else float(np.mean(table[x])) for x in kept]
    ax.plot(kept, mean, color=color, lw=1.3, label=series.label)
    ax.fill_between(kept, [min(table[x]) for x in kept], [max(table[x]) for x in kept], color=color, alpha=0.18)
    return True


def figure(panels: int, *, width: float = 4.6, height: float = 3.2):
    """A row of ``panels`` axes, each ``width`` x ``height`` inches: returns the figure and the list of axes."""
    fig = new_figure(width * panels, height)
    return fig, list(fig.subplots(1, panels, squeeze=False)[0])


def save_figure(fig, path: Path, title: str) -> str:
    fig.suptitle(title, fontsize=10)
    return save_png(fig, path).name


COLORS = ("tab:red", "tab:orange", "tab:purple", "tab:blue", "tab:green", "tab:brown", "tab:gray", "tab:olive")
