"""Every backend against every published family's calling convention, emulated by the tiny model.

A checkpoint of each convention (``TinyDLMConfig.convention``: LLaDA's Hub file, dLLM-RL's LLaDA, Dream,
SDAR-8B-Chat, TraDo's SDAR) is saved with the same weights as a native tiny checkpoint and loaded through
``load_diffusion_lm``, which picks the family's backend. A backend is right exactly when everything the harness
computes through it -- logits on padded batches, both samplers, every estimator, an RL step of every baseline,
native evaluation, the lm-eval adapter -- equals what the native backend computes from the same weights.
"""

from __future__ import annotations

import math
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
)
from conftest import BUILTIN_BASELINES

from stabledrl_bench.cli import main
from stabledrl_bench.core.baseline import BASELINES as REGISTERED
from stabledrl_bench.core.masks import block_causal_mask, real_positions
from stabledrl_bench.core.models import build_tiny, load_diffusion_lm, save_diffusion_lm
from stabledrl_bench.core.models.backends import DreamBackend, LLaDABackend, SDARBackend, TinyBackend
from stabledrl_bench.errors import UserError

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
EMULATED = {
    "llada-hub": LLaDABackend,
    "llada": LLaDABackend,
    "dream": DreamBackend,
    "sdar-chat": SDARBackend,
    "sdar-trado": SDARBackend,
}
BASELINES = tuple(name for name in BUILTIN_BASELINES if not name.startswith("stabledrl_"))  # not the ablations
# their rollouts record the LLaDA sampler's predictions (EGSPO, MDPO) or resume it from a partial state (d-TreeRPO's
# tree, IGPO's hinted canvas)
FULL_ONLY = {"egspo", "mdpo", "dtreerpo", "igpo"}


def baselines_for(attention: str) -> tuple[str, ...]:
    return tuple(name for name in BASELINES if attention == "full" or name not in FULL_ONLY)


def attention_of(convention: str) -> str:
    return "block" if convention.startswith("sdar") else "full"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """One folder per convention plus the native full and block references, all with the same weights."""
    paths = {}
    for convention in (*EMULATED, "native-full", "native-block", "broken"):
        if convention.startswith("native"):
            attention, emulate = convention.removeprefix("native-"), "native"
        else:
            attention, emulate = attention_of(convention), convention
        dlm = build_tiny(attention=attention, block_size=4, seed=3, convention=emulate, **SMALL)
        path = tmp_path_factory.mktemp(convention)
        save_diffusion_lm(dlm, path)
        paths[convention] = path
    return paths


def load(checkpoints, convention: str):
    return load_diffusion_lm(checkpoints[convention])


def native(checkpoints, convention: str):
    return load(checkpoints, f"native-{attention_of(convention)}")


@pytest.mark.parametrize("convention", EMULATED)
def test_each_convention_loads_with_its_family_backend(checkpoints, convention: str) -> None:
    dlm = load(checkpoints, convention)
    assert type(dlm) is EMULATED[convention]
    assert dlm.pad_free == (convention == "llada-hub")  # the Hub file ignores masks: detected at load
    assert (dlm.attention, dlm.block_size) == (("block", 4) if attention_of(convention) == "block" else ("full", None))
    assert type(native(checkpoints, convention)) is TinyBackend


@pytest.mark.parametrize("convention", EMULATED)
def test_logits_on_padded_batches_equal_the_native_backend(checkpoints, convention: str) -> None:
    dlm, ref = load(checkpoints, convention), native(checkpoints, convention)
    ids, mask = dlm.encode_prompts(PROMPTS[:4], chat_template=False)
    if dlm.attention == "block":
        pattern = block_causal_mask(mask, ids.shape[1], 4)
        got, want = dlm.logits(ids, pattern, real_positions(mask)), ref.logits(ids, pattern, real_positions(mask))
    else:
        got, want = dlm.logits(ids, mask), ref.logits(ids, mask)
    # Every real position but each row's first token (which nothing predicts; a shifted model reads it off a pad).
    predicted = mask & torch.cat((torch.zeros_like(mask[:, :1]), mask[:, :-1]), dim=1)
    torch.testing.assert_close(got[predicted], want[predicted])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("convention", EMULATED)
def test_decoding_equals_the_native_backend(checkpoints, convention: str, temperature: float) -> None:
    dlm, ref = load(checkpoints, convention), native(checkpoints, convention)
    for use_cache in (True, False) if dlm.attention == "block" else (True,):
        got = decode(dlm, PROMPTS, temperature=temperature, use_cache=use_cache)
        want = decode(ref, PROMPTS, temperature=temperature, use_cache=use_cache)
        assert torch.equal(got.completion_ids, want.completion_ids)
        assert torch.equal(got.unmask_step, want.unmask_step) and got.nfe == want.nfe


@pytest.mark.parametrize("convention", EMULATED)
def test_every_estimator_equals_the_native_backend(checkpoints, convention: str) -> None:
    dlm, ref = load(checkpoints, convention), native(checkpoints, convention)
    batch = sequence_batch(ref, PROMPTS[:5])
    got, want = estimates(dlm, batch), estimates(ref, batch)
    assert set(got) == set(want)
    for name in want:
        for key in want[name]:
            torch.testing.assert_close(got[name][key], want[name][key], msg=f"{name}.{key}")


@pytest.mark.parametrize("convention", [*EMULATED, "native-full", "native-block"])
def test_results_do_not_depend_on_batch_composition(checkpoints, convention: str) -> None:
    assert_batch_size_invariant(load(checkpoints, convention))


@pytest.fixture(scope="module")
def native_steps(checkpoints, tmp_path_factory) -> dict[tuple[str, str], dict]:
    """One RL step of every baseline from each native checkpoint: the reference for every convention."""
    out = tmp_path_factory.mktemp("native-steps")
    return {
        (attention, baseline): rl_step(checkpoints[f"native-{attention}"], baseline, out / f"{attention}-{baseline}")
        for attention in ("full", "block")
        for baseline in baselines_for(attention)
    }


@pytest.mark.parametrize("convention", EMULATED)
def test_an_rl_step_of_every_baseline_equals_the_native_backend(
    checkpoints, native_steps, convention: str, tmp_path
) -> None:
    assert set(BASELINES) <= set(REGISTERED.entries())
    for baseline in baselines_for(attention_of(convention)):
        got = rl_step(checkpoints[convention], baseline, tmp_path / baseline)
        want = native_steps[(attention_of(convention), baseline)]
        assert got["grad_norm"] > 0 and math.isfinite(got["loss"]), baseline
        assert set(got) == set(want)
        for key, value in want.items():
            if key != "seconds":
                assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (baseline, key)


@pytest.mark.parametrize("convention", EMULATED)
def test_native_evaluation_and_lm_eval_equal_the_native_backend(checkpoints, convention: str) -> None:
    dlm, ref = load(checkpoints, convention), native(checkpoints, convention)
    fields = ("doc_id", "completion", "correct", "score")
    assert [[r[f] for f in fields] for r in evaluation_rows(dlm)] == [
        [r[f] for f in fields] for r in evaluation_rows(ref)
    ]
    (texts, scores), (ref_texts, ref_scores) = lmeval_outputs(dlm), lmeval_outputs(ref)
    assert texts == ref_texts
    for (score, greedy), (ref_score, ref_greedy) in zip(scores, ref_scores, strict=True):
        assert score == pytest.approx(ref_score, rel=1e-4) and greedy == ref_greedy


@pytest.mark.parametrize("convention", EMULATED)
def test_check_model_passes_on_every_convention(checkpoints, convention: str, capsys) -> None:
    assert main(["check-model", "--model", str(checkpoints[convention])]) == 0
    out = capsys.readouterr().out
    assert "[fail]" not in out and "padding invariance" in out
    if attention_of(convention) == "block":
        assert "[pass] KV cache = recomputation" in out and "[pass] no leakage between blocks" in out


def test_check_model_fails_clearly_on_a_model_whose_2d_mask_turns_causal(checkpoints, capsys) -> None:
    assert main(["check-model", "--model", str(checkpoints["broken"])]) == 2
    captured = capsys.readouterr()
    assert "[fail] bidirectional attention" in captured.out and "[fail] padding invariance" in captured.out
    assert captured.err.strip().splitlines() == [
        "error: check-model: 2 convention(s) failed: padding invariance, bidirectional attention"
    ]


def test_training_refuses_a_broken_model_unless_told_to_skip_the_check(checkpoints, tmp_path) -> None:
    with pytest.raises(UserError, match=r"breaks a convention.*bidirectional attention.*--skip-model-check"):
        rl_step(checkpoints["broken"], "grpo", tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    assert math.isfinite(rl_step(checkpoints["broken"], "grpo", tmp_path / "forced", check_model=False)["loss"])


def test_the_native_tiny_model_is_exempt_from_the_probes_and_nothing_else_is(checkpoints, monkeypatch) -> None:
    """A weakly trained native tiny model can fail a probe by being near uniform; its convention is this package's
    own code, so the probes are skipped for it, and only for it."""
    from stabledrl_bench.core.models import probes

    failing = probes.Probe("logit alignment", status="fail", measured="near uniform", meaning="")
    monkeypatch.setattr(probes, "run_probes", lambda dlm, train=True: [failing])
    probes.require_conventions(native(checkpoints, "llada"), "native tiny")
    with pytest.raises(UserError, match="logit alignment: near uniform"):
        probes.require_conventions(load(checkpoints, "llada"), "emulated llada")


def test_sdar_train_mode_is_served_by_the_inference_branches(checkpoints) -> None:
    """SDAR's train-mode forward computes an SFT loss (SDAR-8B-Chat) or no logits (TraDo's copy); the backend
    runs the inference branches, so the trainer gets logits with gradients, equal to eval mode's."""
    for convention in ("sdar-chat", "sdar-trado"):
        dlm = load(checkpoints, convention)
        ids, mask = dlm.encode_prompts(PROMPTS[:2], chat_template=False)
        pattern, positions = block_causal_mask(mask, ids.shape[1], 4), real_positions(mask)
        with torch.no_grad():
            expected = dlm.logits(ids, pattern, positions)
        dlm.model.train()
        logits = dlm.logits(ids, pattern, positions)
        logits.sum().backward()
        torch.testing.assert_close(logits.detach(), expected)
        assert dlm.model.lm_head.weight.grad is not None
        dlm.model.train()  # called raw in train mode, the model gives no logits
        if convention == "sdar-chat":
            with pytest.raises(AttributeError):
                dlm.model(input_ids=ids, attention_mask=pattern, position_ids=positions)
        else:
            assert dlm.model(input_ids=ids, attention_mask=pattern, position_ids=positions).logits is None
