"""Model backends behind one interface (:class:`DiffusionLM`), the tiny built-in model and its tokenizer.

The names below are imported on first use (PEP 562): the backends import transformers' model classes, which takes
seconds, and code that only needs the :class:`DiffusionLM` interface (the samplers, a budget, a command's
``--help``) should not pay for them.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stabledrl_bench.core.models.backends import MODEL_FAMILIES, build_tiny, load_diffusion_lm, save_diffusion_lm
    from stabledrl_bench.core.models.interface import DiffusionLM
    from stabledrl_bench.core.models.tiny import KVCache, TinyDLM, TinyDLMConfig
    from stabledrl_bench.core.models.tokenizer import build_char_tokenizer

_WHERE = {
    "MODEL_FAMILIES": "backends",
    "build_tiny": "backends",
    "load_diffusion_lm": "backends",
    "save_diffusion_lm": "backends",
    "DiffusionLM": "interface",
    "KVCache": "tiny",
    "TinyDLM": "tiny",
    "TinyDLMConfig": "tiny",
    "build_char_tokenizer": "tokenizer",
}

__all__ = [
    "MODEL_FAMILIES",
    "DiffusionLM",
    "KVCache",
    "TinyDLM",
    "TinyDLMConfig",
    "build_char_tokenizer",
    "build_tiny",
    "load_diffusion_lm",
    "save_diffusion_lm",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
