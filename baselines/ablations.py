"""StableDRL ablations (docs/methods.md#stabledrl-ablations): each removes one of its two ingredients, nothing else
changes; the paper's claims about each are in docs/published-numbers.md#56-one-ingredient-alone.

* ``stabledrl_clip_only``: unconditional clip, fixed 1/G normalisation, w_i = clip(rho_i) / G. The update is
  no longer a convex combination: its scale follows the group-level ratio level (between (1 - eps) and
  (1 + eps) in paper mode, up to C in official mode).
* ``stabledrl_selfnorm_only``: self-normalisation without clipping, w_i = softmax_g(log rho)_i, i.e. StableDRL
  with C = inf. Still convex, but one outlier ratio can take the whole weight (a single-sample update).
* The clip-threshold sweep is plain ``stabledrl`` with ``clip_threshold`` in {1, 5, 100, 1000}; it needs no
  class of its own (``build_baseline("stabledrl", clip_threshold=100)``).

Both reuse ``stabledrl.log_importance_weights`` through the ``StableDRL`` class; their options are StableDRL's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from stabledrl_bench.core.baseline import BaselineConfig, register_baseline

from .stabledrl import StableDRL, StableDRLConfig


@register_baseline("stabledrl_clip_only")
class StableDRLClipOnly(StableDRL):
    """Ablation: clipped ratios divided by the group size G instead of their group sum."""

    description: ClassVar[str] = "StableDRL ablation: unconditional clip, fixed 1/G normalisation"
    self_normalize: ClassVar[bool] = False


@dataclass
class SelfNormOnlyConfig(StableDRLConfig):
    clip_threshold: float = math.inf  # no clip in official mode: w = softmax over the group of log rho


@register_baseline("stabledrl_selfnorm_only")
class StableDRLSelfNormOnly(StableDRL):
    """Ablation: group softmax of the unclipped log-ratios (StableDRL with clip_threshold = inf)."""

    description: ClassVar[str] = "StableDRL ablation: self-normalisation only, no clipping"
    Config: ClassVar[type[BaselineConfig]] = SelfNormOnlyConfig
