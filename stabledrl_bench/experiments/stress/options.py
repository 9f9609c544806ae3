"""The typed options of the stability experiments and the :data:`EXPERIMENTS` registry through which each
experiment module adds its command.

An experiment is one module that registers an :class:`Experiment`: its options, a frozen dataclass whose fields are
:func:`option` s (or option groups: :class:`ModelOptions`, :class:`NoiseOptions`, ...), and a run function that
receives them typed, with the :class:`StressOptions` every command shares. The ``stress`` command line is generated
from those dataclasses (:mod:`.cli`, the only place that sees ``argparse``), so adding an experiment edits nothing
else (a package can add one through the ``stabledrl_bench.stress_experiments`` entry-point group).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from stabledrl_bench.core.registry import Registry
from stabledrl_bench.errors import UserError, positive_int
from stabledrl_bench.experiments.stress.common import LRSWEEP, Definitions, ExplodingNoise

OptionsT = TypeVar("OptionsT")


def option(default: Any, help: str | None = None, *, parse: Callable[[str], Any] | None = None) -> Any:
    """A field of an options dataclass that is also the command-line option ``--<field-name>`` (``_`` -> ``-``).

    ``parse`` turns the option's text into the value; left out, an ``int`` or ``float`` default parses as its
    type, anything else stays text, and a ``bool`` default is a flag that sets True.
    """
    return dataclasses.field(default=default, metadata={"help": help, "parse": parse})


def option_fields(options: Any) -> Iterator[tuple[dataclasses.Field, Any]]:
    """Every option of an options object with its value, in declaration order, option groups flattened."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if dataclasses.is_dataclass(value):
            yield from option_fields(value)
        else:
            yield f, value


def recorded_settings(experiment: str, options: Any) -> dict[str, Any]:
    """The record's account of the command line: the experiment and each of its options as given (where files go,
    :class:`StressOptions`, is not a setting)."""
    return {"experiment": experiment, **{f.name: value for f, value in option_fields(options)}}


def check_positive(**values: float) -> None:
    bad = [f"--{k.replace('_', '-')}" for k, v in values.items() if not v > 0]
    if bad:
        raise UserError(f"{', '.join(bad)} must be positive")


# -------------------------------------------------------------------------------------------- option groups
@dataclass(frozen=True)
class StressOptions:
    """Where a command's files go: the options every ``stress`` command has, outside its record's settings."""

    results: str = option("results", "results folder (records go to <results>/stability)")
    runs: str = option("runs/stress", "cache of the warm start and the training runs")
    leaderboard: str = option("leaderboard.md", "leaderboard file to rebuild afterwards")
    no_leaderboard: bool = option(False, "do not rebuild the leaderboard")
    trust_remote_code: bool = option(
        False,
        "let a --warm-start folder run its own Python code (the published LLaDA/Dream/SDAR files); off by default",
    )


@dataclass(frozen=True)
class ModelOptions:
    """What the runs start from and how they roll out: the stress warm start, or a Table 1 preset's task."""

    warm_start: str | None = option(None, "use this model folder instead of the cached stress warm start")
    preset: str | None = option(
        None,
        "train on a Table 1 preset's --task (its data, rewards, budget, precision) instead of the stress task, "
        "e.g. --preset paper --task gsm8k --warm-start /path/to/LLaDA-8B-Instruct",
    )
    task: str | None = option(None, "the --preset's task")
    sft_steps: int | None = option(None, "SFT steps of the warm start (default: the preset's)", parse=positive_int)
    prompts: int = option(4, "prompts per step", parse=positive_int)
    # G = 8 for every method: 16 (the official) doubles every run's cost, which 2 CPU cores cannot afford for
    # 5 methods x 5 seeds x 500 steps; it is one option away for a machine that can.
    generations: int = option(8, "completions per prompt (group size G)", parse=positive_int)
    diffusion_steps: int = option(12, "rollout denoising steps over the 48 tokens", parse=positive_int)


@dataclass(frozen=True)
class NoiseOptions:
    """The ``exploding`` condition's noise (:class:`~.common.ExplodingNoise`)."""

    noise_df: float = option(ExplodingNoise.df, "Student-t df of the noise (1 = Cauchy)")
    noise_scale: float = option(ExplodingNoise.scale, "noise scale on the log-ratio")
    noise_prob: float = option(ExplodingNoise.probability, "probability per ratio")

    def noise(self) -> ExplodingNoise:
        return ExplodingNoise(df=self.noise_df, scale=self.noise_scale, probability=self.noise_prob)


@dataclass(frozen=True)
class DefinitionOptions:
    """The spike and collapse definitions a training experiment reports with (:class:`~.common.Definitions`)."""

    spike_k: float = option(Definitions.spike_k, "spike: norm > k x running median")
    spike_window: int = option(Definitions.spike_window, "running-median window (steps)", parse=positive_int)
    collapse_fraction: float = option(Definitions.collapse_fraction, "of the initial reward")
    reward_window: int = option(Definitions.reward_window, "running-mean window (rollouts)", parse=positive_int)
    confirm_steps: int = option(Definitions.confirm_steps, "steps a collapse must last", parse=positive_int)

    def definitions(self) -> Definitions:
        return Definitions(
            spike_k=self.spike_k,
            spike_window=self.spike_window,
            collapse_fraction=self.collapse_fraction,
            reward_window=self.reward_window,
            confirm_steps=self.confirm_steps,
        )


@dataclass(frozen=True)
class TrainingOptions:
    """Seeds, length, optimiser and parallelism of the training runs (the official recipe's knobs by default)."""

    seeds: str = option("0,1,2", "comma-separated run seeds")
    steps: int = option(120, "optimizer steps per run (budget.max_steps)", parse=positive_int)
    lr: float | None = option(None, "peak AdamW learning rate (default: the rate `stress lrsweep` chose)", parse=float)
    lr_scheduler: str = option("linear", "learning-rate schedule (official: linear decay to 0)")
    weight_decay: float = option(0.1, "AdamW weight decay (official: 0.1)")
    max_grad_norm: float = option(0.2, "gradient clipping (official 0.2; pre-clip logged)")
    jobs: int = option(2, "parallel worker processes (one thread each)", parse=positive_int)


@dataclass(frozen=True)
class SweepOptions:
    """Every option group of an experiment made of training runs."""

    model: ModelOptions = ModelOptions()
    noise: NoiseOptions = NoiseOptions()
    definitions: DefinitionOptions = DefinitionOptions()
    training: TrainingOptions = TrainingOptions()


# ------------------------------------------------------------------------------------------------ registry
@dataclass(frozen=True)
class Experiment(Generic[OptionsT]):
    """One ``stress`` command: its help line, its options and what it runs (returns the record it wrote).

    ``options`` is a frozen dataclass whose every field has a default (:func:`option` s and option groups);
    ``run(stress, options)`` gets where files go and an instance of it, parsed from the command line.
    ``report(record, link_base)`` renders its record in the leaderboard's Stability section and
    ``observations(record or None)`` gives its lines under "What we observed" (the built-in experiments' are in
    :mod:`.tables` and :mod:`.observations`); left out, the experiment gets a generic block (title, settings, plots)
    and no verdict. ``rederive(record)`` recomputes, from the record's raw data (per-step curves, per-trial
    measurements) or by re-running a cheap deterministic computation, the fields its verdicts are read from, by
    name; ``verify`` compares them with the stored ones (:mod:`.recheck`), so an edited summary cannot change a
    verdict unnoticed. Left out, ``verify`` says the record was not re-derived.
    """

    name: str
    help: str
    options: type[OptionsT]
    run: Callable[[StressOptions, OptionsT], Path]
    report: Callable[[Mapping[str, Any], str], str] | None = None
    observations: Callable[[Mapping[str, Any] | None], list[str]] | None = None
    rederive: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None


def _experiment(name: str, experiment: Experiment) -> Experiment:
    if not isinstance(experiment, Experiment) or experiment.name != name:
        raise TypeError(f"stress experiment {name!r} must be an Experiment named {name!r}, got {experiment!r}")
    if not dataclasses.is_dataclass(experiment.options):
        raise TypeError(f"stress experiment {name!r}: its options must be a dataclass, got {experiment.options!r}")
    return experiment


EXPERIMENTS: Registry[Experiment] = Registry(
    "stress experiment",
    "stress_experiments",
    builtins=(
        "stabledrl_bench.experiments.stress.lrsweep",  # first: `stress all` chooses the rate the others use
        "stabledrl_bench.experiments.stress.training",
        "stabledrl_bench.experiments.stress.drift",
        "stabledrl_bench.experiments.stress.hull",
        "stabledrl_bench.experiments.stress.longrun",
        "stabledrl_bench.experiments.stress.attribution",
    ),
    check=_experiment,
)


def in_order() -> list[str]:
    """Every registered experiment, the learning-rate sweep first (the training experiments use its rate)."""
    return [LRSWEEP, *(name for name in EXPERIMENTS.entries() if name != LRSWEEP)]
