"""Shared pieces of the stability experiments: the task and warm start, the exploding-noise condition, the precise
spike and collapse definitions, result records and seed-band plots.

Why this start: a stability verdict needs runs that can learn. The experiments start from the tiny Table 1 preset's
Sudoku 12-blank warm start (the built-in 0.8 M-parameter tiny model, masked-diffusion SFT on generated 8-blank
puzzles over canvases 40..64, training seed 0), where the tiny Table 1 measured RL gains: its rollouts on generated
12-blank puzzles at the 48-token canvas close the answer tag and fill most cells (reward ~0.8, d1 cell accuracy of
the blanks), so a gain is a gain in solving and a fall to reward 0 is not a tokenizer artefact of a start that
never learned the format. All runs of all experiments start from this one checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stabledrl_bench.core.estimators import Estimate
from stabledrl_bench.errors import UserError
from stabledrl_bench.plots import LOG_AXIS_MAX, log_axis_values, new_figure, save_png
from stabledrl_bench.reporting.curves import finite, running_mean
from stabledrl_bench.reporting.results import STABILITY_DIR, read_json_record, write_json_record

if TYPE_CHECKING:
    from stabledrl_bench.experiments.runner import WarmStart

SCHEMA = "stabledrl-bench/stability/v1"
CONDITIONS = ("normal", "exploding")


# ----------------------------------------------------------------------------------------------- warm start
STRESS_TASK, STRESS_PROTOCOL = "sudoku_hard", "tiny"
STRESS_GENERATOR = {"num_blanks": 12}  # RL puzzles: 12 of 16 cells blank (the warm start learned on 8)
STRESS_CANVAS = 48  # the tiny Table 1's RL canvas, where the start closes the answer tag


def stress_warm_start(sft_steps: int | None = None) -> WarmStart:
    """The shared starting point (module docstring); ``sft_steps`` overrides the preset's SFT length."""
    from stabledrl_bench.experiments.presets import presets, warm_start_spec  # the training stack: on call

    spec = warm_start_spec(presets("table1")["tiny"], STRESS_TASK, "tiny", seed=0)
    if sft_steps is None:
        return spec
    return dataclasses.replace(spec, sft=dataclasses.replace(spec.sft, max_steps=sft_steps))


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

        return Estimate(
            token_logp=self._perturb(old.token_logp, generator),
            token_mask=old.token_mask,
            row_to_seq=old.row_to_seq,
            elbo=self._perturb(old.elbo, generator),
            eubo=old.eubo,
        )

    def _perturb(self, t: torch.Tensor | None, generator: torch.Generator) -> torch.Tensor | None:
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
    * below at rollout t: R_bar(t), the mean rollout reward of the last ``reward_window`` rollouts up to t, is below
      ``collapse_fraction`` x F_bar(t), the same running mean of the frozen control (the start trained with learning
      rate 0: the same prompts and random numbers, so an easier or harder stretch of prompts is not a collapse);
    * collapse: the trainer stopped on ``max_nonfinite_steps`` consecutive non-finite steps (step of the stop), or a
      stretch below that lasts to the end of the run, began in the first ``1 - ignore_tail`` of the planned steps
      and lasted >= ``confirm_steps`` steps (its first step is the collapse step);
    * transient collapse: a stretch below of >= ``confirm_steps`` steps that recovered before the end.

    Why against the frozen control and not the run's own first rollouts: those already include updated policies,
    and the level of the prompts drawn changes along the run; the control measures both away. Every method is
    judged by the same rule; the steps spent at exactly zero reward (no gradient for any group-relative method)
    are counted beside it.
    """

    spike_k: float = 5.0
    spike_window: int = 20
    spike_min_history: int = 5
    collapse_fraction: float = 0.5
    initial_rollouts: int = 3  # reported as the run's initial reward, never a reference level
    reward_window: int = 5
    confirm_steps: int = 50
    ignore_tail: float = 0.05

    def __post_init__(self) -> None:
        if self.spike_k <= 1 or not 0 < self.collapse_fraction < 1:
            raise UserError("need --spike-k > 1 and 0 < --collapse-fraction < 1")
        if min(self.spike_window, self.spike_min_history, self.initial_rollouts, self.reward_window) < 1:
            raise UserError("spike window, history and reward windows must be >= 1")
        if self.spike_min_history > self.spike_window:
            raise UserError("spike_min_history cannot exceed spike_window")
        if not 0 <= self.ignore_tail < 1:
            raise UserError("need 0 <= --ignore-tail < 1")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> dict[str, str]:
        below = (
            f"the mean reward of the last {self.reward_window} rollouts is below {self.collapse_fraction:g} x the "
            "frozen control's on the same rollouts"
        )
        return {
            "spike": (
                f"pre-clip grad norm non-finite, or > {self.spike_k:g} x median of the previous {self.spike_window} "
                f"steps' finite norms (at least {self.spike_min_history} of them)"
            ),
            "collapse": (
                f"non-finite divergence (trainer stop), or {below} from a rollout on to the end of the run, for "
                f">= {self.confirm_steps} steps, starting in the first {1 - self.ignore_tail:.0%} of the run"
            ),
            "transient": f"{below} for >= {self.confirm_steps} steps, then recovered",
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


def collapse_analysis(
    reward_steps: Sequence[int],
    rewards: Sequence[float | None],
    frozen: Mapping[int, float | None],
    *,
    last_step: int,
    planned_steps: int,
    diverged_at: int | None,
    d: Definitions,
) -> dict[str, Any]:
    """Collapse, transient collapses and zero-reward steps of one run (:class:`Definitions`).

    ``reward_steps[k]`` is the optimizer step of rollout k and ``rewards[k]`` its mean reward; ``frozen`` maps a
    rollout step to the frozen control's reward there. A rollout serves the steps up to the next one (the last
    serves to ``last_step``). Returns ``collapse_step`` and ``collapse_kind`` (``"nonfinite"``, ``"reward"`` or
    None), ``transient_collapses``, ``below_steps`` (steps inside any stretch below) and ``zero_reward_steps``.
    """
    ends = [*reward_steps[1:], last_step + 1]  # rollout k serves steps reward_steps[k] .. ends[k] - 1
    running = running_mean(rewards, d.reward_window)
    reference = running_mean([frozen.get(step) for step in reward_steps], d.reward_window)
    below = [
        r is not None and f is not None and r < d.collapse_fraction * f for r, f in zip(running, reference, strict=True)
    ]
    stretches, k = [], 0  # (first rollout, one past the last rollout) of each stretch below
    while k < len(below):
        if below[k]:
            first = k
            while k < len(below) and below[k]:
                k += 1
            stretches.append((first, k))
        else:
            k += 1
    length = {(a, b): ends[b - 1] - reward_steps[a] for a, b in stretches}
    collapse: tuple[int | None, str | None] = (None, None)
    if diverged_at is not None:
        collapse = (diverged_at, "nonfinite")
    elif stretches:
        a, b = stretches[-1]
        lasting = b == len(below) and length[(a, b)] >= d.confirm_steps
        if lasting and reward_steps[a] <= (1 - d.ignore_tail) * planned_steps:
            collapse = (reward_steps[a], "reward")
    return {
        "collapse_step": collapse[0],
        "collapse_kind": collapse[1],
        "transient_collapses": sum(b < len(below) and length[(a, b)] >= d.confirm_steps for a, b in stretches),
        "below_steps": sum(length.values()),
        "zero_reward_steps": sum(e - s for s, e, r in zip(reward_steps, ends, rewards, strict=True) if r == 0),
    }


# ---------------------------------------------------------------------------------------------- statistics
def band(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and min/max of the finite values (None where there are none)."""
    kept = [v for v in values if finite(v)]
    if not kept:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(kept), "min": min(kept), "max": max(kept), "n": len(kept)}


# ------------------------------------------------------------------------------------------------- records
LRSWEEP = "lrsweep"  # the record of the learning-rate sweep, whose chosen rate the training experiments use


def stability_dir(results_dir: Path | str) -> Path:
    return Path(results_dir) / STABILITY_DIR


def write_record(results_dir: Path | str, experiment: str, payload: Mapping[str, Any]) -> Path:
    """``results/stability/<experiment>.json`` through the package's one record writer."""
    path = stability_dir(results_dir) / f"{experiment}.json"
    return write_json_record(path, SCHEMA, {"experiment": experiment, **payload})


def read_record(path: Path) -> dict[str, Any]:
    """A stability record, or a one-line error naming the file."""
    return read_json_record(path, SCHEMA)


def chosen_lr(results_dir: Path | str, preset: str | None = None, task: str | None = None) -> float:
    """The learning rate the recorded sweep (``stress lrsweep``) chose for these settings (the stress settings, or
    ``preset``'s ``task``), or one error line saying how to get one."""
    path = stability_dir(results_dir) / f"{LRSWEEP}.json"
    if not path.is_file():
        raise UserError(f"no {path}: run `stress lrsweep` first (it chooses the learning rate), or pass --lr")
    record = read_record(path)
    swept = (record.get("preset"), record["task"]["name"] if record.get("preset") else None)
    if swept != (preset, task if preset else None):
        what = f"--preset {swept[0]} --task {swept[1]}" if swept[0] else "the stress settings"
        raise UserError(f"{path} swept {what}: run `stress lrsweep` with the same settings first, or pass --lr")
    if record.get("chosen_lr") is None:
        raise UserError(f"{path}: the sweep chose no learning rate ({record.get('choice')}); pass --lr")
    return float(record["chosen_lr"])


def runtime(
    start: tuple[float, float], workers: int, warm_start: Mapping[str, Any] | None, worker_cpu: float = 0.0
) -> dict[str, Any]:
    """Wall time of this invocation, and the cost of the whole experiment from scratch, which does not depend on
    what was cached: CPU seconds of the warm-start SFT (as recorded when it was built; its wall time for older
    records), of this process and of every run (as recorded by the run), and from them the estimated wall time on
    ``workers`` free cores. A shared machine makes measured wall times pessimistic, hence the load average."""
    main_cpu = time.process_time() - start[1]
    warm = warm_start or {}
    sft_cpu = warm.get("sft_cpu_seconds") or warm.get("sft_seconds") or 0.0
    other_cpu = main_cpu - (sft_cpu if warm.get("built_now") else 0.0)
    return {
        "runtime_s": time.perf_counter() - start[0],
        "cpu_seconds": {"warm_start": sft_cpu, "main": other_cpu, "workers": worker_cpu},
        "estimated_free_cores_s": sft_cpu + other_cpu + worker_cpu / max(1, workers),
        "cores": workers,
        "load_average": os.getloadavg(),
    }


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
    low, high = [min(table[x]) for x in kept], [max(table[x]) for x in kept]
    label = series.label
    if log:
        (mean, _), (low, _), (high, clipped) = map(log_axis_values, (mean, low, high))
        label += f" (drawn at most {LOG_AXIS_MAX:g})" if clipped else ""
    ax.plot(kept, mean, color=color, lw=1.3, label=label)
    ax.fill_between(kept, low, high, color=color, alpha=0.18)
    return True


def figure(panels: int, *, width: float = 4.6, height: float = 3.2):
    """A row of ``panels`` axes, each ``width`` x ``height`` inches: returns the figure and the list of axes."""
    fig = new_figure(width * panels, height)
    return fig, list(fig.subplots(1, panels, squeeze=False)[0])


def save_figure(fig, path: Path, title: str) -> str:
    """Save ``fig`` with ``title`` wrapped to the figure's width (a one-panel figure cannot hold a long line)."""
    fig.suptitle(textwrap.fill(title, width=max(40, int(fig.get_figwidth() * 11))), fontsize=10)
    return save_png(fig, path).name


COLORS = ("tab:red", "tab:orange", "tab:purple", "tab:blue", "tab:green", "tab:brown", "tab:gray", "tab:olive")


def colors(n: int) -> list[Any]:
    """``n`` distinct colours, one per series: :data:`COLORS` while they last, else matplotlib's ``tab20`` (20, then
    repeating), so that no series is left out of a plot for want of a colour."""
    if n <= len(COLORS):
        return list(COLORS[:n])
    from matplotlib import colormaps

    palette = colormaps["tab20"]
    return [palette(i % palette.N) for i in range(n)]
