"""transformers' ``DynamicCache`` as plain ``(key, value)`` pairs, on every supported transformers release.

The remote-code backends hand the published files a ``DynamicCache`` and keep what comes back as a list of
per-layer ``(key, value)`` tensors. 4.5x indexes a cache by layer and converts with ``from/to_legacy_cache``;
transformers 5 removed both and keeps per-layer objects in ``cache.layers``. ``update`` exists on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

KeyValues = list[tuple[torch.Tensor, torch.Tensor]]


def dynamic_cache(layers: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
    """A new ``DynamicCache`` holding ``layers`` (empty when None)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for index, (key, value) in enumerate(layers or ()):
        cache.update(key, value, index)
    return cache


def cache_layers(cache: Any) -> KeyValues:
    """The per-layer ``(key, value)`` tensors of a ``DynamicCache``."""
    if hasattr(cache, "layers"):  # transformers 5
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [cache[index] for index in range(len(cache))]
