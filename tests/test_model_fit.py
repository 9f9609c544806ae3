"""A folder's config.json is checked against its weights before any weight is allocated (``core/models/fit.py``).

Every loader is guarded here by making ``from_pretrained`` of every network class fail the test: a mismatch must be
found from the weight files' headers and a build on the meta device, never by allocating the network the config
describes (for the 8B defaults, minutes of swapping or an allocation failure).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from stabledrl_bench.cli import main
from stabledrl_bench.core.models import build_tiny, load_diffusion_lm, save_diffusion_lm
from stabledrl_bench.core.models.convert import published_config, save_tiny_as
from stabledrl_bench.core.models.fit import fit_problems, network_shapes, weight_shapes
from stabledrl_bench.core.models.llada import LLaDANativeModel
from stabledrl_bench.core.models.qwen import QwenDiffusionModel
from stabledrl_bench.core.models.tiny import TinyDLM
from stabledrl_bench.errors import UserError

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
FAMILIES = ("tiny", "llada", "dream", "sdar")
# a size key of each family's config.json, the parameter whose shape it changes first in the network's order, and
# that shape in the weights (MLP width 64) and as the config says (MLP width 4096; the tiny model fuses gate and up)
SIZE = {
    "tiny": ("intermediate_size", "layers.0.mlp.gate_up.weight", "[128, 32] in the weights, [8192, 32]"),
    "llada": ("mlp_hidden_size", "model.transformer.blocks.0.ff_proj.weight", "[64, 32] in the weights, [4096, 32]"),
    "dream": ("intermediate_size", "model.layers.0.mlp.gate_proj.weight", "[64, 32] in the weights, [4096, 32]"),
    "sdar": ("intermediate_size", "model.layers.0.mlp.gate_proj.weight", "[64, 32] in the weights, [4096, 32]"),
}


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(**SMALL)


@pytest.fixture(autouse=True)
def never_allocated(monkeypatch):
    """A load that reaches ``from_pretrained`` of a network class fails the test (refusals come before it)."""

    def allocated(*args, **kwargs):
        raise AssertionError("from_pretrained was called: the network would have been allocated")

    for cls in (TinyDLM, LLaDANativeModel, QwenDiffusionModel):
        monkeypatch.setattr(cls, "from_pretrained", classmethod(allocated))


def folder_of(family: str, tiny, path: Path, **config_changes) -> Path:
    if family == "tiny":
        save_diffusion_lm(tiny, path)
        config = json.loads((path / "config.json").read_text()) | config_changes
        (path / "config.json").write_text(json.dumps(config))
        return path
    return save_tiny_as(tiny, family, path, **config_changes)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_config_that_does_not_describe_its_weights_is_one_line_naming_the_key(family, tiny, tmp_path) -> None:
    key, parameter, shapes = SIZE[family]
    folder = folder_of(family, tiny, tmp_path / family, **{key: 4096})
    with pytest.raises(UserError) as refused:
        load_diffusion_lm(folder)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{folder}: config.json does not describe its weights as ")
    assert f"{parameter} is {shapes} by the config (and " in message
    if family != "tiny":  # the published families' folders name their modeling files: the opt-in is named too
        assert message.endswith("which --trust-remote-code (lm-eval: trust_remote_code=True) would run instead")


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_the_8b_defaults_over_small_weights_are_refused_before_allocation(family, tiny, tmp_path) -> None:
    """The case the issue met: the sizes the config leaves out are the published 8B shape. Missing sizes are refused
    by name, and the sizes given explicitly are refused by the header comparison."""
    folder = folder_of(family, tiny, tmp_path / family)
    config = json.loads((folder / "config.json").read_text())
    sizes = {"llada": ("d_model", "n_layers")}.get(family, ("hidden_size", "num_hidden_layers"))
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in sizes}))
    with pytest.raises(UserError, match=rf"config.json lacks {', '.join(sizes)}; it ships its own Python code"):
        load_diffusion_lm(folder)
    for code in folder.glob("*.py"):
        code.unlink()
    config.pop("auto_map")
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in sizes}))
    with pytest.raises(UserError, match=rf": config.json lacks {', '.join(sizes)}$"):  # no code: no opt-in named
        load_diffusion_lm(folder)
    big = {"d_model": 4096, "n_layers": 32} if family == "llada" else {"hidden_size": 4096, "num_hidden_layers": 32}
    (folder / "config.json").write_text(json.dumps(config | big))
    with pytest.raises(
        UserError, match=r"does not describe its weights .* is \[\d+, 32\] in the weights, \[\d+, 4096\]"
    ):
        load_diffusion_lm(folder)


def test_a_folder_of_another_familys_keys_names_both_sides(tiny, tmp_path) -> None:
    """A LLaDA config over Dream's weights: the LLaDA names the weights lack and the Dream names the network lacks."""
    folder = save_tiny_as(tiny, "dream", tmp_path / "dream")
    (folder / "config.json").write_text(json.dumps(published_config(tiny.model.config, "llada")))
    with pytest.raises(UserError) as refused:
        load_diffusion_lm(folder)
    message = str(refused.value)
    assert "the weights lack model.transformer.wte.weight, model.transformer.blocks.0.attn_norm.weight" in message
    assert "the network has no lm_head.weight, model.embed_tokens.weight" in message and "(+24 more)" in message
    assert "ships its own Python code (configuration_llada.py, modeling_llada.py)" in message


def test_check_model_refuses_such_a_folder_in_one_line(tiny, tmp_path, capsys) -> None:
    folder = folder_of("llada", tiny, tmp_path / "llada", mlp_hidden_size=96)
    assert main(["check-model", "--model", str(folder)]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert line.startswith(f"error: {folder}: config.json does not describe its weights as llada-native (")
    assert "--trust-remote-code" in line and captured.out == ""


def test_sharded_and_pickled_weights_are_read_from_their_headers(tiny, tmp_path) -> None:
    """Shapes come from every shard an index names, and from a pickled state dict mapped to the meta device."""
    folder = save_tiny_as(tiny, "sdar", tmp_path / "sharded")
    weights = load_file(str(folder / "model.safetensors"))
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[:5], "model-00002-of-00002.safetensors": names[5:]}
    for shard, keys in shards.items():
        save_file({key: weights[key] for key in keys}, str(folder / shard), metadata={"format": "pt"})
    weight_map = {key: shard for shard, keys in shards.items() for key in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "model.safetensors").unlink()
    expected = {key: tuple(tensor.shape) for key, tensor in weights.items()}
    assert weight_shapes(folder) == expected
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    torch.save(weights, pickled / "pytorch_model.bin")
    assert weight_shapes(pickled) == expected and weight_shapes(tmp_path) is None
    del weight_map[names[0]]  # an index that leaves out nothing the shards hold still reads every shard's header
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert weight_shapes(folder) == expected


def test_fit_problems_allow_a_tied_head_to_be_absent() -> None:
    """A tied output head shares the embedding; save_pretrained leaves it out, so it may be absent (not different)."""
    from stabledrl_bench.core.models.qwen import DreamNativeConfig, DreamNativeModel

    fields = dict(num_key_value_heads=2, vocab_size=100, tie_word_embeddings=True)
    expected, aliases = network_shapes(DreamNativeModel, DreamNativeConfig(**SMALL, **fields))
    assert aliases == {"lm_head.weight"}
    found = {name: shape for name, shape in expected.items() if name != "lm_head.weight"}
    assert fit_problems(expected, aliases, found) == []
    assert fit_problems(expected, aliases, found | {"lm_head.weight": (99, 32)}) == [
        "lm_head.weight is [99, 32] in the weights, [100, 32] by the config"
    ]


def test_a_fitting_folder_still_loads(tiny, tmp_path, monkeypatch) -> None:
    monkeypatch.undo()  # from_pretrained allowed again
    folder = save_tiny_as(tiny, "llada", tmp_path / "llada")
    assert load_diffusion_lm(folder).model.config.d_model == 32
