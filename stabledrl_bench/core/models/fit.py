"""Does a folder's ``config.json`` describe its weights? Answered before a single weight is allocated.

Why: a native network (and the tiny one) is built from its config, and every size the config leaves out comes from
the class defaults, which are the published 8B shapes. A folder whose config names a family but whose weights are
another network (another family's keys, a smaller model, a config missing its sizes) would otherwise start
allocating an 8B network before transformers reports the mismatch: minutes of swapping, or an allocation failure
deep in C++, and nothing the user can act on.

So the network is built on the ``meta`` device (shapes, no storage) and its parameter names and shapes are compared
with what the weight files declare: the safetensors headers (through ``model.safetensors.index.json`` for sharded
folders) or, for ``pytorch_model.bin`` files, the pickled tensors' metadata mapped to ``meta`` with
``weights_only=True``. No tensor data is read and nothing from the folder runs. The comparison is exact, as the
load itself is: every parameter present with its shape, nothing left over. A tied alias (an output head that shares
the embedding) may be absent, as ``save_pretrained`` leaves it out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLED, PICKLED_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
SHOWN = 3  # differing keys named in the one error line, per kind

Shapes = dict[str, tuple[int, ...]]


def weight_shapes(folder: str | Path) -> Shapes | None:
    """Every tensor name in a folder's weight files with its shape, read from the files' headers only (one pass
    over each file's header); None when the folder has no weight files this knows (the load then reports it)."""
    folder = Path(folder)
    for single, index, read in ((SAFETENSORS, SAFETENSORS_INDEX, _safetensors), (PICKLED, PICKLED_INDEX, _pickled)):
        if (folder / index).is_file():
            weight_map = json.loads((folder / index).read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        elif (folder / single).is_file():
            files = [single]
        else:
            continue
        shapes: Shapes = {}
        for name in files:
            shapes |= read(folder / name)
        return shapes
    return None


def _safetensors(path: Path) -> Shapes:
    with safe_open(str(path), framework="pt") as handle:
        return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118


def _pickled(path: Path) -> Shapes:
    state = torch.load(path, map_location="meta", weights_only=True, mmap=True)
    return {key: tuple(value.shape) for key, value in state.items() if isinstance(value, torch.Tensor)}


def network_shapes(model_class: type[torch.nn.Module], config: object) -> tuple[Shapes, set[str]]:
    """(the parameters and persistent buffers ``model_class(config)`` has, with shapes; the names among them that
    are tied aliases of another), from a build on the ``meta`` device: no memory is allocated."""
    with torch.device("meta"):
        model = model_class(config)
    state = model.state_dict()
    own = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    return {name: tuple(tensor.shape) for name, tensor in state.items()}, set(state) - own


def fit_problems(expected: Mapping[str, tuple[int, ...]], aliases: set[str], found: Mapping[str, tuple[int, ...]]):
    """What differs between the network a config builds (``expected``, ``aliases`` optional) and the weights
    (``found``), as short phrases naming the first differing keys of each kind; [] when they fit exactly."""
    missing = [name for name in expected if name not in found and name not in aliases]  # in the network's order
    extra = [name for name in found if name not in expected]
    shapes = [name for name in expected if name in found and expected[name] != found[name]]
    problems = []
    if missing:
        problems.append(f"the weights lack {_first(missing)}")
    if extra:
        problems.append(f"the network has no {_first(extra)}")
    if shapes:
        name = shapes[0]
        more = f" (and {len(shapes) - 1} more shapes)" if len(shapes) > 1 else ""
        problems.append(f"{name} is {list(found[name])} in the weights, {list(expected[name])} by the config{more}")
    return problems


def _first(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" (+{len(names) - SHOWN} more)" if len(names) > SHOWN else "")
