"""Pure-PyTorch stand-ins for GPU kernel packages that published modeling files import unconditionally.

SDAR's modeling files (``JetAstra/SDAR: training/model/SDAR-8B-Chat/modeling_sdar.py`` and TraDo's copy in
``Gen-Verse/dLLM-RL: models/sdar/modeling_sdar.py``) import ``flash_attn`` at module level, and SDAR-8B-Chat's
``fused_linear_diffusion_cross_entropy.py`` imports ``triton``. Neither package exists on a CPU-only machine
(flash-attn has no CPU build at all), so without help those checkpoints cannot even be loaded there.

:func:`kernel_stubs` installs, for the duration of a remote-code import and only for packages that are not
importable, modules that provide exactly what those files use:

* ``flash_attn.flash_attn_func`` -- the same attention computed by ``scaled_dot_product_attention`` (layout
  [batch, length, heads, dim], grouped-query heads, bottom-right-aligned causal mask as flash-attn defines it);
* ``flash_attn.ops.triton.layer_norm.rms_norm_fn`` -- RMSNorm in float32, as the kernel computes it;
* ``triton`` / ``triton.language`` -- decorators that leave functions undecorated, for the SFT-only fused loss;
  launching such a kernel raises, so nothing silently runs in place of a real kernel.

When the real packages are installed (any GPU machine set up for these models) nothing is replaced. The stubs
are removed from ``sys.modules`` after the import; the loaded modeling module keeps the functions it bound.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F


def _used(options: dict[str, Any]) -> bool:
    """Whether any optional argument asks for something (a tensor, True, a non-zero number)."""
    return any(v is not None and (isinstance(v, torch.Tensor) or bool(v)) for v in options.values())


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    **unsupported: Any,
) -> torch.Tensor:
    """flash-attn's ``flash_attn_func`` ([B, L, H, D] in and out) through PyTorch's SDPA.

    Grouped-query attention repeats each key/value head for its ``H_q / H_kv`` query heads. ``causal=True``
    aligns the mask to the bottom-right corner (query i sees keys up to ``i + K - Q``), flash-attn's
    convention when queries and keys differ in length.
    """
    if dropout_p or _used(unsupported):
        raise NotImplementedError(
            f"flash_attn stub: unsupported arguments dropout_p={dropout_p}, {sorted(unsupported)}"
        )
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    mask = None
    if causal:
        q_len, k_len = q.shape[2], k.shape[2]
        rows = torch.arange(q_len, device=q.device)[:, None] + (k_len - q_len)
        mask = torch.arange(k_len, device=q.device)[None, :] <= rows
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=softmax_scale)
    return out.transpose(1, 2)


def rms_norm_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
    **unsupported: Any,
) -> torch.Tensor:
    """flash-attn's Triton RMSNorm without residual/dropout options: float32 statistics, output in x's dtype."""
    if _used(unsupported):
        raise NotImplementedError(f"rms_norm_fn stub: unsupported arguments {sorted(unsupported)}")
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _not_available(name: str):
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{name} needs the real flash-attn package (a CUDA build); it is not installed")

    return fail


class _Kernel:
    """What ``@triton.jit`` returns here: the plain function, which cannot be launched (``kernel[grid](...)``)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Any:
        raise RuntimeError(
            f"triton kernel {getattr(self.fn, '__name__', self.fn)!r} launched, but triton is not installed"
        )


def _decorator(*args: Any, **kwargs: Any) -> Any:
    """``@triton.jit`` and ``@triton.jit(...)``, ``@triton.autotune(...)``, ``@triton.heuristics(...)``."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0] if isinstance(args[0], _Kernel) else _Kernel(args[0])
    return _decorator


class _Anything:
    """Placeholder for ``tl.constexpr`` and friends in signatures evaluated at import time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def __getattr__(self, name: str) -> _Anything:
        return _Anything()

    def __call__(self, *args: Any, **kwargs: Any) -> _Anything:
        return _Anything()


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    module.__path__ = []
    module.__dict__.update(attrs)
    return module


def _flash_attn_modules() -> dict[str, types.ModuleType]:
    varlen = _not_available("flash_attn_varlen_func")
    return {
        "flash_attn": _module(
            "flash_attn", __version__="0.0.0+stub", flash_attn_func=flash_attn_func, flash_attn_varlen_func=varlen
        ),
        "flash_attn.bert_padding": _module(
            "flash_attn.bert_padding",
            index_first_axis=_not_available("index_first_axis"),
            pad_input=_not_available("pad_input"),
            unpad_input=_not_available("unpad_input"),
        ),
        "flash_attn.ops": _module("flash_attn.ops"),
        "flash_attn.ops.triton": _module("flash_attn.ops.triton"),
        "flash_attn.ops.triton.layer_norm": _module("flash_attn.ops.triton.layer_norm", rms_norm_fn=rms_norm_fn),
    }


def _triton_modules() -> dict[str, types.ModuleType]:
    # torch decides once, at import, whether triton exists (``torch._inductor.runtime.triton_compat``); settle
    # that with the real answer (it does not) before the stub appears, or ``@torch.compile`` in a modeling file
    # would take the stub for a GPU compiler.
    with contextlib.suppress(ImportError):
        importlib.import_module("torch._inductor.runtime.triton_compat")
    language = _module("triton.language")
    language.__getattr__ = lambda name: _Anything()  # module-level __getattr__ (PEP 562)
    triton = _module(
        "triton",
        __version__="0.0.0+stub",
        jit=_decorator,
        autotune=_decorator,
        heuristics=_decorator,
        Config=_Anything,
        cdiv=lambda a, b: -(-a // b),
        next_power_of_2=lambda n: 1 << max(0, int(n) - 1).bit_length(),
        language=language,
    )
    return {"triton": triton, "triton.language": language}


def _importable(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


STUBBED_PACKAGES = {"flash_attn": _flash_attn_modules, "triton": _triton_modules}


@contextlib.contextmanager
def kernel_stubs() -> Iterator[list[str]]:
    """Provide the stubs above for missing kernel packages while the body runs; yields the names stubbed."""
    added: dict[str, types.ModuleType] = {}
    for package, build in STUBBED_PACKAGES.items():
        if not _importable(package):
            added.update(build())
    sys.modules.update(added)
    try:
        yield sorted({name.split(".")[0] for name in added})
    finally:
        for name, module in added.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
