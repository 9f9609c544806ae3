"""Small published-format checkpoints built from the tiny model: a LLaDA, Dream or SDAR folder holding the tiny
model's weights in that family's parameter layout and ``config.json``.

Why: the native implementations, the loader and every sampler, estimator and trainer path can then run on a real
family folder offline, in seconds, without an 8B download; this is how the tests exercise them, and a user's CI can
do the same. The tiny network is LLaDA's and Dream's architecture (pre-norm RMSNorm, rotate-half RoPE, SiLU-gated
MLP), so a converted LLaDA or Dream folder computes exactly the tiny model's logits (Dream's backend then shifts
them, as a real Dream checkpoint needs). SDAR adds a per-head RMSNorm of queries and keys, which the tiny model has
not: its folder gets those norms at 1, so its network is close to, not equal to, the tiny one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from stabledrl_bench.atomic import atomic_folder
from stabledrl_bench.core.models.interface import DiffusionLM
from stabledrl_bench.errors import UserError

# Where each tiny tensor goes in a published layout ({i}: the layer); the fused qkv and gate_up are split.
LLADA_LAYOUT = {
    "embed": "model.transformer.wte", "norm": "model.transformer.ln_f", "head": "model.transformer.ff_out",
    "layer": "model.transformer.blocks.{i}.", "q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "attn_out",
    "gate": "ff_proj", "up": "up_proj", "down": "ff_out", "attn_norm": "attn_norm", "mlp_norm": "ff_norm",
}  # fmt: skip
QWEN_LAYOUT = {
    "embed": "model.embed_tokens", "norm": "model.norm", "head": "lm_head", "layer": "model.layers.{i}.",
    "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "mlp_norm": "post_attention_layernorm",
}  # fmt: skip
FAMILIES = ("llada", "dream", "sdar")


def tiny_weights_as(tiny: torch.nn.Module, family: str) -> dict[str, torch.Tensor]:
    """The tiny model's weights under ``family``'s published parameter names (Dream: zero q/k/v biases; SDAR:
    per-head query/key norms at 1)."""
    layout = LLADA_LAYOUT if family == "llada" else QWEN_LAYOUT
    sd = tiny.state_dict()
    out = {f"{layout['embed']}.weight": sd["embed.weight"], f"{layout['norm']}.weight": sd["norm.weight"]}
    out[f"{layout['head']}.weight"] = sd["lm_head.weight"]
    heads = tiny.config.num_attention_heads
    for i in sorted({int(key.split(".")[1]) for key in sd if key.startswith("layers.")}):
        tiny_layer, layer = f"layers.{i}.", layout["layer"].format(i=i)
        parts = dict(zip("qkv", sd[tiny_layer + "attn.qkv.weight"].chunk(3), strict=True))
        parts |= dict(zip(("gate", "up"), sd[tiny_layer + "mlp.gate_up.weight"].chunk(2), strict=True))
        parts |= {"o": sd[tiny_layer + "attn.o_proj.weight"], "down": sd[tiny_layer + "mlp.down.weight"]}
        parts |= {"attn_norm": sd[tiny_layer + "attn_norm.weight"], "mlp_norm": sd[tiny_layer + "mlp_norm.weight"]}
        out |= {f"{layer}{layout[key]}.weight": weight for key, weight in parts.items()}
        if family == "dream":
            out |= {f"{layer}{layout[key]}.bias": torch.zeros(parts[key].shape[0]) for key in "qkv"}
        if family == "sdar":
            head_dim = parts["q"].shape[0] // heads
            out |= {f"{layer}self_attn.{norm}.weight": torch.ones(head_dim) for norm in ("q_norm", "k_norm")}
    return {name: tensor.detach().contiguous().clone() for name, tensor in out.items()}


def published_config(tiny_config: Any, family: str) -> dict[str, Any]:
    """The ``config.json`` of ``family`` for the tiny model's shape, as the published checkpoints write it (their
    ``auto_map`` included, naming modeling files the folder does not have: the native implementation needs none)."""
    c = tiny_config
    ids = {"mask_token_id": c.mask_token_id, "eos_token_id": c.eos_token_id, "pad_token_id": c.pad_token_id}
    if family == "llada":
        return {
            "model_type": "llada",
            "architectures": ["LLaDAModelLM"],
            "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM"},
            "activation_type": "silu", "block_type": "llama", "layer_norm_type": "rms", "rope": True, "alibi": False,
            "include_bias": False, "weight_tying": False,
            "d_model": c.hidden_size, "n_heads": c.num_attention_heads, "n_kv_heads": c.num_attention_heads,
            "n_layers": c.num_hidden_layers, "mlp_hidden_size": c.intermediate_size, "vocab_size": c.vocab_size,
            "embedding_size": c.vocab_size, "max_sequence_length": c.max_position_embeddings,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, **ids,
        }  # fmt: skip
    qwen = {
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_attention_heads, "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "hidden_act": "silu",
        "tie_word_embeddings": False, "vocab_size": c.vocab_size, **ids,
    }  # fmt: skip
    if family == "dream":
        auto = {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"}
        return {"model_type": "Dream", "architectures": ["DreamModel"], "auto_map": auto, **qwen}
    auto = {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"}
    head_dim = c.hidden_size // c.num_attention_heads
    return {
        "model_type": "sdar", "architectures": ["SDARForCausalLM"], "auto_map": auto, **qwen,
        "head_dim": head_dim, "attention_bias": False, "block_size": getattr(c, "block_size", 4),
    }  # fmt: skip


def save_tiny_as(tiny: DiffusionLM, family: str, folder: str | Path, **config_changes: Any) -> Path:
    """Write ``tiny`` (a loaded tiny model) as a ``family`` checkpoint folder: config, safetensors, tokenizer."""
    if family not in FAMILIES:
        raise UserError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    config = published_config(tiny.model.config, family) | config_changes
    with atomic_folder(folder) as out:
        (out / "config.json").write_text(json.dumps(config, indent=1))
        save_file(tiny_weights_as(tiny.model, family), str(out / "model.safetensors"), metadata={"format": "pt"})
        tiny.tokenizer.save_pretrained(out)
    return Path(folder)
