"""The tiny model speaking the calling conventions of the published dLLM modeling files.

The harness cannot download LLaDA, Dream or SDAR in CI, yet its backends must be right for *their* code, not
for a stand-in written to agree with the harness. So the tiny model can emulate each family's convention, bugs
and all, as read from the published files (``TinyDLMConfig.convention``):

==============  ==============================================================================================
``llada-hub``   LLaDA-8B-Instruct's Hub ``modeling_llada.py``: SDPA is called with ``attn_mask=None``, so every
                mask and bias is ignored; ``LLaDAModelLM`` drops ``past_key_values``/``use_cache`` (no KV cache).
``llada``       ``Gen-Verse/dLLM-RL: models/llada/modeling_llada.py``: a 4-D ``attention_bias`` is honoured
                (a boolean one adds +1 where allowed), but a 2-D ``attention_mask`` with any 0 switches the model
                to a *causal* bias plus the padding; no KV cache either.
``dream``       ``Gen-Verse/dLLM-RL: models/dream/modeling_dream.py``: logits at position i predict token i+1;
                the mask is added to the scores after ``.to(dtype)`` (a boolean mask only adds +1/0); explicit
                ``position_ids``.
``sdar-chat``   ``JetAstra/SDAR: training/model/SDAR-8B-Chat/modeling_sdar.py``: eval mode turns the mask into
                ``mask.bool()`` (an additive 0/-inf bias becomes True exactly where attention is forbidden) and
                fails without one; train mode runs its own SFT loss (fails without labels) and its attention
                needs a flex ``BlockMask``; KV cache through ``past_key_values`` + ``store_kv``.
``sdar-trado``  ``Gen-Verse/dLLM-RL: models/sdar/modeling_sdar.py``: a float mask counts as "visible where > 0";
                train mode returns ``logits=None`` (fused cross-entropy); same cache API.
``broken``      A deliberately broken model for testing ``check-model``: the tiny model's own call, but a 2-D
                mask with padding turns it causal (dLLM-RL's LLaDA bug behind a backend that sends 2-D masks).
==============  ==============================================================================================

The network is always the tiny one (:meth:`TinyDLM.run`), so a backend is right exactly when it gets the same
logits from an emulating model as the native backend gets from the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from stabledrl_bench.core.models.hf_cache import KeyValues, cache_layers

if TYPE_CHECKING:
    from stabledrl_bench.core.models.tiny import TinyDLM

# Which backend family serves a checkpoint of each convention.
CONVENTION_FAMILY = {
    "native": "tiny",
    "llada-hub": "llada",
    "llada": "llada",
    "dream": "dream",
    "sdar-chat": "sdar",
    "sdar-trado": "sdar",
    "broken": "tiny",
}


@dataclass
class EmulatedOutput:
    """What the emulated families return: logits (None where the family returns none) and their cache.

    A plain dataclass: transformers 5's ``ModelOutput`` renames ``past_key_values`` to ``cache``, while the
    published files (run on 4.52-4.53) return it under the old name, which is what is emulated here."""

    logits: torch.Tensor | None = None
    past_key_values: Any = None  # LLaDA's ``LLaDAModelLM`` too: its inner model's ``attn_key_values``, renamed


def _min(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).min


def _llada_run(model: TinyDLM, input_ids, bias) -> EmulatedOutput:
    """LLaDA's ``LLaDAModelLM.forward`` hands its model ``past_key_values=None, use_cache=False`` whatever it was
    given, so the published file never reads nor returns a cache (``past_key_values`` comes back None)."""
    logits, _ = model.run(input_ids, bias, None, None)
    return EmulatedOutput(logits=logits, past_key_values=None)


def _llada_hub(
    model: TinyDLM, input_ids, attention_mask=None, attention_bias=None, past_key_values=None, use_cache=False
) -> EmulatedOutput:
    del attention_mask, attention_bias, past_key_values, use_cache  # SDPA(attn_mask=None): nothing is masked
    return _llada_run(model, input_ids, None)


def _llada(
    model: TinyDLM, input_ids, attention_mask=None, attention_bias=None, past_key_values=None, use_cache=False
) -> EmulatedOutput:
    del past_key_values, use_cache  # dropped by LLaDAModelLM.forward (see _llada_run)
    length = input_ids.shape[1]
    padding = None
    if attention_mask is not None and bool((attention_mask == 0).any()):
        keep = attention_mask.float().view(input_ids.shape[0], -1)[:, None, None, :]
        padding = (1.0 - keep) * _min(torch.float32)
    bias = None
    if attention_bias is not None or padding is not None:
        if attention_bias is None:  # LLaDAModel.forward: the default bias is causal
            bias = torch.triu(torch.full((length, length), _min(torch.float32)), diagonal=1)[None, None]
        elif attention_bias.dtype in (torch.bool, torch.int8):
            bias = attention_bias.float()
            bias = bias.masked_fill(bias == 0.0, _min(torch.float32))
        else:
            bias = attention_bias.float()
        if padding is not None:
            bias = (bias + padding).clamp(min=_min(torch.float32))
        bias = bias[:, :, :length, :length]
    return _llada_run(model, input_ids, bias)


def _cached(cache: Any) -> KeyValues | None:
    """The layers of a ``DynamicCache`` the family was handed, or None for no cache or an empty one."""
    return cache_layers(cache) if cache is not None and cache.get_seq_length() > 0 else None


def _dream(
    model: TinyDLM,
    input_ids,
    attention_mask=None,
    position_ids=None,
    is_causal=None,
    past_key_values=None,
    use_cache=None,
) -> EmulatedOutput:
    del use_cache
    mask = None
    if is_causal:
        length = input_ids.shape[1]
        mask = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()[None, None]
    elif isinstance(attention_mask, torch.Tensor):
        mask = attention_mask.to(model.dtype)  # added to the scores, whatever it was
    past = _cached(past_key_values)
    logits, kv = model.run(input_ids, mask, position_ids, past)
    if past_key_values is not None:  # Qwen2 attention: ``past_key_value.update`` appends every call's keys
        past_len = past[0][0].shape[2] if past else 0
        for i, (k, v) in enumerate(kv):
            past_key_values.update(k[:, :, past_len:], v[:, :, past_len:], i)
    return EmulatedOutput(logits=torch.cat((logits[:, 1:], logits[:, -1:]), dim=1), past_key_values=past_key_values)


def _sdar(
    model: TinyDLM,
    input_ids,
    variant: str,
    attention_mask=None,
    position_ids=None,
    past_key_values=None,
    use_cache=None,
    store_kv=None,
    labels=None,
) -> EmulatedOutput:
    del use_cache
    if model.training:
        if variant == "sdar-chat":  # its SFT branch: noise, packed positions and a loss, never plain logits
            raise AttributeError("'NoneType' object has no attribute 'dim'")
        return EmulatedOutput(logits=None)  # fused linear cross-entropy: logits are never materialised
    attention_training = any(layer.attn.training for layer in model.layers)
    if variant == "sdar-chat":
        if attention_training:
            raise TypeError("SDAR attention in train mode runs flex_attention and needs a BlockMask")
        if attention_mask is None:
            raise TypeError("all(): argument 'input' (position 1) must be Tensor, not NoneType")
        mask = attention_mask.bool()
        mask = None if bool(mask.all()) else mask  # all visible: flash-attn without a mask
    elif attention_mask is None:
        mask = None
    else:
        mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask > 0
        if mask.dim() == 2:
            mask = mask[:, None, None, :]
    past = _cached(past_key_values)
    logits, kv = model.run(input_ids, mask, position_ids, past)
    if past_key_values is not None and store_kv:
        past_len = past[0][0].shape[2] if past else 0
        for i, (k, v) in enumerate(kv):
            past_key_values.update(k[:, :, past_len:], v[:, :, past_len:], i)
    del labels
    return EmulatedOutput(logits=logits, past_key_values=past_key_values)


def _broken(
    model: TinyDLM, input_ids, attention_mask=None, position_ids=None, kv_cache=None, use_cache=False, **kept: Any
):
    """The ``broken`` convention (module docstring); ``kept`` passes on the tiny backend's ``logits_to_keep``."""
    mask = None
    if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all()):
        length = input_ids.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()
        mask = causal[None, None] & attention_mask.bool()[:, None, None, :]
    return model.native_forward(
        input_ids, attention_mask=mask, position_ids=position_ids, kv_cache=kv_cache, use_cache=use_cache, **kept
    )


def emulate(model: TinyDLM, input_ids: torch.Tensor, **kwargs: Any) -> EmulatedOutput:
    """Run ``model`` as the family named by its ``config.convention`` would run (keyword arguments as there)."""
    convention = model.config.convention
    if convention == "llada-hub":
        return _llada_hub(model, input_ids, **kwargs)
    if convention == "llada":
        return _llada(model, input_ids, **kwargs)
    if convention == "dream":
        return _dream(model, input_ids, **kwargs)
    if convention == "broken":
        return _broken(model, input_ids, **kwargs)
    return _sdar(model, input_ids, convention, **kwargs)
