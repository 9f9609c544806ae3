"""Checkpoints with remote code load offline from a local folder; GPU-only kernel imports get exact stand-ins.

LLaDA, Dream and SDAR ship their modeling code next to the weights (``config.json`` with an ``auto_map``, loaded
with ``trust_remote_code=True``). SDAR's files import flash-attn and triton at module level, which a CPU machine
does not have. These tests write such a checkpoint themselves (a small modeling file importing both packages
the way SDAR does), load it through ``load_diffusion_lm``, and check the stand-ins against reference code.
The published files themselves are exercised by ``test_upstream_models.py`` (opt-in).

Such code runs only when the user opts in (``--trust-remote-code``); the last tests check that nothing from the
folder runs without it, through every command that loads a model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from stabledrl_bench.cli import main
from stabledrl_bench.core.models import build_tiny, load_diffusion_lm
from stabledrl_bench.core.models.backends import REMOTE_CODE_ENV, SDARBackend
from stabledrl_bench.core.models.kernel_stubs import flash_attn_func, kernel_stubs, rms_norm_fn
from stabledrl_bench.errors import UserError

MODELING = '''
import torch
import triton
import triton.language as tl
from flash_attn.ops.triton.layer_norm import rms_norm_fn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

try:
    from flash_attn import flash_attn_func, flash_attn_varlen_func
except ImportError:
    pass


@triton.jit
def never_launched(x_ptr, n: tl.constexpr):
    pass


class KernelConfig(PretrainedConfig):
    model_type = "sdar"

    def __init__(self, vocab_size=64, hidden_size=16, block_size=4, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.block_size = block_size
        super().__init__(**kwargs)


class KernelModel(PreTrainedModel):
    """One attention layer in SDAR's style: RMSNorm by flash-attn's kernel, SDPA under a mask, flash-attn without."""

    config_class = KernelConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = torch.nn.Parameter(torch.ones(config.hidden_size))
        self.head = torch.nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        h = rms_norm_fn(self.embed(input_ids), self.norm, None, eps=1e-6)
        q = h.view(*h.shape[:2], 2, -1)  # [B, L, heads, dim]
        mask = attention_mask.bool()
        if bool(mask.all()):
            out = flash_attn_func(q, q, q, causal=False)
        else:
            t = q.transpose(1, 2)
            out = torch.nn.functional.scaled_dot_product_attention(t, t, t, attn_mask=mask).transpose(1, 2)
        return CausalLMOutput(logits=self.head(out.reshape(h.shape)))
'''


@pytest.fixture(autouse=True)
def trusted(monkeypatch):
    """These tests load remote code on purpose: the user's opt-in, as ``--trust-remote-code`` gives it."""
    monkeypatch.setenv(REMOTE_CODE_ENV, "1")


def _checkpoint(folder: Path, **config: object) -> Path:
    """A local remote-code checkpoint with the tiny model's tokenizer and seeded random weights."""
    folder.mkdir()
    (folder / "modeling_kernels.py").write_text(MODELING)
    tokenizer = build_tiny(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32).tokenizer
    tokenizer.save_pretrained(folder)
    auto_map = {"AutoConfig": "modeling_kernels.KernelConfig", "AutoModelForCausalLM": "modeling_kernels.KernelModel"}
    data = {"model_type": "sdar", "vocab_size": len(tokenizer), "hidden_size": 16, "auto_map": auto_map, **config}
    (folder / "config.json").write_text(json.dumps(data))
    with kernel_stubs():
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(folder, trust_remote_code=True), trust_remote_code=True
        )
    model.save_pretrained(folder)
    return folder


def test_a_checkpoint_importing_flash_attn_and_triton_loads_offline_on_cpu(tmp_path: Path) -> None:
    dlm = load_diffusion_lm(_checkpoint(tmp_path / "sdar", block_size=4, mask_token_id=3))
    assert isinstance(dlm, SDARBackend) and (dlm.attention, dlm.block_size, dlm.mask_id) == ("block", 4, 3)
    # The stand-ins are gone again: nobody else mistakes them for the real packages.
    assert "flash_attn" not in sys.modules and "triton" not in sys.modules
    # The block-causal path (SDPA) and the all-visible path (flash-attn stand-in) agree on a single block.
    ids = torch.arange(10, 14)[None]
    inside = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    logits = dlm.logits(ids, inside, torch.arange(4)[None])
    reference = dlm.model.head(_reference_layer(dlm.model, ids))
    torch.testing.assert_close(logits, reference)


def _reference_layer(model, ids: torch.Tensor) -> torch.Tensor:
    h = model.embed(ids)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * model.norm
    q = h.view(*h.shape[:2], 2, -1).transpose(1, 2)
    out = torch.softmax(q @ q.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ q
    return out.transpose(1, 2).reshape(h.shape)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_stand_in_equals_a_loop_over_queries(causal: bool) -> None:
    """[B, L, H, D] layout, grouped-query heads, flash-attn's bottom-right causal alignment (Q != K)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 3, 4, 8, generator=g),
        torch.randn(2, 5, 2, 8, generator=g),
        torch.randn(2, 5, 2, 8, generator=g),
    )
    out = flash_attn_func(q, k, v, softmax_scale=0.3, causal=causal)
    expected = torch.zeros_like(out)
    for b in range(2):
        for h in range(4):
            for i in range(3):
                visible = 5 if not causal else i + 1 + (5 - 3)
                scores = (k[b, :visible, h // 2] @ q[b, i, h]) * 0.3
                expected[b, i, h] = torch.softmax(scores, 0) @ v[b, :visible, h // 2]
    torch.testing.assert_close(out, expected)


def test_rms_norm_stand_in_is_float32_rmsnorm() -> None:
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    w, b = torch.rand(8), torch.rand(8)
    xf = x.float()
    expected = (xf / torch.sqrt((xf * xf).mean(-1, keepdim=True) + 1e-5) * w + b).to(torch.bfloat16)
    torch.testing.assert_close(rms_norm_fn(x, w, b, eps=1e-5), expected)
    with pytest.raises(NotImplementedError, match="residual"):
        rms_norm_fn(x, w, residual=x)


def test_launching_a_stubbed_triton_kernel_fails_loudly() -> None:
    with kernel_stubs() as stubbed:
        import triton

        @triton.jit
        def kernel(x):
            return x

    if "triton" not in stubbed:
        pytest.skip("triton is installed here; nothing was stubbed")
    with pytest.raises(RuntimeError, match="triton is not installed"):
        kernel[(1,)](0)


def test_mask_id_comes_from_the_config_else_the_family_default(tmp_path: Path) -> None:
    assert load_diffusion_lm(_checkpoint(tmp_path / "a", block_size=4)).mask_id == 151669  # SDAR's default
    assert load_diffusion_lm(_checkpoint(tmp_path / "b", block_size=4, mask_token_id=5)).mask_id == 5


def test_a_checkpoint_that_fails_to_load_is_one_clear_error(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "broken", block_size=4)
    (folder / "modeling_kernels.py").write_text(MODELING + "\nraise ImportError('needs a newer library')\n")
    with pytest.raises(UserError, match=r"cannot load the .* of .*broken.*ImportError: needs a newer library"):
        load_diffusion_lm(folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    (folder / "modeling_kernels.py").write_text(MODELING)
    with pytest.raises(UserError, match=r"cannot load the model of .*broken"):
        load_diffusion_lm(folder)


def test_a_failing_remote_file_names_the_transformers_releases_it_runs_on(tmp_path: Path, monkeypatch) -> None:
    from stabledrl_bench.core.models import backends

    folder = _checkpoint(tmp_path / "old", block_size=4)
    (folder / "modeling_kernels.py").write_text(MODELING + "\nraise ImportError('cannot import LossKwargs')\n")
    monkeypatch.setattr(backends, "REMOTE_CODE_TRANSFORMERS", "<1")  # the installed one is outside
    with pytest.raises(UserError, match=r"LossKwargs \(transformers .* installed; .* on transformers<1: .*remote-code"):
        load_diffusion_lm(folder)
    monkeypatch.setattr(backends, "REMOTE_CODE_TRANSFORMERS", ">=1")  # inside: the cause alone
    with pytest.raises(UserError, match=r"LossKwargs'?$"):
        load_diffusion_lm(folder)


def test_a_checkpoint_with_its_own_code_runs_none_of_it_unless_the_user_opts_in(tmp_path, monkeypatch, capsys):
    from stabledrl_bench.evaluation.lmeval_adapter import DiffusionEvalLM

    folder = _checkpoint(tmp_path / "sent", block_size=4, mask_token_id=3)
    ran = tmp_path / "RAN"  # the canary: the folder's code writes it when imported
    (folder / "modeling_kernels.py").write_text(f"open({str(ran)!r}, 'w').write('ran')\n" + MODELING)
    monkeypatch.delenv(REMOTE_CODE_ENV)
    commands = [
        ["check-model", "--model", str(folder)],
        ["eval", "--model", str(folder), "--task", "sudoku", "--limit", "1", "--results", str(tmp_path / "r")],
        ["train", "--model", str(folder), "--task", "sudoku", "--output-dir", str(tmp_path / "run")],
        ["sft", "--model", str(folder), "--task", "sudoku", "--output-dir", str(tmp_path / "sft")],
        ["stress", "longrun", "--warm-start", str(folder), "--runs", str(tmp_path / "stress"), "--no-leaderboard"],
    ]
    for argv in commands:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "ships its own Python code (modeling_kernels.py)" in err[0], argv
        assert "--trust-remote-code" in err[0]  # and the command takes that flag:
        assert main([*argv, "--trust-remote-code", "--no-such-option"]) == 2
        assert capsys.readouterr().err.strip() == "error: unrecognized arguments: --no-such-option", argv
    with pytest.raises(UserError, match="trust_remote_code=True"):
        DiffusionEvalLM(pretrained=str(folder))
    assert not ran.exists()
    assert main(["check-model", "--model", str(folder), "--trust-remote-code"]) in (0, 2)  # runs, whatever it finds
    assert ran.exists()
    lm = DiffusionEvalLM(
        pretrained=str(folder), trust_remote_code="True", protocol="tiny-static", max_completion_length=8
    )
    assert isinstance(lm.dlm, SDARBackend)  # the lm-eval opt-in loads it (its code was imported just above)
