"""LLaDA and SDAR checkpoints load through transformers' remote-code path, offline, from a local folder.

LLaDA-8B and SDAR-8B cannot be downloaded here, so each test writes a small stand-in checkpoint the way those
repositories ship theirs: ``config.json`` with an ``auto_map`` pointing at a modeling file next to the weights,
loaded with ``trust_remote_code=True``. The stand-in attends over the keys its mask allows (so a wrong mask changes
the logits) and records the keyword arguments it receives. The tests check each backend's calling convention
(LLaDA: 2-D ``attention_mask`` or additive 4-D ``attention_bias``; SDAR: additive 4-D mask and position ids), the
mask-id rule (config value, else the family default) and a whole decode through the project's samplers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from stabledrl_bench.masks import block_causal_mask
from stabledrl_bench.models import build_tiny, load_diffusion_lm
from stabledrl_bench.models.backends import LLaDABackend, SDARBackend
from stabledrl_bench.sampling import DecodeSettings, generate

MODELING = '''
import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput


class StubLLaDAConfig(PretrainedConfig):
    model_type = "llada"

    def __init__(self, vocab_size=64, hidden_size=16, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        super().__init__(**kwargs)


class StubSDARConfig(StubLLaDAConfig):
    model_type = "sdar"

    def __init__(self, vocab_size=64, hidden_size=16, **kwargs):  # transformers 5 does not inherit config inits
        super().__init__(vocab_size=vocab_size, hidden_size=hidden_size, **kwargs)


class StubModel(PreTrainedModel):
    """One attention-like mixing step: each query averages the value of every key its mask allows."""

    config_class = StubLLaDAConfig
    calls = []  # keyword arguments of every forward, for the test to inspect

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.head = torch.nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, attention_bias=None, position_ids=None):
        type(self).calls.append(
            {"attention_mask": attention_mask, "attention_bias": attention_bias, "position_ids": position_ids}
        )
        h = self.embed(input_ids)
        t = input_ids.shape[1]
        bias = torch.zeros(input_ids.shape[0], 1, t, t, dtype=h.dtype)
        if attention_bias is not None:
            bias = bias + attention_bias
        if attention_mask is not None and attention_mask.dim() == 2:
            bias = bias.masked_fill(~attention_mask.bool()[:, None, None, :], float("-inf"))
        elif attention_mask is not None:
            bias = bias + attention_mask
        mixed = torch.softmax(bias, dim=-1)[:, 0] @ h
        if position_ids is not None:
            mixed = mixed + 0.01 * position_ids[..., None].to(h.dtype)
        return MaskedLMOutput(logits=self.head(mixed))


class StubSDARModel(StubModel):
    config_class = StubSDARConfig
'''


def _stand_in(folder: Path, family: str, **config: object) -> Path:
    """A local checkpoint with remote code, the tiny model's tokenizer and random weights."""
    folder.mkdir()
    (folder / "modeling_stub.py").write_text(MODELING)
    tokenizer = build_tiny(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32).tokenizer
    tokenizer.save_pretrained(folder)
    auto = "AutoModelForCausalLM" if family == "sdar" else "AutoModel"
    model_class = "StubSDARModel" if family == "sdar" else "StubModel"
    config_class = "StubSDARConfig" if family == "sdar" else "StubLLaDAConfig"
    from importlib import util

    spec = util.spec_from_file_location(f"stub_{family}", folder / "modeling_stub.py")
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = getattr(module, model_class)(getattr(module, config_class)(vocab_size=len(tokenizer), **config))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(folder)
    data = json.loads((folder / "config.json").read_text())
    data["auto_map"] = {"AutoConfig": f"modeling_stub.{config_class}", auto: f"modeling_stub.{model_class}"}
    (folder / "config.json").write_text(json.dumps(data))
    return folder


def _calls(dlm) -> list[dict]:
    return type(dlm.model).calls


def test_llada_loads_offline_with_remote_code_and_passes_its_masks(tmp_path: Path) -> None:
    dlm = load_diffusion_lm(_stand_in(tmp_path / "llada", "llada"))
    assert isinstance(dlm, LLaDABackend) and dlm.attention == "full"
    assert dlm.mask_id == 126336  # LLaDA's default: the config has no mask_token_id
    ids = torch.tensor([[0, 10, 11, 12], [13, 14, 15, 16]])
    padding = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    _calls(dlm).clear()
    two_d = dlm.logits(ids, padding)
    assert _calls(dlm)[-1]["attention_mask"].dtype == torch.long and _calls(dlm)[-1]["attention_bias"] is None
    # The left pad is never attended: the padded row's real positions equal the same row without the pad.
    torch.testing.assert_close(two_d[0, 1:], dlm.logits(ids[:1, 1:])[0])
    # A boolean 4-D pattern goes in as an additive bias (0 where allowed, a large negative value elsewhere).
    pattern = padding.bool()[:, None, None, :] & torch.ones(2, 1, 4, 1, dtype=torch.bool)
    four_d = dlm.logits(ids, pattern)
    bias = _calls(dlm)[-1]["attention_bias"]
    assert _calls(dlm)[-1]["attention_mask"] is None and bias.shape == (2, 1, 4, 4)
    assert (bias[pattern] == 0).all() and (bias[~pattern] < -1e4).all()
    torch.testing.assert_close(four_d[:, 1:], two_d[:, 1:])


def test_llada_reads_the_mask_id_from_its_config_and_decodes(tmp_path: Path) -> None:
    dlm = load_diffusion_lm(_stand_in(tmp_path / "llada", "llada", mask_token_id=3))
    assert dlm.mask_id == 3
    prompt_ids, prompt_mask = dlm.encode_prompts([[{"role": "user", "content": "12"}]] * 2)
    settings = DecodeSettings(gen_length=8, block_length=4, steps=4, temperature=0.0)
    out = generate(dlm, prompt_ids, prompt_mask, settings, generator=torch.Generator().manual_seed(0))
    assert out.completion_ids.shape == (2, 8) and not (out.completion_ids == dlm.mask_id).any()
    torch.testing.assert_close(out.completion_ids[0], out.completion_ids[1])  # greedy, same prompt
    assert out.nfe == 4


def test_sdar_loads_as_causal_lm_with_block_attention(tmp_path: Path) -> None:
    dlm = load_diffusion_lm(_stand_in(tmp_path / "sdar", "sdar", block_size=4, mask_token_id=3))
    assert isinstance(dlm, SDARBackend)
    assert (dlm.attention, dlm.block_size, dlm.mask_id) == ("block", 4, 3)
    ids = torch.arange(10, 18)[None]
    pattern = block_causal_mask(torch.ones(1, 8, dtype=torch.bool), 0, 4)
    _calls(dlm).clear()
    logits = dlm.logits(ids, pattern, torch.arange(8)[None])
    call = _calls(dlm)[-1]
    assert call["attention_mask"].shape == (1, 1, 8, 8) and call["position_ids"] is not None
    # Block-causal: the first block cannot see the second, so changing the second leaves the first unchanged.
    changed = ids.clone()
    changed[0, 4:] = 20
    torch.testing.assert_close(dlm.logits(changed, pattern, torch.arange(8)[None])[:, :4], logits[:, :4])
    with pytest.raises(ValueError, match="4-D"):
        dlm.logits(ids, torch.ones(1, 8, dtype=torch.bool))
    prompt_ids, prompt_mask = dlm.encode_prompts([[{"role": "user", "content": "12"}]])
    out = generate(
        dlm, prompt_ids, prompt_mask, DecodeSettings(gen_length=8, steps=8, temperature=0.0, use_cache=False)
    )
    assert out.completion_ids.shape == (1, 8) and not (out.completion_ids == 3).any()
