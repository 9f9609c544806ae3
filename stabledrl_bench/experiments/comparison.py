"""One ``reproduce`` command as typed values: the :class:`Comparison` it runs (preset, model, baselines, tasks,
seeds, folders, the optional sampled evaluation), and the :class:`Replicate` s it consists of (one task, one seed).

Why typed and built once: every option of the command line is checked when the :class:`Comparison` is built
(:func:`comparison`), so a bad option is one line before anything runs, not an error after the first warm start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stabledrl_bench.core.baseline import BASELINES, build_baseline
from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.core.models.backends import TINY_SPECS
from stabledrl_bench.core.models.fit import weight_shapes
from stabledrl_bench.errors import INT64_LIMIT, UserError, comma_list
from stabledrl_bench.evaluation.protocols import EvalProtocol, get_protocol, sampled_protocol
from stabledrl_bench.experiments.presets import Preset, choose_preset
from stabledrl_bench.experiments.starts import STARTS_DIR, committed_starts
from stabledrl_bench.processes import available_cores, launched, threads_for
from stabledrl_bench.reporting.naming import ResultKey

TABLE_BASELINES = ("grpo", "spg", "espo", "trado", "stabledrl")


@dataclass(frozen=True)
class SampledEval:
    """``--pass-k``: every test problem also decoded ``samples`` times at ``temperature`` (pass@k, maj@k) at the
    nominal ``lengths`` (empty: every length of the preset)."""

    samples: int
    temperature: float = 1.0
    lengths: tuple[int, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """One ``reproduce`` command: every baseline trained under the preset's budget on every task and seed, each
    checkpoint evaluated under every protocol and length. Built from the command line once (:func:`comparison`)."""

    table: str
    preset: Preset
    model: str  # the start: a checkpoint, or the preset's built-in model
    baselines: tuple[str, ...]
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    runs_root: Path  # --runs; this comparison's runs go to runs_root/<name>
    results: Path
    leaderboard: Path
    limit: int | None = None  # evaluate the first N test items only (None: the preset's eval_limit)
    force: bool = False
    check_model: bool = True
    sampled: SampledEval | None = None
    eval_every: int = 0  # --eval-every: validation every N steps and the best checkpoint evaluated too (0: off)
    workers: int = 1  # --workers: stages run side by side in this many processes
    threads: int = 1  # each stage's intra-op threads: by the model's size (processes.threads_for)
    starts: Path | None = STARTS_DIR  # committed warm starts copied instead of training (None: --train-starts)

    @property
    def name(self) -> str:
        return f"{self.table}-{self.preset.name}"

    @property
    def runs(self) -> Path:
        return self.runs_root / self.name

    @property
    def eval_limit(self) -> int | None:
        return self.limit if self.limit is not None else self.preset.eval_limit

    def evaluations(self) -> list[tuple[EvalProtocol, dict[int, int]]]:
        """Every (protocol, nominal -> decoded length) a checkpoint is evaluated under: the preset's protocols at
        every length, and with ``--pass-k`` each of them sampled (:func:`sampled_protocol`) at its lengths."""
        evaluations = [(get_protocol(name), self.preset.lengths) for name in self.preset.protocols]
        if self.sampled is None:
            return evaluations
        lengths = {n: self.preset.lengths[n] for n in self.sampled.lengths or self.preset.lengths}
        sampled = [
            (sampled_protocol(name, self.sampled.samples, self.sampled.temperature), lengths)
            for name in self.preset.protocols
        ]
        return evaluations + sampled


@dataclass(frozen=True)
class Replicate:
    """One training seed of one task of a comparison: warm start, every baseline, the frozen control."""

    comparison: Comparison
    task: str
    seed: int

    @property
    def runs(self) -> Path:
        return self.comparison.runs / self.task / f"s{self.seed}"

    @property
    def where(self) -> str:
        return f"{self.task} seed {self.seed}"

    def result_key(self, baseline: str, protocol: EvalProtocol, length: int, model: dict[str, Any]) -> ResultKey:
        table = self.comparison.table
        return ResultKey(
            comparison=self.comparison.name,
            table=table,
            preset=self.comparison.preset.name,
            baseline=baseline,
            task=self.task,
            length=length,
            sampling=None if table == "table1" else protocol.sampling,
            protocol=protocol.name,
            seed=self.seed,
            model=model,
        )


def comparison(
    table: str,
    *,
    preset: str = "auto",
    model: str | None = None,
    baselines: str | None = None,
    tasks: str | None = None,
    seeds: str | None = None,
    runs: str = "runs",
    results: str | None = None,
    leaderboard: str | None = None,
    limit: int | None = None,
    force: bool = False,
    check_model: bool = True,
    pass_k: int | None = None,
    temperature: float = 1.0,
    pass_k_lengths: str | None = None,
    eval_every: int | None = None,
    workers: int | None = None,
    starts: str | None = None,
    train_starts: bool = False,
) -> Comparison:
    """The :class:`Comparison` the ``reproduce`` options ask for (the command line's text, checked here): every
    bad option is one line before anything runs, not after the first warm start.

    Results and the leaderboard go under ``runs`` unless named: the repository's committed ``results/`` and
    ``leaderboard.md`` are what this very command wrote for the maintainers, and a user's run (whose weights may
    differ in the last bit) must not rewrite them unasked."""
    chosen = choose_preset(table, preset, model)
    sampled = None
    if pass_k:
        lengths = ()
        if pass_k_lengths:
            known = [str(n) for n in chosen.lengths]
            lengths = tuple(comma_list(pass_k_lengths, "--pass-k-lengths", kind=int, choices=known, what="length"))
        sampled = SampledEval(pass_k, temperature, lengths)
    built = Comparison(
        table=table,
        preset=chosen,
        model=model or str(chosen.model),
        baselines=tuple(
            comma_list(baselines, "--baselines", choices=BASELINES.entries(), what="baseline")
            if baselines
            else TABLE_BASELINES
        ),
        tasks=tuple(
            comma_list(tasks, "--tasks", choices=chosen.tasks, what="task") if tasks else chosen.default_tasks()
        ),
        seeds=_seeds(seeds, chosen.seeds),
        runs_root=Path(runs),
        results=Path(results) if results else Path(runs) / "results",
        leaderboard=Path(leaderboard) if leaderboard else Path(runs) / "leaderboard.md",
        limit=limit,
        force=force,
        check_model=check_model,
        sampled=sampled,
        eval_every=chosen.validation.every if eval_every is None else eval_every,
        **_parallelism(model or str(chosen.model), workers),
        starts=None if train_starts else _starts(starts),
    )
    unknown = sorted(set(chosen.validation.lengths) - set(chosen.lengths))
    if unknown:
        raise UserError(f"preset {chosen.name!r}: validation lengths {unknown} are not lengths of the preset")
    built.evaluations()  # a sampled protocol that cannot be built (e.g. --pass-k 1) fails now
    for baseline in built.baselines:  # a method that cannot learn under the budget fails before any warm start
        build_baseline(baseline).require_groups(chosen.budget.num_generations)
    return built


def _starts(starts: str | None) -> Path:
    """``--starts`` (default: the repository's committed starts, which may be absent, e.g. in a wheel)."""
    if starts is None:
        return STARTS_DIR
    if not Path(starts).is_dir():
        raise UserError(f"--starts {starts}: no such folder")
    committed_starts(Path(starts))  # a broken start.json is an error now, not after other stages ran
    return Path(starts)


def _parallelism(model: str, workers: int | None) -> dict[str, int]:
    """``--workers`` (default: as many as the cores hold jobs of the start's size) and each job's threads
    (:func:`~stabledrl_bench.processes.threads_for`). One worker on a GPU or under a launch: there a job already
    uses the whole device or every process."""
    threads = threads_for(start_parameters(model))
    if launched() or torch.cuda.is_available():
        if workers is not None and workers > 1:
            raise UserError(
                "--workers runs CPU jobs side by side; under a launch or on a GPU the stages run one by one"
            )
        return {"workers": 1, "threads": threads}
    return {"workers": workers or max(1, available_cores() // threads), "threads": threads}


def start_parameters(model: str) -> int | None:
    """The parameter count of a start model, without loading it: a built-in tiny model is built (milliseconds), a
    checkpoint's weight headers are read; None when neither is found (the thread policy then keeps the default)."""
    if model in TINY_SPECS:
        return sum(p.numel() for p in build_tiny(attention=TINY_SPECS[model]).model.parameters())
    shapes = weight_shapes(model) if Path(model).is_dir() else None
    return None if not shapes else sum(math.prod(shape) for shape in shapes.values())


def _seeds(requested: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    """``--seeds 0,1,2`` (default: the preset's): every seed repeats the whole pipeline, warm start included."""
    if not requested:
        return default
    seeds = tuple(comma_list(requested, "--seeds", kind=int, what="seed"))
    if min(seeds) < 0 or max(seeds) >= INT64_LIMIT:
        raise UserError(f"--seeds: expected integers from 0 to 2**63 - 1, got {requested!r}")
    return seeds
