"""Opt-in: the same backend checks on the *published* LLaDA, Dream and SDAR modeling files.

Skipped unless ``STABLEDRL_UPSTREAM_DIR`` names a folder holding checkouts of the two public repositories
(their modeling files are not part of this project and are never copied into it)::

    $STABLEDRL_UPSTREAM_DIR/dLLM-RL/   github.com/Gen-Verse/dLLM-RL   (models/llada, models/dream, models/sdar)
    $STABLEDRL_UPSTREAM_DIR/SDAR/      github.com/JetAstra/SDAR       (training/model/SDAR-8B-Chat: its modeling
                                       files, and config.json + model.safetensors.index.json, which
                                       tests/test_native_models.py checks the native SDAR-8B against)
    $STABLEDRL_UPSTREAM_DIR/LLaDA-8B-Instruct/   optional: the Hub's configuration_llada.py and modeling_llada.py

Without the optional Hub folder, LLaDA's Hub variant is made from dLLM-RL's file by its one difference: the Hub
file calls SDPA with ``attn_mask=None``. Each variant becomes a tiny random-weight checkpoint (2 layers, hidden
64, this project's character tokenizer, ``mask_token_id`` in the config) built from the published files as they
are, and goes through ``load_diffusion_lm`` and every check of ``backend_checks``. Run with::

    STABLEDRL_UPSTREAM_DIR=/path/to/upstream python -m pytest tests/test_upstream_models.py -v

The published files run on transformers 4.52-4.53 only, which the ``remote-code`` extra installs
(``pip install -e ".[dev,remote-code]"``); under any other release the module is skipped and says so.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from backend_checks import (
    PROMPTS,
    assert_batch_size_invariant,
    decode,
    evaluation_rows,
    lmeval_outputs,
    rl_step,
    write_dream_tokenizer,
)
from packaging.specifiers import SpecifierSet

from stabledrl_bench.cli import main
from stabledrl_bench.core.masks import block_causal_mask, real_positions
from stabledrl_bench.core.models import build_char_tokenizer, load_diffusion_lm
from stabledrl_bench.core.models.backends import REMOTE_CODE_TRANSFORMERS, DreamBackend, LLaDABackend, SDARBackend
from stabledrl_bench.core.models.kernel_stubs import kernel_stubs
from stabledrl_bench.core.sampling import DecodeSettingsError, FullDecode, generate

ROOT = os.environ.get("STABLEDRL_UPSTREAM_DIR")
pytestmark = [
    pytest.mark.skipif(not ROOT, reason="set STABLEDRL_UPSTREAM_DIR to run on the published modeling files"),
    pytest.mark.skipif(
        transformers.__version__ not in SpecifierSet(REMOTE_CODE_TRANSFORMERS),
        reason=f"the published modeling files run on transformers{REMOTE_CODE_TRANSFORMERS} (the remote-code extra)",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def trusted():
    """Loading the published files runs them: the opt-in ``--trust-remote-code`` gives (launched processes inherit
    it from the environment). Module-wide, before the module's fixtures load anything."""
    from stabledrl_bench.core.models.backends import IMPLEMENTATION_ENV, REMOTE_CODE_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(REMOTE_CODE_ENV, "1")
        patch.setenv(IMPLEMENTATION_ENV, "remote")  # the published files, not the native LLaDA (compared below)
        yield


LLADA_FILES = ("configuration_llada.py", "modeling_llada.py")
VARIANTS = {  # name: (folder under ROOT, files, backend)
    "llada-hub": ("LLaDA-8B-Instruct", LLADA_FILES, LLaDABackend),
    "llada-dllm-rl": ("dLLM-RL/models/llada", LLADA_FILES, LLaDABackend),
    "dream": (
        "dLLM-RL/models/dream",
        ("configuration_dream.py", "modeling_dream.py", "generation_utils.py"),
        DreamBackend,
    ),
    "sdar-chat": (
        "SDAR/training/model/SDAR-8B-Chat",
        ("configuration_sdar.py", "modeling_sdar.py", "fused_linear_diffusion_cross_entropy.py"),
        SDARBackend,
    ),
    "sdar-trado": ("dLLM-RL/models/sdar", ("configuration_sdar.py", "modeling_sdar.py"), SDARBackend),
}
BASELINES = ("grpo", "spg", "espo", "trado", "stabledrl")


def _config(variant: str, tokenizer) -> dict:
    """A 2-layer configuration of each family, with the real checkpoints' structural settings."""
    ids = {
        "mask_token_id": tokenizer.mask_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "vocab_size": len(tokenizer),
    }
    if variant.startswith("llada"):
        llada = "modeling_llada.LLaDAModelLM"
        return {
            "model_type": "llada",
            "architectures": ["LLaDAModelLM"],
            "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": llada},
            "activation_type": "silu",
            "block_type": "llama",
            "d_model": 64,
            "n_heads": 4,
            "n_kv_heads": 4,
            "n_layers": 2,
            "mlp_hidden_size": 128,
            "mlp_ratio": 2,
            "embedding_size": len(tokenizer),
            "max_sequence_length": 512,
            "layer_norm_type": "rms",
            "rms_norm_eps": 1e-5,
            "rope": True,
            "rope_full_precision": True,
            "rope_theta": 10000.0,
            "alibi": False,
            "include_bias": False,
            "include_qkv_bias": False,
            "weight_tying": False,
            "init_device": "cpu",
            "init_fn": "mitchell",
            "init_std": 0.02,
            "flash_attention": False,
            "use_cache": False,
            "block_group_size": 1,
            "attention_dropout": 0.0,
            "residual_dropout": 0.0,
            "embedding_dropout": 0.0,
            "input_emb_norm": False,
            "scale_logits": False,
            "bias_for_layer_norm": False,
            "layer_norm_with_affine": True,
            **ids,
        }
    if variant == "dream":
        return {
            "model_type": "Dream",
            "architectures": ["DreamModel"],
            "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
            "tie_word_embeddings": False,
            **ids,
        }
    return {
        "model_type": "sdar",
        "architectures": ["SDARForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_sdar.SDARConfig",
            "AutoModel": "modeling_sdar.SDARModel",
            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
        },
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "block_size": 4,
        "fuse_cross_entropy": True,
        "use_cache": False,
        "attn_implementation": "sdpa",
        **ids,
    }


def _copy_files(variant: str, out: Path) -> None:
    folder, files, _ = VARIANTS[variant]
    source = Path(ROOT) / folder
    if variant == "llada-hub" and not (source / "modeling_llada.py").is_file():
        source = Path(ROOT) / VARIANTS["llada-dllm-rl"][0]
        text = (source / "modeling_llada.py").read_text()
        assert text.count("attn_mask=attn_mask,") == 1, "dLLM-RL's LLaDA file changed: fetch the Hub file instead"
        (out / "modeling_llada.py").write_text(text.replace("attn_mask=attn_mask,", "attn_mask=None,"))
        files = ("configuration_llada.py",)
    for name in files:
        shutil.copy(source / name, out / name)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    paths = {}
    for variant in VARIANTS:
        out = tmp_path_factory.mktemp(variant)
        _copy_files(variant, out)
        tokenizer = build_char_tokenizer()
        tokenizer.save_pretrained(out)
        (out / "config.json").write_text(json.dumps(_config(variant, tokenizer)))
        with kernel_stubs(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            config = AutoConfig.from_pretrained(out, trust_remote_code=True)
            auto = AutoModelForCausalLM if variant.startswith("sdar") else AutoModel
            auto.from_config(config, trust_remote_code=True).save_pretrained(out)
        paths[variant] = out
    return paths


@pytest.mark.parametrize("variant", VARIANTS)
def test_loads_with_its_backend_and_check_model_passes(checkpoints, variant: str, capsys) -> None:
    dlm = load_diffusion_lm(checkpoints[variant])
    assert type(dlm) is VARIANTS[variant][2] and dlm.mask_id == dlm.tokenizer.mask_token_id
    assert dlm.pad_free == (variant == "llada-hub")
    assert main(["check-model", "--model", str(checkpoints[variant])]) == 0
    assert "[fail]" not in capsys.readouterr().out


@pytest.mark.parametrize("variant", VARIANTS)
def test_results_do_not_depend_on_batch_composition(checkpoints, variant: str) -> None:
    assert_batch_size_invariant(load_diffusion_lm(checkpoints[variant]))


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.startswith("sdar")])
def test_cached_block_decoding_equals_recomputation(checkpoints, variant: str) -> None:
    dlm = load_diffusion_lm(checkpoints[variant])
    for temperature in (0.0, 1.0):
        cached = decode(dlm, PROMPTS, temperature=temperature, use_cache=True)
        plain = decode(dlm, PROMPTS, temperature=temperature, use_cache=False)
        assert torch.equal(cached.completion_ids, plain.completion_ids)


@pytest.mark.parametrize("variant", ["llada-hub", "llada-dllm-rl"])
def test_llada_published_file_takes_no_cache_and_cached_protocols_are_refused(checkpoints, variant: str) -> None:
    """``LLaDAModelLM.forward`` hands its network ``past_key_values=None, use_cache=False``: asked for a cache it
    returns none, so the backend offers no cache mode and ``d1-fast`` / ``d1-fast-prefix`` fail in one line."""
    dlm = load_diffusion_lm(checkpoints[variant])
    ids, _ = dlm.encode_prompts(PROMPTS[:1])
    with torch.no_grad():
        assert dlm.model(input_ids=ids, use_cache=True).past_key_values is None
    assert dlm.full_cache_modes == ()
    for cache in ("prefix", "dual"):
        with pytest.raises(DecodeSettingsError, match=rf"cannot decode with cache='{cache}' \(its cache modes: none\)"):
            generate(dlm, ids, None, FullDecode(max_completion_length=8, block_length=4, steps=4, cache=cache))


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_rl_step_of_every_baseline_evaluation_and_lm_eval_run(checkpoints, variant: str, tmp_path) -> None:
    for baseline in BASELINES:
        record = rl_step(checkpoints[variant], baseline, tmp_path / baseline)
        assert math.isfinite(record["loss"]) and 0 < record["grad_norm"] < math.inf, baseline
    dlm = load_diffusion_lm(checkpoints[variant])
    assert len(evaluation_rows(dlm)) == 3
    texts, scores = lmeval_outputs(dlm)
    assert len(texts) == 2 and all(math.isfinite(score) and score < 0 for score, _ in scores)


def test_the_published_files_behave_as_the_tiny_emulations_say(checkpoints) -> None:
    """What ``stabledrl_bench.core.models.conventions`` emulates, observed on the published files themselves."""
    ids = torch.tensor([[0, 0, 20, 21, 22, 23, 24, 25]])
    padding = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    changed = ids.clone()
    changed[0, -1] = 30
    llada = load_diffusion_lm(checkpoints["llada-dllm-rl"]).model
    with torch.no_grad():  # dLLM-RL's LLaDA: a 2-D mask with padding makes it causal
        before, after = (llada(input_ids=x, attention_mask=padding).logits[0, 2] for x in (ids, changed))
    torch.testing.assert_close(before, after)
    hub = load_diffusion_lm(checkpoints["llada-hub"]).model
    with torch.no_grad():  # the Hub file: a padding bias changes nothing
        bias = torch.zeros(1, 1, 8, 8).masked_fill(~padding.bool()[:, None, None, :], torch.finfo(torch.float32).min)
        torch.testing.assert_close(hub(input_ids=ids, attention_bias=bias).logits, hub(input_ids=ids).logits)
    for variant in ("sdar-chat", "sdar-trado"):
        sdar = load_diffusion_lm(checkpoints[variant]).model
        pattern = block_causal_mask(torch.ones(1, 8, dtype=torch.bool), 8, 4)
        additive = torch.zeros(pattern.shape).masked_fill(~pattern, torch.finfo(torch.float32).min)
        with torch.no_grad():
            right = sdar(input_ids=ids, attention_mask=pattern, position_ids=real_positions(ids >= 0)).logits
            wrong = sdar(input_ids=ids, attention_mask=additive, position_ids=real_positions(ids >= 0)).logits
        assert not torch.allclose(right, wrong)  # an additive bias is misread by both SDAR files
        sdar.train()
        if variant == "sdar-chat":
            with pytest.raises(Exception):  # noqa: B017 - its SFT branch fails in several ways without labels
                sdar(input_ids=ids, attention_mask=pattern, position_ids=real_positions(ids >= 0))
        else:
            assert sdar(input_ids=ids, attention_mask=pattern, position_ids=real_positions(ids >= 0)).logits is None
        sdar.eval()


@pytest.mark.parametrize("variant", ["llada-hub", "llada-dllm-rl", "dream", "sdar-chat", "sdar-trado"])
def test_the_native_implementation_equals_the_published_file(checkpoints, variant: str, tmp_path) -> None:
    """Same weights, same parameter names: logits, decoding, evaluation, lm-eval and an RL step agree."""
    from stabledrl_bench.core.models.backends import NativeBackend

    remote = load_diffusion_lm(checkpoints[variant])
    native = load_diffusion_lm(checkpoints[variant], implementation="native")
    assert isinstance(native, NativeBackend) and not native.pad_free and native.shift_logits == remote.shift_logits
    assert set(native.model.state_dict()) == set(remote.model.state_dict())
    ids, mask = native.encode_prompts(PROMPTS, chat_template=False)
    attention = native.context_attention(mask, 8)
    canvas = torch.cat((ids, torch.full((ids.shape[0], 8), native.mask_id)), dim=1)
    real = torch.cat((mask, torch.ones_like(canvas[:, ids.shape[1] :], dtype=torch.bool)), dim=1)  # pads: no logits
    ours, theirs = native.logits(canvas, attention)[real], remote.logits(canvas, attention)[real]
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    for temperature in (0.0, 1.0):
        ours, theirs = (decode(dlm, PROMPTS, temperature=temperature).completion_ids for dlm in (native, remote))
        assert torch.equal(ours, theirs)
    assert evaluation_rows(native) == evaluation_rows(remote)
    assert lmeval_outputs(native)[0] == lmeval_outputs(remote)[0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STABLEDRL_MODEL_IMPLEMENTATION", "native")
        ours = rl_step(checkpoints[variant], "stabledrl", tmp_path / "native")
    theirs = rl_step(checkpoints[variant], "stabledrl", tmp_path / "remote")
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4, abs=1e-6)
    assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)


def test_dreams_published_tokenizer_equals_the_class_the_native_load_uses(tmp_path) -> None:
    """dLLM-RL's tokenization_dream.py (the Hub's Dream tokenizer) and transformers' Qwen2Tokenizer, which the
    native load uses instead of running that file, give the same ids and text on the same vocabulary files."""
    import importlib.util

    from stabledrl_bench.core.models.backends import NATIVE_TOKENIZERS

    folder = write_dream_tokenizer(tmp_path)
    path = Path(ROOT) / "dLLM-RL/models/dream/tokenization_dream.py"
    spec = importlib.util.spec_from_file_location("tokenization_dream", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    theirs = module.DreamTokenizer.from_pretrained(folder)
    ours = getattr(transformers, NATIVE_TOKENIZERS["DreamTokenizer"]).from_pretrained(folder)
    # the small vocabulary has printable ASCII and the space only
    texts = [*PROMPTS, "Hi world<|mask|><|mask|>", "<|im_start|>user 12+3=?<|im_end|>", "  two  spaces  end", "we'll"]
    for text in texts:
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], text
        assert ours.decode(ours(text)["input_ids"]) == theirs.decode(theirs(text)["input_ids"]), text
    assert (ours.eos_token_id, ours.pad_token_id) == (theirs.eos_token_id, theirs.pad_token_id)


# ------------------------------------------------------------------------------ the shipped launch configs
@pytest.fixture(scope="module")
def published(checkpoints, tmp_path_factory) -> dict[str, str]:
    """The multi-process scenarios' conventions served by the published files (native: the harness's own model)."""
    from multiprocess_scenarios import build_models

    files = {"llada-hub": "llada-hub", "llada": "llada-dllm-rl", "dream": "dream", "sdar-chat": "sdar-chat"}
    files["sdar-trado"] = "sdar-trado"
    native = build_models(tmp_path_factory.mktemp("native"))["native"]
    return {"native": native, **{convention: str(checkpoints[variant]) for convention, variant in files.items()}}


@pytest.fixture(scope="module")
def published_on_one_process(published, tmp_path_factory) -> dict:
    from multiprocess_scenarios import run_on_one_process

    return run_on_one_process(published, tmp_path_factory.mktemp("one-process"))


@pytest.mark.parametrize("config", ["ddp", "fsdp", "deepspeed_zero2"])
def test_every_shipped_config_on_two_processes_equals_one_process(
    config, published, published_on_one_process, tmp_path
):
    """tests/test_multiprocess.py's scenarios (checkpointing on, reference model, dropped groups, pad-free, resume,
    evaluation) on the published files, under each shipped accelerate config on 2 CPU processes."""
    from multiprocess_scenarios import EVALUATIONS, SCENARIOS, assert_same_training, run_launched

    report = run_launched(config, published, tmp_path)
    for scenario in SCENARIOS:
        assert_same_training(report[scenario], published_on_one_process[scenario], scenario)
        assert report[scenario]["processes"][0] == report[scenario]["processes"][1], scenario
    assert report["resume"]["log"] == report["grpo-native"]["log"]
    for evaluation in EVALUATIONS:
        assert report[evaluation] == published_on_one_process[evaluation], evaluation
