"""Model backends behind one interface (:class:`DiffusionLM`), the tiny built-in model and its tokenizer."""

from stabledrl_bench.core.models.backends import MODEL_FAMILIES, build_tiny, load_diffusion_lm, save_diffusion_lm
from stabledrl_bench.core.models.interface import DiffusionLM
from stabledrl_bench.core.models.tiny import KVCache, TinyDLM, TinyDLMConfig
from stabledrl_bench.core.models.tokenizer import build_char_tokenizer

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
