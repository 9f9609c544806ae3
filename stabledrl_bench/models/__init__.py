"""Model backends behind one interface (:class:`DiffusionLM`), the tiny built-in model and its tokenizer."""

from .backends import BACKENDS, build_tiny, load_diffusion_lm, save_diffusion_lm
from .interface import DiffusionLM
from .tiny import KVCache, TinyDLM, TinyDLMConfig
from .tokenizer import build_char_tokenizer

__all__ = [
    "BACKENDS",
    "DiffusionLM",
    "KVCache",
    "TinyDLM",
    "TinyDLMConfig",
    "build_char_tokenizer",
    "build_tiny",
    "load_diffusion_lm",
    "save_diffusion_lm",
]
