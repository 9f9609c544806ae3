"""The baseline registry: every RL method is one small class registered by name.

A baseline declares four things and nothing else, so that two methods differ only where their papers differ:

* ``Config``     - a dataclass of its loss / estimator hyperparameters, defaults from its official code;
* ``estimator``  - the name of the likelihood estimator it needs (:mod:`stabledrl_bench.core.estimators`);
* ``advantages`` - how rewards of a group become advantages (and which groups are kept);
* ``loss``       - a pure function of tensors returning ``(loss, metrics)``.

Everything else (rollouts, optimizer, budget, logging) is shared by the trainer. External packages add a
baseline without editing this repository through the ``stabledrl_bench.baselines`` entry-point group::

    [project.entry-points."stabledrl_bench.baselines"]
    my_method = "my_package.my_module"   # importing the module runs its @register_baseline

"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module, metadata
from typing import Any, ClassVar

import torch

from stabledrl_bench.core.estimators import Estimate
from stabledrl_bench.errors import UserError

ENTRY_POINT_GROUP = "stabledrl_bench.baselines"

# Sequence-level ELBO estimators and the scale of their staircase counterpart for block-diffusion models:
# SPG/StableDRL use a per-masked-token average, ESPO a 1/t-weighted sum.
_STAIRCASE_SCALE = {"spg_block": "mean", "espo_elbo": "sum"}


@dataclass
class LossInputs:
    """Everything a loss may read. Tensors of the current policy carry gradients; old/ref are detached."""

    new: Estimate  # current policy pi_theta (with grad)
    old: Estimate | None  # rollout policy pi_theta_old (no grad); None when the baseline needs no ratio
    ref: Estimate | None  # frozen reference policy (no grad); None when beta == 0
    advantages: torch.Tensor  # [B]
    completion_mask: torch.Tensor  # [B, L] bool, True up to and including the first EOS
    group_ids: torch.Tensor  # [B] long, the prompt each completion belongs to


@dataclass
class BaselineConfig:
    """Hyperparameters shared by name across baselines (TRL's GRPOConfig names where one exists)."""

    beta: float = 0.0  # KL coefficient; 0 means no reference model is loaded
    coupled: bool = True  # old/new likelihoods from the same masks (False: independent masks)


class Baseline:
    """Base class of every RL method; subclasses set the class attributes and implement the two methods."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Config: ClassVar[type[BaselineConfig]] = BaselineConfig
    estimator: ClassVar[str] = ""
    needs_old: ClassVar[bool] = True  # computes a ratio against the rollout policy

    def __init__(self, config: BaselineConfig | None = None, **overrides: Any) -> None:
        config = config or self.Config()
        if overrides:
            known = {f.name for f in dataclasses.fields(config)}
            unknown = sorted(set(overrides) - known)
            if unknown:
                raise UserError(f"unknown option(s) for baseline {self.name!r}: {', '.join(unknown)}")
            config = dataclasses.replace(config, **overrides)
        self.config = config

    @property
    def needs_ref(self) -> bool:
        return self.config.beta > 0

    def estimator_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the estimator (e.g. MC samples, prompt-mask probability)."""
        return {}

    def estimator_for(self, attention: str) -> tuple[str, dict[str, Any]]:
        """Estimator name and kwargs for a model whose attention is ``full`` or ``block``.

        Block-diffusion models need leakage-free per-block likelihoods, so sequence-level ELBO estimators switch
        to the staircase-attention ELBO (StableDRL's extension to block diffusion) with the same number of MC
        samples; token-level estimators (d1 one-step, TraceRL replay) handle block attention themselves.
        """
        kwargs = self.estimator_kwargs()
        if attention == "block" and self.estimator in _STAIRCASE_SCALE:
            staircase = {
                "num_mc": kwargs.get("num_t", kwargs.get("num_mc", 1)),
                "scale": _STAIRCASE_SCALE[self.estimator],
            }
            if "eubo_beta" in kwargs:
                staircase["eubo_beta"] = kwargs["eubo_beta"]
            return "staircase_elbo", staircase
        return self.estimator, kwargs

    def advantages(
        self, rewards: torch.Tensor, group_ids: torch.Tensor, correct: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages [B], keep [B] bool)``; ``keep`` drops whole groups (TraceRL's accuracy filter)."""
        raise NotImplementedError

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError


_REGISTRY: dict[str, type[Baseline]] = {}
_loaded_builtins = False
_loaded_plugins = False


def register_baseline(name: str) -> Callable[[type[Baseline]], type[Baseline]]:
    """Class decorator: make a :class:`Baseline` subclass available under ``name``."""

    def decorate(cls: type[Baseline]) -> type[Baseline]:
        if not (isinstance(cls, type) and issubclass(cls, Baseline)):
            raise TypeError(f"@register_baseline({name!r}) needs a Baseline subclass, got {cls!r}")
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"baseline {name!r} is already registered by {_REGISTRY[name].__module__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def _load() -> None:
    """Import the built-in baselines and, once, every module named in the entry-point group."""
    global _loaded_builtins, _loaded_plugins
    if not _loaded_builtins:
        import_module("stabledrl_bench.baselines")
        _loaded_builtins = True
    if not _loaded_plugins:
        _loaded_plugins = True
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                entry.load()
            except Exception as exc:  # a broken plugin must not break the built-in baselines
                raise UserError(f"baseline plugin {entry.name!r} ({entry.value}) failed to load: {exc}") from exc


def available_baselines() -> dict[str, type[Baseline]]:
    """Registered baselines by name (built-ins first, then plugins), in registration order."""
    _load()
    return dict(_REGISTRY)


def get_baseline(name: str) -> type[Baseline]:
    baselines = available_baselines()
    if name not in baselines:
        raise UserError(f"unknown baseline {name!r}; registered: {', '.join(baselines)}")
    return baselines[name]


def build_baseline(name: str, **overrides: Any) -> Baseline:
    return get_baseline(name)(**overrides)
