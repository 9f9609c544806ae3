"""The native LLaDA and Dream (``core/models/llada.py``, ``dream.py``): their checkpoint folders load without running
their code. Everything the harness computes through the native LLaDA equals the tiny model on the same weights; the
native Dream's network equals the tiny network on the same weights (its backend shifts the logits, as Dream's must).

The tiny model is the same architecture as LLaDA (pre-norm RMSNorm, rotate-half RoPE, SiLU-gated MLP, no biases),
so its weights, renamed and split into LLaDA's parameter names, make a LLaDA checkpoint; the tiny backend is the
reference every other backend is pinned to (``tests/test_conventions.py``). Equality with the *published* LLaDA
file on the same weights is checked by the opt-in ``tests/test_upstream_models.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from backend_checks import (
    PROMPTS,
    assert_batch_size_invariant,
    decode,
    estimates,
    evaluation_rows,
    lmeval_outputs,
    rl_step,
    sequence_batch,
    write_dream_tokenizer,
)
from safetensors.torch import load_file, save_file

from stabledrl_bench.core.models import build_tiny, load_diffusion_lm, save_diffusion_lm
from stabledrl_bench.core.models.backends import DreamNativeBackend, LLaDANativeBackend, SDARNativeBackend, TinyBackend
from stabledrl_bench.core.models.convert import save_tiny_as
from stabledrl_bench.core.models.llada import LLaDANativeConfig, LLaDANativeModel
from stabledrl_bench.core.models.qwen import DreamNativeConfig, DreamNativeModel, SDARNativeConfig, SDARNativeModel
from stabledrl_bench.errors import UserError

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def write_llada_folder(folder: Path, tiny_folder: Path, **config_changes) -> Path:
    """A LLaDA checkpoint as published, holding the tiny model's weights (:func:`save_tiny_as`)."""
    return save_tiny_as(load_diffusion_lm(tiny_folder), "llada", folder, **config_changes)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llada-native")
    tiny = root / "tiny"
    save_diffusion_lm(build_tiny(seed=3, **SMALL), tiny)
    return {"tiny": tiny, "llada": write_llada_folder(root / "llada", tiny)}


@pytest.fixture(scope="module")
def models(folders):
    return load_diffusion_lm(folders["tiny"]), load_diffusion_lm(folders["llada"])


def test_a_llada_folder_loads_natively_without_running_its_code(models, folders) -> None:
    tiny, llada = models
    assert isinstance(tiny, TinyBackend) and isinstance(llada, LLaDANativeBackend)
    assert isinstance(llada.model, LLaDANativeModel) and not llada.pad_free  # masks are honoured
    assert llada.full_cache_modes == ("prefix", "dual")
    # the remote implementation is the checkpoint's own code: refused without the opt-in, never imported
    with pytest.raises(UserError, match="ships its own Python code"):
        load_diffusion_lm(folders["llada"], implementation="remote", trust_remote_code=False)


def test_logits_on_padded_batches_equal_the_tiny_model(models) -> None:
    tiny, llada = models
    ids, mask = tiny.encode_prompts(PROMPTS, chat_template=False)
    canvas = torch.cat((ids, torch.full((ids.shape[0], 6), tiny.mask_id)), dim=1)
    attention = tiny.context_attention(mask, 6)
    torch.testing.assert_close(llada.logits(canvas, attention), tiny.logits(canvas, attention), rtol=0, atol=1e-5)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_decoding_equals_the_tiny_model_with_every_cache(models, cache: str) -> None:
    """The dual cache runs on LLaDA now (positions are explicit), and gives the tiny model's tokens."""
    tiny, llada = models
    ours, theirs = (decode(dlm, PROMPTS, cache=cache).completion_ids for dlm in (llada, tiny))
    assert torch.equal(ours, theirs)
    for temperature in (0.0, 1.0):
        assert torch.equal(
            decode(tiny, PROMPTS, temperature=temperature).completion_ids,
            decode(llada, PROMPTS, temperature=temperature).completion_ids,
        )


def test_estimators_evaluation_and_lm_eval_equal_the_tiny_model(models) -> None:
    tiny, llada = models
    ours, theirs = estimates(llada, sequence_batch(llada, PROMPTS)), estimates(tiny, sequence_batch(tiny, PROMPTS))
    for name in theirs:
        for field in theirs[name]:
            torch.testing.assert_close(ours[name][field], theirs[name][field], rtol=0, atol=1e-5)
    assert [r["completion"] for r in evaluation_rows(llada)] == [r["completion"] for r in evaluation_rows(tiny)]
    (texts, scores), (ref_texts, ref_scores) = lmeval_outputs(llada), lmeval_outputs(tiny)
    assert texts == ref_texts
    assert [s[1] for s in scores] == [s[1] for s in ref_scores]
    torch.testing.assert_close(torch.tensor([s[0] for s in scores]), torch.tensor([s[0] for s in ref_scores]))


@pytest.mark.parametrize("baseline", ["grpo", "stabledrl"])
def test_an_rl_step_equals_the_tiny_model_with_checkpointing(folders, tmp_path: Path, baseline: str) -> None:
    ours = rl_step(folders["llada"], baseline, tmp_path / "llada", gradient_checkpointing=True)
    theirs = rl_step(folders["tiny"], baseline, tmp_path / "tiny")
    for key in ("loss", "reward_mean", "grad_norm"):
        assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key


def test_unsupported_variants_go_to_remote_code_or_fail_in_one_line(folders, tmp_path: Path) -> None:
    variant = write_llada_folder(tmp_path / "sequential", folders["tiny"], block_type="sequential")
    with pytest.raises(UserError, match="ships its own Python code"):  # auto: the variant's own code, opt-in
        load_diffusion_lm(variant, trust_remote_code=False)
    with pytest.raises(UserError, match=r"native LLaDA: block_type='sequential' is not built here"):
        load_diffusion_lm(variant, implementation="native")
    with pytest.raises(UserError, match="implementation must be one of"):
        load_diffusion_lm(folders["llada"], implementation="fast")


def test_the_8b_configuration_builds_on_the_meta_device() -> None:
    """LLaDA-8B-Instruct's shape (its config.json's structural fields): about 8.0B parameters, 32 blocks."""
    config = LLaDANativeConfig(
        d_model=4096,
        n_heads=32,
        n_kv_heads=32,
        n_layers=32,
        mlp_hidden_size=12288,
        vocab_size=126464,
        embedding_size=126464,
        rope_theta=500000.0,
        block_type="llama",
        layer_norm_type="rms",
        activation_type="silu",
    )
    with torch.device("meta"):
        model = LLaDANativeModel(config)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes["model.transformer.blocks.31.ff_proj.weight"] == (12288, 4096)
    assert shapes["model.transformer.ff_out.weight"] == (126464, 4096) and len(shapes) == 3 + 32 * 9
    assert 8.0e9 < sum(p.numel() for p in model.parameters()) < 8.05e9


# The structural fields of the published config.json files (Dream-v0-Instruct-7B: Qwen2.5-7B's shape; SDAR-8B-Chat:
# Qwen3-8B's), with parameter names and shapes as in their safetensors and the totals the Hub pages give.
BIG = {
    "dream": (
        DreamNativeConfig,
        DreamNativeModel,
        dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            vocab_size=152064,
            tie_word_embeddings=False,
        ),
        {
            "model.layers.27.self_attn.q_proj.bias": (3584,),
            "model.layers.0.self_attn.k_proj.weight": (512, 3584),
            "model.layers.0.mlp.gate_proj.weight": (18944, 3584),
            "lm_head.weight": (152064, 3584),
        },
        (7.61e9, 7.62e9),  # "7.62B params"
    ),
    "sdar": (
        SDARNativeConfig,
        SDARNativeModel,
        dict(
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            tie_word_embeddings=False,
            block_size=4,
        ),
        {
            "model.layers.35.self_attn.q_norm.weight": (128,),
            "model.layers.0.self_attn.k_proj.weight": (1024, 4096),
            "model.layers.0.mlp.down_proj.weight": (4096, 12288),
            "model.embed_tokens.weight": (151936, 4096),
        },
        (8.19e9, 8.20e9),  # "8.19B params"
    ),
}


@pytest.mark.parametrize("family", sorted(BIG))
def test_the_published_dream_and_sdar_shapes_build_on_the_meta_device(family: str) -> None:
    config_class, model_class, fields, expected, (low, high) = BIG[family]
    with torch.device("meta"):
        model = model_class(config_class(**fields))
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert {name: shapes.get(name) for name in expected} == expected
    per_layer = 12 if family == "dream" else 11  # q/k/v weights (+ biases: Dream; + q/k norms: SDAR), o, mlp, norms
    assert len(shapes) == 3 + fields["num_hidden_layers"] * per_layer
    assert low < sum(p.numel() for p in model.parameters()) < high


@pytest.mark.parametrize(
    ("family", "attention", "backend"),
    [
        ("llada", "full", LLaDANativeBackend),
        ("dream", "full", DreamNativeBackend),
        ("sdar", "block", SDARNativeBackend),
    ],
)
def test_a_config_asking_for_other_attention_kernels_still_loads_natively(family, attention, backend, tmp_path):
    """SDAR-8B-Chat's config.json says ``attn_implementation: flex_attention`` (its own file's kernel); transformers
    refuses to build a class that does not declare that kernel, so the native configs drop the choice and the
    networks run their SDPA (it failed on both transformers 4.53 and 5.24 before)."""
    tiny = build_tiny(attention=attention, block_size=4)
    folder = save_tiny_as(tiny, family, tmp_path / family, attn_implementation="flex_attention")
    dlm = load_diffusion_lm(folder)
    assert type(dlm) is backend and dlm.model.config._attn_implementation == "sdpa"


SDAR_8B = "SDAR/training/model/SDAR-8B-Chat"  # under STABLEDRL_UPSTREAM_DIR: a checkout of JetAstra/SDAR


@pytest.mark.skipif(
    not os.environ.get("STABLEDRL_UPSTREAM_DIR"), reason="set STABLEDRL_UPSTREAM_DIR (see test_upstream_models.py)"
)
def test_sdar_8b_chat_config_builds_exactly_its_published_state_dict() -> None:
    """Opt-in, any transformers release (no remote code runs): SDAR-8B-Chat's own ``config.json`` builds the native
    SDAR with exactly the parameter names of its ``model.safetensors.index.json``, whose total size is that many
    bfloat16 values (JetAstra/SDAR ships both files beside the modeling code)."""
    folder = Path(os.environ["STABLEDRL_UPSTREAM_DIR"]) / SDAR_8B
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    with torch.device("meta"):
        model = SDARNativeModel(SDARNativeConfig.from_pretrained(folder))
    params = dict(model.named_parameters())
    assert set(params) == set(index["weight_map"])
    assert 2 * sum(p.numel() for p in params.values()) == index["metadata"]["total_size"]


# ---------------------------------------------------------------------------------------------------- Dream
@pytest.fixture(scope="module")
def dream_folder(folders, tmp_path_factory) -> Path:
    """A Dream checkpoint as published (model_type "Dream"), holding the tiny model's weights."""
    return save_tiny_as(load_diffusion_lm(folders["tiny"]), "dream", tmp_path_factory.mktemp("dream") / "dream")


def test_a_dream_folder_loads_natively_and_its_network_equals_the_tiny_one(models, dream_folder) -> None:
    tiny = models[0]
    dream = load_diffusion_lm(dream_folder)
    assert isinstance(dream, DreamNativeBackend) and dream.shift_logits and not dream.pad_free
    ids, mask = tiny.encode_prompts(PROMPTS, chat_template=False)
    pattern = mask.bool()[:, None, None, :].expand(-1, 1, ids.shape[1], -1)
    positions = torch.cumsum(mask.long(), dim=1).clamp(min=1) - 1
    with torch.no_grad():
        ours = dream.model(ids, attention_mask=pattern, position_ids=positions).logits
        theirs = tiny.model.run(ids, pattern, positions)[0]
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
        # keys cached after RoPE at explicit positions: the second half over the cached first half equals one
        # forward in which the first half sees only itself (what the cache holds) and the second half sees all
        length, half = ids.shape[1], ids.shape[1] // 2
        staged = torch.ones(1, 1, length, length, dtype=torch.bool)
        staged[..., :half, half:] = False
        cached = dream.model(ids[:, :half], position_ids=positions[:, :half], use_cache=True).past_key_values
        rest = dream.model(ids[:, half:], position_ids=positions[:, half:], past_key_values=cached).logits
        full = dream.model(ids, attention_mask=staged, position_ids=positions).logits
        torch.testing.assert_close(rest, full[:, half:], rtol=0, atol=1e-5)
    with pytest.raises(UserError, match="ships its own Python code"):
        load_diffusion_lm(dream_folder, implementation="remote", trust_remote_code=False)


def test_dreams_tokenizer_file_never_runs_transformers_own_class_reads_its_vocabulary(dream_folder, tmp_path) -> None:
    """Dream's tokenization_dream.py is transformers' Qwen2Tokenizer renamed: the native load uses that class (no
    --trust-remote-code), and the ids are the byte-level BPE's, worked out by hand below."""
    import shutil

    folder = write_dream_tokenizer(Path(shutil.copytree(dream_folder, tmp_path / "dream")))
    dream = load_diffusion_lm(folder, trust_remote_code=False)
    assert isinstance(dream, DreamNativeBackend) and type(dream.tokenizer).__name__.startswith("Qwen2Tokenizer")
    assert not (folder / "RAN").exists()
    ids = dream.tokenizer("Hi world 12<|mask|>")["input_ids"]
    # pieces: "Hi", " world" (Ġw merged), " ", "1", "2", then the special token whole
    assert ids == [ord("H") - 33, ord("i") - 33, 95, *(ord(c) - 33 for c in "orld"), 94, 16, 17, 97]
    assert dream.tokenizer.decode(ids) == "Hi world 12<|mask|>" and dream.eos_id == 96


def test_the_native_dream_decodes_trains_and_is_batch_invariant(dream_folder, tmp_path: Path) -> None:
    dream = load_diffusion_lm(dream_folder)
    assert_batch_size_invariant(dream)
    for cache in ("none", "dual"):
        assert decode(dream, PROMPTS, cache=cache).completion_ids.shape == (len(PROMPTS), 8)
    record = rl_step(dream_folder, "stabledrl", tmp_path / "dream", gradient_checkpointing=True)
    assert torch.isfinite(torch.tensor(record["loss"])) and record["grad_norm"] > 0


# ----------------------------------------------------------------------------------------------------- SDAR
@pytest.fixture(scope="module")
def sdar_folder(folders, tmp_path_factory) -> Path:
    """An SDAR checkpoint as published (model_type "sdar"), from the tiny weights plus per-head query/key norms (made
    not all 1 here, so that they matter)."""
    folder = save_tiny_as(load_diffusion_lm(folders["tiny"]), "sdar", tmp_path_factory.mktemp("sdar") / "sdar")
    weights = load_file(str(folder / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    for name in [name for name in weights if name.endswith(("q_norm.weight", "k_norm.weight"))]:
        weights[name] = 1 + 0.1 * torch.randn(weights[name].shape, generator=generator)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_the_native_sdar_is_block_diffusion_with_an_exact_cache(sdar_folder, tmp_path: Path) -> None:
    sdar = load_diffusion_lm(sdar_folder)
    assert isinstance(sdar, SDARNativeBackend) and sdar.attention == "block" and sdar.block_size == 4
    assert sdar.supports_kv_cache and not sdar.pad_free
    assert_batch_size_invariant(sdar)
    for temperature in (0.0, 1.0):  # committed blocks are cached exactly: cached decoding equals recomputation
        cached = decode(sdar, PROMPTS, temperature=temperature, use_cache=True).completion_ids
        assert torch.equal(cached, decode(sdar, PROMPTS, temperature=temperature, use_cache=False).completion_ids)
    record = rl_step(sdar_folder, "trado", tmp_path / "sdar", gradient_checkpointing=True)
    assert torch.isfinite(torch.tensor(record["loss"])) and record["grad_norm"] > 0
    with pytest.raises(UserError, match="ships its own Python code"):
        load_diffusion_lm(sdar_folder, implementation="remote", trust_remote_code=False)


def test_weights_that_do_not_fit_the_native_network_are_never_loaded_half_random(folders, tmp_path: Path) -> None:
    """A folder that only claims model_type llada (a missing tensor here) is run by its own code or refused."""
    folder = tmp_path / "partial"
    write_llada_folder(folder, folders["tiny"])
    weights = load_file(str(folder / "model.safetensors"))
    del weights["model.transformer.blocks.1.up_proj.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    lacks = r"partial: config.json does not describe its weights as llada-native \(the weights lack .*1\.up_proj\.\w+\)"
    with pytest.raises(UserError, match=lacks + "; it ships its own Python code"):  # auto: its own code, opt-in
        load_diffusion_lm(folder, trust_remote_code=False)
    with pytest.raises(UserError, match=lacks + "$"):
        load_diffusion_lm(folder, implementation="native")


@pytest.mark.parametrize("which", ["llada", "dream", "sdar"])
def test_a_saved_native_model_is_a_published_folder_again(folders, dream_folder, sdar_folder, tmp_path, which) -> None:
    """A trained policy is saved as its family's folder: it loads natively again, with the same weights."""
    from stabledrl_bench.core.models import save_diffusion_lm as save

    source = {"llada": folders["llada"], "dream": dream_folder, "sdar": sdar_folder}[which]
    dlm = load_diffusion_lm(source)
    save(dlm, tmp_path / "final")
    assert json.loads((tmp_path / "final" / "config.json").read_text())["model_type"].lower() == which
    again = load_diffusion_lm(tmp_path / "final")
    assert type(again) is type(dlm) and again.block_size == dlm.block_size
    for name, tensor in dlm.model.state_dict().items():
        assert torch.equal(tensor, again.model.state_dict()[name]), name


def test_save_tiny_as_names_its_families(folders, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="family must be one of llada, dream, sdar"):
        save_tiny_as(load_diffusion_lm(folders["tiny"]), "olmo", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_check_model_says_which_code_runs_the_network(folders, capsys) -> None:
    from stabledrl_bench.cli import main

    assert main(["check-model", "--model", str(folders["llada"]), "--processes", "2", "--preset", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "family               llada-native" in out and "implementation       native (llada.py" in out
    assert "[fail]" not in out


# ------------------------------------------------------------------------------------------ kept logits
FINAL_NORMS = ("norm", "model.transformer.ln_f", "model.norm")  # the tiny model's, the native LLaDA's, Qwen's


@pytest.mark.parametrize("which", ["tiny", "llada", "dream", "sdar"])
def test_kept_logits_run_the_head_on_the_kept_positions_only(models, dream_folder, sdar_folder, which) -> None:
    """``logits(keep=...)`` is ``logits()[:, keep]``; without gradients the final norm and head see the kept
    positions alone (what decoding and the no-grad likelihood passes ask for), with gradients every position (the
    head's weight gradient sums over positions, and fewer rows would be added up in another order); a shifted
    model's position 0 repeats its own position 0, so a slice from 0 runs the whole head."""
    dlm = {"tiny": models[0], "llada": models[1]}.get(which) or load_diffusion_lm(
        dream_folder if which == "dream" else sdar_folder
    )
    modules = dict(dlm.model.named_modules())
    norm = next(modules[name] for name in FINAL_NORMS if name in modules)
    rows: list[int] = []
    handle = norm.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[1]))
    ids, mask = dlm.encode_prompts(PROMPTS, chat_template=False)
    canvas = torch.cat((ids, torch.full((ids.shape[0], 8), dlm.mask_id)), dim=1)
    attention, length = dlm.context_attention(mask, 8), canvas.shape[1]
    keep = slice(length - 8, length - 4)
    try:
        with torch.no_grad():
            full = dlm.logits(canvas, attention)
            kept = dlm.logits(canvas, attention, keep=keep)
            from_start = dlm.logits(canvas, attention, keep=slice(0, 3))
        assert rows == [length, 4, length if dlm.shift_logits else 3]
        # the same dot products over fewer rows (bitwise on the CPUs `regress` pins; a BLAS may pick another kernel)
        torch.testing.assert_close(kept, full[:, keep], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(from_start, full[:, :3], rtol=1e-6, atol=1e-6)
        with torch.enable_grad():
            assert torch.equal(dlm.logits(canvas, attention, keep=keep), full[:, keep]) and rows[-1] == length
    finally:
        handle.remove()
