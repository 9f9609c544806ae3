"""Model layer: tiny model + tokenizer round trips, attention patterns, KV-cache exactness, backends, errors."""

from __future__ import annotations

import json

import pytest
import torch

from stabledrl_bench.core.masks import block_causal_mask, block_index, staircase_mask, staircase_position_ids
from stabledrl_bench.core.models import build_tiny, load_diffusion_lm, save_diffusion_lm
from stabledrl_bench.core.models.backends import DreamBackend
from stabledrl_bench.errors import UserError

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def test_tokenizer_roundtrip_and_specials():
    dlm = build_tiny(**SMALL)
    tok = dlm.tokenizer
    text = "Q: 12+30=?\n\t<answer>42</answer>"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    assert len({dlm.mask_id, dlm.eos_id, dlm.pad_id}) == 3
    assert tok.decode([tok.unk_token_id]) == "<|unk|>"
    rendered = dlm.render_prompt([{"role": "user", "content": "hi"}], prefill="<reasoning>")
    assert rendered == "<|user|>hi<|eot|><|assistant|><reasoning>"
    assert dlm.render_prompt("hi", chat_template=False, prefill="x") == "hix"


def test_save_load_roundtrip(tmp_path):
    dlm = build_tiny(attention="block", block_size=4, seed=3, **SMALL)
    save_diffusion_lm(dlm, tmp_path)
    loaded = load_diffusion_lm(tmp_path)
    assert (loaded.family, loaded.attention, loaded.block_size) == ("tiny", "block", 4)
    assert (loaded.mask_id, loaded.eos_id, loaded.pad_id, loaded.stop_ids) == (
        dlm.mask_id,
        dlm.eos_id,
        dlm.pad_id,
        dlm.stop_ids,
    )
    ids = torch.randint(0, dlm.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(loaded.logits(ids), dlm.logits(ids), rtol=0, atol=0)
    assert loaded.tokenizer("a+b")["input_ids"] == dlm.tokenizer("a+b")["input_ids"]
    assert loaded.tokenizer.chat_template == dlm.tokenizer.chat_template


def test_build_is_deterministic_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = build_tiny(seed=1, **SMALL), build_tiny(seed=1, **SMALL), build_tiny(seed=2, **SMALL)
    assert torch.equal(torch.random.get_rng_state(), state)
    wa, wb, wc = (m.model.embed.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_encode_prompts_left_pads_and_truncates_from_the_left():
    dlm = build_tiny(**SMALL)
    ids, mask = dlm.encode_prompts(["ab", "abcd"], chat_template=False, prefill="!")
    assert mask.tolist() == [[False, False, True, True, True], [True] * 5]
    assert ids[0, :2].tolist() == [dlm.pad_id] * 2
    ids, _ = dlm.encode_prompts(["abcdef"], chat_template=False, max_prompt_length=3)
    assert dlm.tokenizer.decode(ids[0].tolist()) == "def"


def test_completion_mask_keeps_first_stop_token():
    dlm = build_tiny(**SMALL)
    eos, eot, x = dlm.eos_id, dlm.stop_ids[1], 20
    ids = torch.tensor([[x, eos, x, eos], [x, x, x, x], [eot, x, eos, x]])
    assert dlm.completion_mask(ids).tolist() == [
        [True, True, False, False],
        [True] * 4,
        [True, False, False, False],
    ]
    assert dlm.response_lengths(ids).tolist() == [1, 4, 0]


def test_left_padding_does_not_change_real_logits():
    """RoPE is relative and pad keys are masked, so a left-padded row equals the unpadded row."""
    dlm = build_tiny(**SMALL).model.double()
    ids = torch.randint(8, 100, (1, 6), generator=torch.Generator().manual_seed(1))
    padded = torch.cat((torch.zeros(1, 3, dtype=torch.long), ids), dim=1)
    valid = torch.tensor([[False] * 3 + [True] * 6])
    ref = dlm(ids).logits
    out = dlm(padded, attention_mask=valid).logits[:, 3:]
    torch.testing.assert_close(out, ref, rtol=1e-7, atol=1e-7)  # RoPE angles are float32


def test_block_index_and_block_causal_mask_by_hand():
    # prompt of 3 (blocks aligned to its end), block 2, response 4: ids -2,-1,-1,0,0,1,1
    assert block_index(7, 3, 2).tolist() == [-2, -1, -1, 0, 0, 1, 1]
    valid = torch.tensor([[False, True, True, True, True, True, True]])
    mask = block_causal_mask(valid, prompt_len=3, block_size=2)[0, 0].int()
    expected = torch.tensor(
        [
            [0, 0, 0, 0, 0, 0, 0],
            [0, 1, 1, 0, 0, 0, 0],
            [0, 1, 1, 0, 0, 0, 0],
            [0, 1, 1, 1, 1, 0, 0],
            [0, 1, 1, 1, 1, 0, 0],
            [0, 1, 1, 1, 1, 1, 1],
            [0, 1, 1, 1, 1, 1, 1],
        ]
    )
    assert torch.equal(mask, expected)


def test_staircase_mask_by_hand():
    # prompt 1, response 4, block 2: [p | c0 c1 c2 c3 | n0 n1 n2 n3]
    mask = staircase_mask(torch.tensor([[True]]), response_len=4, block_size=2)[0, 0].int()
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 1, 1, 0, 0],
            [1, 0, 0, 0, 0, 1, 1, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 1, 1],
            [1, 1, 1, 0, 0, 0, 0, 1, 1],
        ]
    )
    assert torch.equal(mask, expected)
    assert staircase_position_ids(torch.tensor([[True]]), 4).tolist() == [[0, 1, 2, 3, 4, 1, 2, 3, 4]]


def test_kv_cache_is_exact_for_block_attention():
    dlm = build_tiny(attention="block", block_size=2, **SMALL)
    model = dlm.model.double()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(8, 100, (2, 7), generator=gen)
    valid = torch.ones(2, 7, dtype=torch.bool)
    valid[0, 0] = False
    full = model(ids, attention_mask=block_causal_mask(valid, 3, 2)).logits
    # prefill the prompt (3 tokens), then feed the two response blocks against the cache
    mask = block_causal_mask(valid, 3, 2)
    out = model(ids[:, :3], attention_mask=mask[:, :, :3, :3], use_cache=True)
    cache, pieces = out.kv_cache, [out.logits]
    for start in (3, 5):
        step = model(
            ids[:, start : start + 2],
            attention_mask=mask[:, :, start : start + 2, : start + 2],
            kv_cache=cache,
            use_cache=True,
        )
        cache = step.kv_cache
        pieces.append(step.logits)
    # row 0, position 0 is left padding: its output is meaningless and excluded
    torch.testing.assert_close(torch.cat(pieces, dim=1)[valid], full[valid], rtol=1e-10, atol=1e-10)


def test_bad_masks_raise():
    model = build_tiny(**SMALL).model
    with pytest.raises(ValueError, match="2-D attention_mask"):
        model(torch.ones(1, 4, dtype=torch.long), attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.ones(1, 4, dtype=torch.long), position_ids=torch.tensor([[0, 1, 2, 5000]]))


def test_missing_paths_and_offline_hub_ids_give_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_diffusion_lm(tmp_path / "nope")
    with pytest.raises(UserError, match="HF_HUB_OFFLINE"):
        load_diffusion_lm("GSAI-ML/LLaDA-8B-Instruct")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mystery"}))
    with pytest.raises(UserError):
        load_diffusion_lm(tmp_path)


def test_dream_slot_shifts_logits(tmp_path):
    """Dream predicts token i at position i-1: the backend shifts logits right by one."""
    tiny = build_tiny(**SMALL)
    save_diffusion_lm(tiny, tmp_path)
    dream = load_diffusion_lm(tmp_path, family="dream")
    assert isinstance(dream, DreamBackend)
    ids = torch.randint(8, 100, (1, 5), generator=torch.Generator().manual_seed(2))
    raw = tiny.logits(ids)
    shifted = dream.logits(ids)
    torch.testing.assert_close(shifted[:, 1:], raw[:, :-1])
    torch.testing.assert_close(shifted[:, :1], raw[:, :1])


def test_build_tiny_takes_a_larger_output_vocabulary() -> None:
    """A benchmark can give the tiny body a real model's output head (LLaDA's 126,464); ids beyond the tokenizer's
    only widen the logits."""
    dlm = build_tiny(vocab_size=300)
    ids, _ = dlm.encode_prompts(["12"], chat_template=False)
    assert dlm.model.config.vocab_size == 300 and len(dlm.tokenizer) < 300
    assert dlm.logits(ids).shape == (1, ids.shape[1], 300)
