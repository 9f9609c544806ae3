"""Model families behind :class:`~stabledrl_bench.core.models.interface.DiffusionLM`, and the loader.

Each backend speaks one family's calling convention, as read from its published modeling code:

* ``tiny``  - the built-in model (:mod:`.tiny`): key padding or a boolean pattern, position ids, exact KV cache.
* ``llada`` - LLaDA-8B-Base/Instruct, LLaDA-1.5 (``AutoModel``, remote code): always a 4-D additive
  ``attention_bias``, never the 2-D ``attention_mask`` (dLLM-RL's copy turns causal when it gets one). The Hub
  file ignores every mask; the loader detects that (:func:`~stabledrl_bench.core.models.probes.masks_honoured`)
  and runs such a model pad-free. No position ids (LLaDA numbers positions itself). Mask id from the config,
  else 126336.
* ``llada-native``, ``dream-native`` - LLaDA and Dream on this package's own implementations (:mod:`.llada`,
  :mod:`.dream`): the default for every such folder whose structure they build; boolean patterns, explicit
  positions, keys cached after RoPE (prefix and dual cache).
* ``dream`` - Dream-7B: an additive 4-D bias in the model's dtype and explicit real-token position ids; its
  logits at position i predict token i+1, so they are shifted right by one.
* ``sdar``  - SDAR / TraDo block-diffusion checkpoints (``AutoModelForCausalLM``): a boolean 4-D block-causal
  mask and position ids; their train-mode forward computes an SFT loss instead of logits, so the backend runs
  the model's inference branches (same weights, same attention, gradients flow); SDAR's own KV cache
  (``past_key_values`` + ``store_kv``) for exact cached block decoding.

Backends are registered by family name in ``MODEL_FAMILIES``; each declares the ``config.model_type`` values it
serves, its default mask token id, the ``transformers`` auto class that loads it and its attention. A new family
is one registered subclass (or an entry point in the ``stabledrl_bench.model_families`` group).

The loader applies :func:`~stabledrl_bench.core.models.kernel_stubs.kernel_stubs` while importing remote code (CPU
machines lack flash-attn/triton) and turns load failures into one clear line.

**Remote code only when asked.** The published LLaDA, Dream and SDAR checkpoints ship their model as Python files
named by ``auto_map`` in their configs, and loading them imports those files: code from a folder someone sent.
The loader runs it only when the user opted in (``--trust-remote-code`` on the command line, which sets
``STABLEDRL_TRUST_REMOTE_CODE=1`` for the process and the processes it starts; ``trust_remote_code=True`` in the
API and the lm-eval model arguments); otherwise such a folder is refused with one line naming its files.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import transformers
from packaging.specifiers import SpecifierSet
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from stabledrl_bench.atomic import atomic_folder
from stabledrl_bench.core.models.conventions import CONVENTION_FAMILY
from stabledrl_bench.core.models.fit import fit_problems, network_shapes, weight_shapes
from stabledrl_bench.core.models.hf_cache import cache_layers, dynamic_cache
from stabledrl_bench.core.models.interface import DiffusionLM
from stabledrl_bench.core.models.kernel_stubs import kernel_stubs
from stabledrl_bench.core.models.llada import LLaDANativeConfig, LLaDANativeModel
from stabledrl_bench.core.models.probes import mask_effect
from stabledrl_bench.core.models.qwen import DreamNativeConfig, DreamNativeModel, SDARNativeConfig, SDARNativeModel
from stabledrl_bench.core.models.tiny import TinyDLM, TinyDLMConfig
from stabledrl_bench.core.models.tokenizer import EOT, build_char_tokenizer
from stabledrl_bench.core.registry import Registry, subclass_check
from stabledrl_bench.errors import UserError

LLADA_MASK_ID = 126336
DREAM_MASK_ID = 151666
SDAR_MASK_ID = 151669
# The published LLaDA/Dream/SDAR files run unmodified on these releases (both upstreams pin 4.52.4; SDAR's
# imports of ``LossKwargs`` and ``modeling_attn_mask_utils`` are gone from 4.54 on; transformers 5 breaks all
# three). The `remote-code` extra of pyproject.toml installs them.
REMOTE_CODE_TRANSFORMERS = ">=4.52,<4.54"
REMOTE_CODE_ENV = "STABLEDRL_TRUST_REMOTE_CODE"  # "1": the user opted in to running a checkpoint's own code


def additive_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean [B, 1, Q, K] pattern -> additive float bias (0 where allowed, dtype-min elsewhere)."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill(~mask.bool(), torch.finfo(dtype).min)


def as_pattern(mask: torch.Tensor, q_len: int) -> torch.Tensor:
    """A [B, K] key-padding mask as the [B, 1, Q, K] pattern it means (4-D masks pass through)."""
    if mask.dim() == 4:
        return mask.bool()
    return mask.bool()[:, None, None, :].expand(-1, 1, q_len, -1)


class Backend(DiffusionLM):
    """A registered model family: what the loader needs to know besides the calling convention (``_forward``)."""

    model_types: ClassVar[tuple[str, ...]] = ()  # the ``config.model_type`` values this family serves
    default_mask_id: ClassVar[int | None] = None  # when the config names no ``mask_token_id``
    auto_class: ClassVar[str] = "AutoModel"  # the transformers auto class that loads its checkpoints
    default_attention: ClassVar[str] = "full"  # "block": a block-diffusion family (reads the config's block size)


MODEL_FAMILIES: Registry[type[Backend]] = Registry(
    "model family", "model_families", check=subclass_check(Backend, attribute="family")
)


@MODEL_FAMILIES.register("tiny")
class TinyBackend(Backend):
    """The built-in tiny model: key padding or a boolean pattern, position ids, exact KV cache."""

    model_types = (TinyDLMConfig.model_type,)
    block_classes = ("Block",)
    supports_kv_cache = True
    full_cache_modes = ("prefix", "dual")
    keeps_logits = True


@MODEL_FAMILIES.register("llada")
class LLaDABackend(Backend):
    """LLaDA's remote code: the mask goes in as a 4-D additive ``attention_bias`` (LLaDA casts it itself).

    No KV cache: the published ``LLaDAModelLM.forward`` (the Hub's and dLLM-RL's ``modeling_llada.py``) calls its
    model with ``past_key_values=None, use_cache=False`` whatever it is given, so neither the prefix nor the dual
    cache can run on it (the native LLaDA has both). The cached fast protocols are refused in one line here.
    """

    model_types = ("llada", "llada_moe")
    default_mask_id = LLADA_MASK_ID
    # the blocks LLaDA instantiates (its ``_no_split_modules`` names ``LLaDABlock``, their base class, which the Hub
    # file never instantiates: FSDP's wrap policy matches exact classes and would find nothing)
    block_classes = ("LLaDALlamaBlock", "LLaDASequentialBlock")

    def _forward(self, input_ids, attention_mask, position_ids, cache, store):
        del position_ids, cache, store  # LLaDA numbers positions itself; no cache (see the class docstring)
        kwargs: dict[str, Any] = {}
        if attention_mask is not None:
            kwargs["attention_bias"] = additive_bias(as_pattern(attention_mask, input_ids.shape[1]), torch.float32)
        return self.model(input_ids=input_ids, **kwargs).logits, None


class NativeBackend(Backend):
    """A published family run by this package's own implementation (:mod:`.llada`, :mod:`.qwen`): the published
    weights, no code from the folder. A boolean [B, 1, Q, K] pattern and explicit position ids go straight in, and
    keys are cached after RoPE, so any key set can be cached (prefix and dual cache). The loader picks it for every
    checkpoint of the family whose structure it builds (:func:`load_diffusion_lm`, ``implementation``)."""

    model_types = ()  # chosen by the loader from the folder's model_type (NATIVE), never by model_type alone
    full_cache_modes = ("prefix", "dual")
    keeps_logits = True

    def _forward(self, input_ids, attention_mask, position_ids, cache, store, keep=None):
        pattern = None if attention_mask is None else as_pattern(attention_mask, input_ids.shape[1])
        out = self.model(
            input_ids=input_ids,
            attention_mask=pattern,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=store,
            logits_to_keep=keep,
        )
        return out.logits, out.past_key_values


@MODEL_FAMILIES.register("llada-native")
class LLaDANativeBackend(NativeBackend):
    """LLaDA on :mod:`.llada` (prefix and dual cache; the published file takes no cache at all)."""

    default_mask_id = LLADA_MASK_ID
    block_classes = ("LLaDALlamaBlock",)


@MODEL_FAMILIES.register("dream-native")
class DreamNativeBackend(NativeBackend):
    """Dream on :mod:`.qwen`: its logits at position i predict token i + 1, shifted right like the remote file's."""

    default_mask_id = DREAM_MASK_ID
    block_classes = ("QwenDecoderLayer",)
    shift_logits = True


@MODEL_FAMILIES.register("sdar-native")
class SDARNativeBackend(NativeBackend):
    """SDAR / TraDo on :mod:`.qwen`: block diffusion with the exact KV cache of committed blocks."""

    default_mask_id = SDAR_MASK_ID
    block_classes = ("QwenDecoderLayer",)
    default_attention = "block"
    supports_kv_cache = True


LOADING_PROBLEMS = ("missing_keys", "unexpected_keys", "mismatched_keys")  # transformers' loading info


@dataclass(frozen=True)
class NativeFamily:
    """A published ``model_type`` this package implements: its config and model classes, its backend, and the
    ``config.json`` keys it requires (the sizes that the classes would otherwise take from the published 8B shape)."""

    config: type
    model: type
    backend: str
    required: tuple[str, ...]


QWEN_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
NATIVE = {
    "llada": NativeFamily(
        LLaDANativeConfig, LLaDANativeModel, "llada-native", ("d_model", "n_heads", "n_layers", "vocab_size")
    ),
    "dream": NativeFamily(DreamNativeConfig, DreamNativeModel, "dream-native", (*QWEN_SIZES, "vocab_size")),
    "sdar": NativeFamily(SDARNativeConfig, SDARNativeModel, "sdar-native", (*QWEN_SIZES, "vocab_size")),
}

# Tokenizers published as Python files that are transformers classes under another name: they load with
# transformers' class, so the folder's file never runs (Dream's tokenization_dream.py is Qwen2Tokenizer renamed).
# A config naming a class transformers itself defines (SDAR-8B-Chat: ``Qwen2Tokenizer``, with an ``auto_map`` to a
# ``tokenization_qwen2.py`` the Hub folder does not even hold) loads with that class too (:func:`_native_tokenizer`).
NATIVE_TOKENIZERS = {"DreamTokenizer": "Qwen2Tokenizer"}


@MODEL_FAMILIES.register("dream")
class DreamBackend(Backend):
    """Dream's remote code adds ``attention_mask`` to the scores: send a 0/-inf bias in the model's dtype."""

    model_types = ("dream",)
    default_mask_id = DREAM_MASK_ID
    block_classes = ("DreamDecoderLayer",)
    shift_logits = True
    # Qwen2-style: post-RoPE keys in an HF ``DynamicCache`` and explicit position ids, so any key set can be cached.
    full_cache_modes = ("prefix", "dual")

    def _forward(self, input_ids, attention_mask, position_ids, cache, store):
        bias = None
        if attention_mask is not None:
            bias = additive_bias(as_pattern(attention_mask, input_ids.shape[1]), self.dtype)
        kwargs: dict[str, Any] = {}
        if cache is not None or store:
            # Dream appends every call's keys/values to the cache it is given: give it a throwaway one, kept as
            # plain (key, value) tuples only when asked to store
            kwargs.update(past_key_values=dynamic_cache(cache), use_cache=True)
        out = self.model(input_ids=input_ids, attention_mask=bias, position_ids=position_ids, **kwargs)
        return out.logits, (cache_layers(kwargs["past_key_values"]) if store else None)


@MODEL_FAMILIES.register("sdar")
class SDARBackend(Backend):
    """SDAR/TraDo: boolean block-causal mask, position ids, SDAR's KV cache, logits also in train mode."""

    model_types = ("sdar",)
    default_mask_id = SDAR_MASK_ID
    block_classes = ("SDARDecoderLayer",)
    auto_class = "AutoModelForCausalLM"
    default_attention = "block"
    supports_kv_cache = True

    def __init__(self, model, tokenizer, **kwargs) -> None:
        super().__init__(model, tokenizer, **kwargs)
        # In train mode SDAR's top-level forward runs its SFT loss (no logits) and SDAR-8B-Chat's attention
        # switches to flex attention; both are inference-branch-only here. Decoder layers keep their mode, so
        # gradient checkpointing still works.
        self._inference_branches = [model] + [m for m in model.modules() if type(m).__name__.endswith("Attention")]

    def _forward(self, input_ids, attention_mask, position_ids, cache, store):
        if attention_mask is None or attention_mask.dim() != 4:
            raise ValueError("the sdar backend needs a 4-D block-causal mask")
        for module in self._inference_branches:
            module.training = False
        kwargs: dict[str, Any] = {"attention_mask": attention_mask.bool(), "position_ids": position_ids}
        if cache is not None or store:
            cache = dynamic_cache() if cache is None else cache
            kwargs.update(past_key_values=cache, use_cache=True, store_kv=store)
        out = self.model(input_ids=input_ids, **kwargs)
        if out.logits is None:
            raise RuntimeError(f"{type(self.model).__name__} returned no logits; is it an SDAR-style model?")
        return out.logits, cache

    def select_cache_rows(self, cache, keep):
        cache.batch_select_indices(keep.nonzero().squeeze(1))
        return cache


def family_of(model_type: str) -> str | None:
    """The registered family serving checkpoints whose ``config.model_type`` is ``model_type`` (None if none)."""
    for name, backend in MODEL_FAMILIES.items():
        if model_type in backend.model_types:
            return name
    return None


def build_tiny(
    *,
    attention: str = "full",
    block_size: int = 4,
    seed: int = 0,
    **config_overrides: object,
) -> TinyBackend:
    """A freshly initialised tiny model with the char tokenizer (deterministic given ``seed``).

    Initialisation draws from the global RNG inside a forked RNG state, so building a model never disturbs the
    caller's random streams. ``config_overrides`` may enlarge ``vocab_size`` beyond the tokenizer's (benchmarks
    that need a real model's output head: the extra ids never come out of the tokenizer).
    """
    tokenizer = build_char_tokenizer()
    config = TinyDLMConfig(
        **{
            "vocab_size": len(tokenizer),
            "mask_token_id": tokenizer.mask_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "attention_kind": attention,
            "block_size": block_size,
            **config_overrides,
        }
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyDLM(config)
    return _wrap_tiny(model, tokenizer, name=f"tiny-{attention}-seed{seed}")


def _wrap_tiny(model: TinyDLM, tokenizer, name: str, probe: bool = True) -> DiffusionLM:
    """The backend of a tiny model: its own, or the family whose convention it emulates."""
    cfg = model.config
    family = CONVENTION_FAMILY[cfg.convention]
    dlm = MODEL_FAMILIES.get(family)(
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
    dlm.block_classes = tuple(model._no_split_modules)  # an emulation speaks a family's calls, not its class names
    return detect_pad_free(dlm) if probe else dlm


def detect_pad_free(dlm: DiffusionLM) -> DiffusionLM:
    """Full-attention models that ignore attention masks run pad-free (every other model is padded and masked).

    A probe of the weights: call it only once they are loaded on this process (see ``rank0_weights``)."""
    if dlm.attention == "full" and dlm.family != "tiny":
        to_removed, to_unmasked = mask_effect(dlm)
        dlm.pad_free = not to_removed < to_unmasked
    return dlm


TINY_SPECS = {"tiny": "full", "tiny-block": "block"}


def load_model_spec(
    spec: str,
    *,
    seed: int = 0,
    family: str | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    rank0_weights: bool = False,
    trust_remote_code: bool | None = None,
) -> DiffusionLM:
    """``tiny`` / ``tiny-block`` build a fresh tiny model (seeded); anything else is a checkpoint to load."""
    if spec in TINY_SPECS:
        dlm = build_tiny(attention=TINY_SPECS[spec], seed=seed)
        if dtype is not None or device is not None:
            dlm.model.to(device=device, dtype=dtype)
        return dlm
    return load_diffusion_lm(
        spec,
        family=family,
        dtype=dtype,
        device=device,
        rank0_weights=rank0_weights,
        trust_remote_code=trust_remote_code,
    )


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


IMPLEMENTATIONS = ("auto", "native", "remote")
# "remote": run LLaDA checkpoints on their own code (with the remote-code opt-in) in this process and the ones it
# starts, e.g. to compare the published file with the native implementation; "auto" (default) prefers native.
IMPLEMENTATION_ENV = "STABLEDRL_MODEL_IMPLEMENTATION"


def load_diffusion_lm(
    path_or_id: str | os.PathLike,
    *,
    family: str | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    rank0_weights: bool = False,
    trust_remote_code: bool | None = None,
    implementation: str = "auto",
) -> DiffusionLM:
    """Load a checkpoint (local folder or Hub id) as a :class:`DiffusionLM`.

    The family is read from ``config.model_type`` (a tiny checkpoint: from its ``convention``) unless given.
    A missing path, a Hub id while ``HF_HUB_OFFLINE=1``, or a checkpoint that fails to load raises
    :class:`UserError` with one clear line. Full-attention models are probed once for whether they honour
    attention masks; those that do not are run pad-free (see :class:`DiffusionLM`).

    Every process loads the whole weights, also under an FSDP launch with RAM-efficient loading (where
    transformers would give the processes other than each node's first uninitialised memory): evaluation and
    every probe need real weights. ``rank0_weights=True`` lets transformers do that for a model FSDP will shard
    (it broadcasts rank 0's weights when it does); the padding probe is then left to the caller
    (:func:`detect_pad_free`), to be run once the weights are synced.

    ``trust_remote_code`` (None: the process's opt-in, :data:`REMOTE_CODE_ENV`) allows importing the Python files a
    checkpoint names; without it such a checkpoint is refused before anything is imported (module docstring).

    ``implementation``: a LLaDA or Dream checkpoint runs on this package's own implementation (:data:`NATIVE`:
    :mod:`.llada`, :mod:`.dream`) when its structure is one that implementation builds (``auto``, the default, and
    ``native``, which refuses any other); ``remote`` (or an unsupported variant under ``auto``) runs the
    checkpoint's own code, which needs ``trust_remote_code``.
    """
    if implementation == "auto":
        implementation = os.environ.get(IMPLEMENTATION_ENV, "auto")
    if implementation not in IMPLEMENTATIONS:
        raise UserError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, got {implementation!r}")
    source = _resolve_source(path_or_id)
    trust = remote_code_trusted(trust_remote_code)
    native = _native_config(source, family, implementation, trust=trust)
    if native is not None:
        strict = implementation == "native"
        loaded = _load_native(
            source, *native, strict=strict, trust=trust, dtype=dtype, device=device, rank0_weights=rank0_weights
        )
        if loaded is not None:
            return loaded
    files = [] if trust else _code_files(source)
    if files:
        raise UserError(
            f"model {source!r} ships its own Python code ({', '.join(files)}), which loading it would run; pass "
            "--trust-remote-code (lm-eval: trust_remote_code=True) if you trust that folder"
        )
    with _loading(source, "config", remote_code=trust):
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust)
    model_type = str(getattr(config, "model_type", "")).lower()
    tiny = model_type == TinyDLMConfig.model_type
    family = family or (CONVENTION_FAMILY[config.convention] if tiny else family_of(model_type))
    if family not in MODEL_FAMILIES:
        known = ", ".join(MODEL_FAMILIES)
        raise UserError(f"unknown model family for {source!r} (model_type={config.model_type!r}); use one of {known}")
    backend = MODEL_FAMILIES.get(family)
    auto = AutoModel if tiny else getattr(transformers, backend.auto_class)
    if tiny:
        _native_fits(source, TinyDLM, config, what="the tiny model", trust=trust)  # False: its own code runs
    tokenizer = _load_tokenizer(source, trust)
    with _loading(source, "model", remote_code=trust), _ram_efficient_loading(rank0_weights):
        model = auto.from_pretrained(source, trust_remote_code=trust, **_dtype_kwargs(dtype))
    if device is not None:
        model = model.to(device)
    model.eval()
    mask_id = getattr(config, "mask_token_id", None) or backend.default_mask_id
    _check_token_ids(model, tokenizer, source, mask_id)
    if tiny and family == CONVENTION_FAMILY[config.convention]:
        return _wrap_tiny(model, tokenizer, name=source, probe=not rank0_weights)
    block = getattr(config, "block_size", None) or getattr(config, "block_length", None) or 4
    return _wrap(backend, model, tokenizer, config, mask_id, block, name=source, probe=not rank0_weights)


def _wrap(
    backend: type[Backend], model, tokenizer, config, mask_id: int, block: int, *, name: str, probe: bool
) -> DiffusionLM:
    """``model`` as a ``backend``: special token ids from the tokenizer (else the config), the family's attention
    (``block``: the block size of a block-diffusion family), padding probed unless the caller does it later."""
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else getattr(config, "eos_token_id", None)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    stop_ids = [i for i in _special_ids(tokenizer, ("<|eot_id|>", "<|endoftext|>", "<|im_end|>", EOT)) if i is not None]
    dlm = backend(
        model,
        tokenizer,
        mask_id=mask_id,
        eos_id=eos_id,
        pad_id=pad_id,
        stop_ids=stop_ids,
        attention=backend.default_attention,
        block_size=block if backend.default_attention == "block" else None,
        name=name,
    )
    return detect_pad_free(dlm) if probe else dlm


def _native_config(
    source: str, family: str | None, implementation: str, *, trust: bool
) -> tuple[NativeFamily, Any] | None:
    """The native family and configuration of a local folder, or None when the checkpoint's own code runs it."""
    if implementation == "remote":
        return None
    path = Path(source) / "config.json"
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return None  # unreadable: the regular load reports it
    model_type = str(data.get("model_type", "")).lower() if isinstance(data, dict) else ""
    native = NATIVE.get(model_type)
    if native is None or family not in (None, model_type, native.backend):
        if implementation == "native":
            raise UserError(f"{source}: no native implementation of model_type {model_type!r} ({', '.join(NATIVE)})")
        return None
    strict = implementation == "native"
    missing = [key for key in native.required if key not in data]
    if missing:
        return _not_native(source, f"config.json lacks {', '.join(missing)}", strict=strict, trust=trust)
    settings = {key: value for key, value in data.items() if key not in ("auto_map", "architectures", "model_type")}
    try:
        return native, native.config(**settings)
    except UserError as exc:  # a variant the native code does not build
        return _not_native(source, str(exc), strict=strict, trust=trust)


def _not_native(source: str, problem: str, *, strict: bool, trust: bool) -> None:
    """A folder of a native family that the native code cannot run (``problem`` says why): with its own code and
    the opt-in (``trust``), that code runs it (None); otherwise one line naming the problem and, where the folder
    ships code, the opt-in. ``strict`` (``implementation="native"``) refuses either way."""
    files = [] if strict else _code_files(source)
    if files and trust:
        return None
    opt_in = (
        f"; it ships its own Python code ({', '.join(files)}), which --trust-remote-code (lm-eval: "
        "trust_remote_code=True) would run instead"
        if files
        else ""
    )
    raise UserError(f"{source}: {problem}{opt_in}")


def _native_tokenizer(source: str) -> Any:
    """transformers' own class for the tokenizer a folder's config names (None: not one transformers has).

    The class is read from ``tokenizer_class`` as data: a copy under another name (:data:`NATIVE_TOKENIZERS`) or
    a class transformers defines (its ``...Fast`` variant first, as ``AutoTokenizer`` prefers on transformers 4).
    Loading through that class never consults the config's ``auto_map``, so no file of the folder is imported.
    """
    path = Path(source) / "tokenizer_config.json"
    try:
        name = json.loads(path.read_text()).get("tokenizer_class") if path.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None  # unreadable: the load itself reports it
    if not isinstance(name, str) or not name:
        return None
    name = NATIVE_TOKENIZERS.get(name, name)
    for candidate in (name, name + "Fast") if name.endswith("Fast") else (name + "Fast", name):
        found = getattr(transformers, candidate, None)
        if isinstance(found, type) and issubclass(found, PreTrainedTokenizerBase):
            return found
    return None


def _code_files(source: str) -> list[str]:
    """The Python files loading a folder (model and tokenizer) would import without the native implementations."""
    return remote_code_files(source, configs=("config.json",)) + _tokenizer_code(source)


def _tokenizer_code(source: str) -> list[str]:
    """The Python files loading a folder's tokenizer would import: none when transformers has its class."""
    return [] if _native_tokenizer(source) else remote_code_files(source, configs=("tokenizer_config.json",))


def _load_tokenizer(source: str, trust: bool) -> Any:
    """The folder's tokenizer: through transformers' own class when it has one (:func:`_native_tokenizer`), else
    through ``AutoTokenizer`` (which imports the folder's code only when ``trust``)."""
    own = _native_tokenizer(source)
    with _loading(source, "tokenizer", remote_code=own is None and trust):
        return own.from_pretrained(source) if own else AutoTokenizer.from_pretrained(source, trust_remote_code=trust)


def _load_native(
    source: str,
    native: NativeFamily,
    config,
    *,
    strict: bool,
    trust: bool,
    dtype: torch.dtype | None,
    device,
    rank0_weights: bool,
) -> DiffusionLM | None:
    """A published checkpoint on this package's implementation of its family: no code from the folder runs.

    The weights must fit the implementation exactly (every parameter present, none left over, same shapes), which is
    checked on the meta device before anything is allocated (:func:`_require_fit`): a folder that only claims the
    family's model_type is run by its own code when it ships some and the user opted in (None), else refused.
    """
    if not _native_fits(source, native.model, config, what=native.backend, strict=strict, trust=trust):
        return None
    files = _tokenizer_code(source)
    if files and not trust:
        raise UserError(
            f"model {source!r}: its tokenizer ships its own Python code ({', '.join(files)}); pass "
            "--trust-remote-code if you trust that folder"
        )
    tokenizer = _load_tokenizer(source, bool(files))
    with _loading(source, "model"), _ram_efficient_loading(rank0_weights):
        model, info = native.model.from_pretrained(
            source, config=config, output_loading_info=True, **_dtype_kwargs(dtype)
        )
    unfit = [f"{kind}: {', '.join(map(str, list(info[kind])[:3]))}" for kind in LOADING_PROBLEMS if info.get(kind)]
    if unfit:  # the headers said they fit: transformers read the files otherwise (never half-random weights)
        raise UserError(f"{source}: the weights do not fit the native {native.backend} network ({'; '.join(unfit)})")
    if device is not None:
        model = model.to(device)
    model.eval()
    backend = MODEL_FAMILIES.get(native.backend)
    mask_id = getattr(config, "mask_token_id", None) or backend.default_mask_id
    _check_token_ids(model, tokenizer, source, mask_id)
    block = getattr(config, "block_size", 4)
    return _wrap(backend, model, tokenizer, config, mask_id, block, name=source, probe=not rank0_weights)


def _native_fits(source: str, model_class: type, config, *, what: str, trust: bool, strict: bool = False) -> bool:
    """True when the weights in ``source`` are exactly the network ``model_class(config)`` (names and shapes from
    the files' headers against a build on the meta device: nothing allocated, no tensor read, :mod:`.fit`); False
    when they are not and the folder's own code may run it instead (:func:`_not_native`, which otherwise refuses in
    one line naming the first differing keys). A folder without weight files this reads is left to the load."""
    with _loading(source, "weights"):
        found = weight_shapes(source)
    problems = [] if found is None else fit_problems(*network_shapes(model_class, config), found)
    if problems:
        _not_native(
            source,
            f"config.json does not describe its weights as {what} ({'; '.join(problems)})",
            strict=strict,
            trust=trust,
        )
    return not problems


def _check_token_ids(model: torch.nn.Module, tokenizer, source: str, mask_id: int | None) -> None:
    """Refuse a tokenizer that can produce ids the model has no embedding row for (a tokenizer from another
    model, or added tokens without resized embeddings): on CPU such an id is an index error deep in a forward, on
    a GPU a device-side assert or, worse, silently wrong rows read."""
    try:
        rows = model.get_input_embeddings().weight.shape[0]
    except (AttributeError, NotImplementedError):
        return  # a model without the standard accessor: nothing to compare against
    vocab = tokenizer.get_vocab()
    top = max(vocab.values(), default=-1)
    if top >= rows:
        token = max(vocab, key=vocab.get)
        raise UserError(
            f"{source}: the tokenizer has ids up to {top} ({token!r}) but the model embeds only {rows} tokens; "
            "the tokenizer and the weights do not belong together"
        )
    if mask_id is not None and not 0 <= mask_id < rows:
        raise UserError(f"{source}: mask token id {mask_id} is outside the model's {rows} embedding rows")


def remote_code_trusted(explicit: bool | None = None) -> bool:
    """Whether a checkpoint's own code may run: ``explicit`` if given, else the process's opt-in."""
    if explicit is not None:
        return bool(explicit)
    return os.environ.get(REMOTE_CODE_ENV, "0") == "1"


def remote_code_files(source: str, configs: tuple[str, ...] = ("config.json", "tokenizer_config.json")) -> list[str]:
    """The Python files a local checkpoint folder asks transformers to import (``auto_map`` of its model and
    tokenizer configs), read as data; [] for a Hub id (transformers itself then refuses without the opt-in)."""
    modules: set[str] = set()
    for name in configs:
        path = Path(source) / name
        try:
            auto_map = json.loads(path.read_text()).get("auto_map") if path.is_file() else None
        except (OSError, ValueError, AttributeError):
            continue  # unreadable: the load itself reports it
        refs = auto_map.values() if isinstance(auto_map, dict) else []
        for ref in refs:
            for item in ref if isinstance(ref, list) else [ref]:
                if isinstance(item, str) and item:
                    modules.add(item.split("--")[-1].rsplit(".", 1)[0] + ".py")
    return sorted(modules)


@contextlib.contextmanager
def _ram_efficient_loading(enabled: bool):
    """transformers loads real weights on local rank 0 only when ``FSDP_CPU_RAM_EFFICIENT_LOADING`` is true under
    an FSDP launch; this sets the variable to ``enabled`` for one load (restored afterwards)."""
    name = "FSDP_CPU_RAM_EFFICIENT_LOADING"
    before = os.environ.get(name)
    os.environ[name] = "true" if enabled else "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _resolve_source(path_or_id: str | os.PathLike) -> str:
    local = Path(path_or_id).expanduser()
    if local.exists():
        return str(local)
    if _is_hub_id(str(path_or_id)):
        if _offline():
            raise UserError(
                f"model {str(path_or_id)!r} is not a local folder and HF_HUB_OFFLINE=1 forbids downloading it; "
                "pass --model /path/to/weights"
            )
        return str(path_or_id)
    raise UserError(f"model path does not exist: {path_or_id}")


def _dtype_kwargs(dtype: torch.dtype | None) -> dict[str, Any]:
    """``torch_dtype=`` before transformers 4.56, ``dtype=`` after (the old name warns there)."""
    if dtype is None:
        return {}
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}


@contextlib.contextmanager
def _loading(source: str, what: str, remote_code: bool = False):
    """Imports with kernel stubs; any failure becomes one line naming the checkpoint and the cause, and for a
    checkpoint's own code (``remote_code``) the transformers releases that code runs on."""
    try:
        with kernel_stubs():
            yield
    except UserError:
        raise
    except Exception as exc:  # a damaged folder or incompatible remote code fails in many ways
        first_line = (str(exc).strip().splitlines() or [""])[0]
        hint = ""
        if remote_code and transformers.__version__ not in SpecifierSet(REMOTE_CODE_TRANSFORMERS):
            hint = (
                f" (transformers {transformers.__version__} is installed; the published LLaDA/Dream/SDAR modeling "
                f'files run on transformers{REMOTE_CODE_TRANSFORMERS}: pip install -e ".[remote-code]")'
            )
        raise UserError(f"cannot load the {what} of {source!r}: {type(exc).__name__}: {first_line}{hint}") from exc


def _is_hub_id(source: str) -> bool:
    """``owner/name`` with nothing else: what the Hub accepts and a relative path rarely looks like."""
    parts = source.split("/")
    return len(parts) == 2 and all(parts) and not source.startswith((".", "~"))


def _special_ids(tokenizer, tokens: tuple[str, ...]) -> list[int | None]:
    """Ids of the tokens the tokenizer knows (unknown ones give None)."""
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
    with atomic_folder(path) as folder:  # never a config without its weights (a folder that looks complete)
        model.save_pretrained(folder)
        dlm.tokenizer.save_pretrained(folder)


__all__ = [
    "MODEL_FAMILIES",
    "DiffusionLM",
    "build_tiny",
    "load_diffusion_lm",
    "load_model_spec",
    "save_diffusion_lm",
]
