"""Model families behind :class:`~stabledrl_bench.models.interface.DiffusionLM`, and the loader.

* ``tiny``  - the built-in model (:mod:`.tiny`), full or block attention, exact KV cache.
* ``llada`` - LLaDA-8B-Base/Instruct and LLaDA-1.5 through ``AutoModel.from_pretrained(...,
  trust_remote_code=True)``; mask id from the config (default 126336); full attention, no cache.
* ``dream`` - Dream-7B: like LLaDA but logits are shifted right by one (it predicts token i at i-1).
* ``sdar``  - SDAR / TraDo block-diffusion checkpoints (block-causal attention, block size from the config).

The ``dream`` and ``sdar`` slots implement the adapter points the algorithms need (logit shift, 4-D block
mask); they are exercised in the tests with the tiny model saved to disk and loaded through the same
``from_pretrained`` path, not with the real 7-8B weights (not available offline).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

from ..errors import UserError
from .interface import DiffusionLM
from .tiny import KVCache, TinyDLM, TinyDLMConfig
from .tokenizer import EOT, build_char_tokenizer

LLADA_MASK_ID = 126336
DREAM_MASK_ID = 151666
SDAR_MASK_ID = 151669


def _additive_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean [B, 1, Q, K] pattern -> additive float bias (0 where allowed, dtype-min elsewhere)."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill(~mask.bool(), torch.finfo(dtype).min)


class TinyBackend(DiffusionLM):
    family = "tiny"
    supports_kv_cache = True


class LLaDABackend(DiffusionLM):
    """LLaDA's remote code takes a 2-D ``attention_mask`` or an additive 4-D ``attention_bias``."""

    family = "llada"

    def _forward(self, input_ids, attention_mask, position_ids, kv_cache, use_cache):
        kwargs = {}
        if attention_mask is not None and attention_mask.dim() == 4:
            kwargs["attention_bias"] = _additive_bias(attention_mask, self.model.dtype)
        elif attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.long()
        return self.model(input_ids=input_ids, **kwargs).logits, None


class DreamBackend(LLaDABackend):
    family = "dream"
    shift_logits = True

    def _forward(self, input_ids, attention_mask, position_ids, kv_cache, use_cache):
        if attention_mask is not None and attention_mask.dim() == 2:
            key = attention_mask.bool()
            attention_mask = key[:, None, None, :] & key[:, None, :, None]
        bias = None if attention_mask is None else _additive_bias(attention_mask, self.model.dtype)
        out = self.model(input_ids=input_ids, attention_mask=bias, position_ids=position_ids)
        return out.logits, None


class SDARBackend(DiffusionLM):
    """Block-diffusion (SDAR/TraDo) checkpoints: 4-D additive block mask and explicit position ids."""

    family = "sdar"

    def _forward(self, input_ids, attention_mask, position_ids, kv_cache, use_cache):
        bias = None if attention_mask is None else _additive_bias(attention_mask, self.model.dtype)
        if bias is not None and bias.dim() == 2:
            raise ValueError("the sdar backend needs a 4-D block-causal mask")
        out = self.model(input_ids=input_ids, attention_mask=bias, position_ids=position_ids)
        return out.logits, None


BACKENDS: dict[str, type[DiffusionLM]] = {b.family: b for b in (TinyBackend, LLaDABackend, DreamBackend, SDARBackend)}
_MODEL_TYPE_TO_FAMILY = {
    TinyDLMConfig.model_type: "tiny",
    "llada": "llada",
    "llada_moe": "llada",
    "dream": "dream",
    "sdar": "sdar",
}


def build_tiny(
    *,
    attention: str = "full",
    block_size: int = 4,
    seed: int = 0,
    **config_overrides: object,
) -> TinyBackend:
    """A freshly initialised tiny model with the char tokenizer (deterministic given ``seed``).

    Initialisation draws from the global RNG inside a forked RNG state, so building a model never disturbs the
    caller's random streams.
    """
    tokenizer = build_char_tokenizer()
    config = TinyDLMConfig(
        vocab_size=len(tokenizer),
        mask_token_id=tokenizer.mask_token_id,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attention_kind=attention,
        block_size=block_size,
        **config_overrides,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyDLM(config)
    return _wrap_tiny(model, tokenizer, name=f"tiny-{attention}-seed{seed}")


def _wrap_tiny(model: TinyDLM, tokenizer, name: str) -> TinyBackend:
    cfg = model.config
    return TinyBackend(
        model,
        tokenizer,
        mask_id=cfg.mask_token_id,
        eos_id=cfg.eos_token_id,
        pad_id=cfg.pad_token_id,
        stop_ids=(tokenizer.convert_tokens_to_ids(EOT),),
        attention=cfg.attention_kind,
        block_size=cfg.block_size if cfg.attention_kind == "block" else None,
        name=name,
    )


TINY_SPECS = {"tiny": "full", "tiny-block": "block"}


def load_model_spec(spec: str, *, seed: int = 0, **tiny_overrides: object) -> DiffusionLM:
    """``tiny`` / ``tiny-block`` build a fresh tiny model (seeded); anything else is a checkpoint to load."""
    if spec in TINY_SPECS:
        return build_tiny(attention=TINY_SPECS[spec], seed=seed, **tiny_overrides)
    return load_diffusion_lm(spec)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def load_diffusion_lm(
    path_or_id: str | os.PathLike,
    *,
    family: str | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> DiffusionLM:
    """Load a checkpoint (local folder or Hub id) as a :class:`DiffusionLM`.

    The family is read from ``config.model_type`` unless given. A missing local path, or a Hub id while
    ``HF_HUB_OFFLINE=1``, raises :class:`UserError` with one clear line instead of a network traceback.
    """
    local = Path(path_or_id).expanduser()
    if local.exists():
        source = str(local)
    elif _is_hub_id(str(path_or_id)):
        source = str(path_or_id)
        if _offline():
            raise UserError(
                f"model {source!r} is not a local folder and HF_HUB_OFFLINE=1 forbids downloading it; "
                "pass --model /path/to/weights"
            )
    else:
        raise UserError(f"model path does not exist: {path_or_id}")
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read a model config from {source!r}: {str(exc).splitlines()[0]}") from exc
    family = family or _MODEL_TYPE_TO_FAMILY.get(getattr(config, "model_type", "").lower())
    if family not in BACKENDS:
        known = ", ".join(sorted(BACKENDS))
        raise UserError(f"unknown model family for {source!r} (model_type={config.model_type!r}); use one of {known}")
    kwargs = {"trust_remote_code": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=True)
    auto = AutoModelForCausalLM if family == "sdar" else AutoModel
    model = auto.from_pretrained(source, **kwargs)
    if device is not None:
        model = model.to(device)
    model.eval()
    if family == "tiny":
        return _wrap_tiny(model, tokenizer, name=source)
    default_mask = {"llada": LLADA_MASK_ID, "dream": DREAM_MASK_ID, "sdar": SDAR_MASK_ID}[family]
    mask_id = getattr(config, "mask_token_id", None) or default_mask
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    stop_ids = [i for i in _special_ids(tokenizer, ("<|eot_id|>", "<|endoftext|>", "<|im_end|>")) if i is not None]
    block = getattr(config, "block_size", None) or getattr(config, "block_length", None) or 4
    return BACKENDS[family](
        model,
        tokenizer,
        mask_id=mask_id,
        eos_id=eos_id,
        pad_id=pad_id,
        stop_ids=stop_ids,
        attention="block" if family == "sdar" else "full",
        block_size=block if family == "sdar" else None,
        name=source,
    )


def _is_hub_id(source: str) -> bool:
    """``owner/name`` with nothing else: what the Hub accepts and a relative path rarely looks like."""
    parts = source.split("/")
    return len(parts) == 2 and all(parts) and not source.startswith((".", "~"))


def _special_ids(tokenizer, tokens: tuple[str, ...]) -> list[int | None]:
    ids = []
    for token in tokens:
        with contextlib.suppress(Exception):
            idx = tokenizer.convert_tokens_to_ids(token)
            ids.append(idx if idx != tokenizer.unk_token_id else None)
    return ids


def save_diffusion_lm(dlm: DiffusionLM, path: str | os.PathLike) -> None:
    """Write weights, config and tokenizer so :func:`load_diffusion_lm` restores the same model."""
    model = dlm.model
    model = getattr(model, "module", model)  # unwrap DDP
    model.save_pretrained(path)
    dlm.tokenizer.save_pretrained(path)


__all__ = [
    "BACKENDS",
    "DiffusionLM",
    "KVCache",
    "build_tiny",
    "load_diffusion_lm",
    "load_model_spec",
    "save_diffusion_lm",
]
