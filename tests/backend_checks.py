"""Checks every model backend must pass, shared by the convention tests (tiny model emulating each published
family, run in CI) and the opt-in tests on the published modeling files themselves.

Each check runs the harness's own code path (samplers, estimators, trainer, evaluator, lm-eval adapter) on a
loaded :class:`DiffusionLM`. Where a reference model is given (the native tiny model with the same weights),
results must equal the reference's; otherwise the checks that need no reference still apply: padding and
batch composition change nothing, cached decoding equals recomputation, train mode gives logits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
from conftest import TREE_OF_FOUR

from stabledrl_bench.core.budget import Budget
from stabledrl_bench.core.estimators import SequenceBatch, build_estimator
from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.core.sampling import block_diffusion_generate, llada_generate
from stabledrl_bench.evaluation.lmeval_adapter import DiffusionEvalLM
from stabledrl_bench.evaluation.native import evaluate
from stabledrl_bench.tasks.base import GradeResult, RewardResult
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.optim import OptimConfig
from stabledrl_bench.training.runlog import read_log
from stabledrl_bench.training.trainer import RLTrainer

PROMPTS = ["3+4=", "12 + 30 =", "a", "solve: 7*6 and 5*5 =", "10-1", "list: 1, 2, 3, 4, 5", "x y", "the sum is"]
FULL_ESTIMATORS = {
    "d1_one_step": {},
    "spg_block": {"num_mc": 2, "block_length": 4},
    "espo_elbo": {"num_mc": 2},
    "trace_replay": {},
    "denoise_pair": {"num_mc": 2},
    "stratified_elbo": {"num_mc": 2},
    "trace_sample": {"num_mc": 2},
    "ar_replay": {},
}
BLOCK_ESTIMATORS = {"staircase_elbo": {"num_mc": 2}, "trace_replay": {}, "trace_sample": {"num_mc": 2}, "ar_replay": {}}


def encode(dlm: DiffusionLM, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    return dlm.encode_prompts(prompts, chat_template=False)


def decode(
    dlm: DiffusionLM,
    prompts: list[str],
    *,
    temperature: float = 0.0,
    use_cache: bool = True,
    seed: int = 0,
    cache: str = "none",
):
    """Completions of 8 tokens: LLaDA's sampler (2 blocks of 4; ``cache``: its approximate KV cache) or block
    diffusion (2 steps per block; ``use_cache``: the exact cache of committed blocks)."""
    ids, mask = encode(dlm, prompts)
    generator = torch.Generator().manual_seed(seed)
    if dlm.attention == "full":
        return llada_generate(
            dlm,
            ids,
            mask,
            max_completion_length=8,
            block_length=4,
            steps=8,
            temperature=temperature,
            generator=generator,
            cache=cache,
        )
    return block_diffusion_generate(
        dlm,
        ids,
        mask,
        max_completion_length=8,
        steps_per_block=2,
        temperature=temperature,
        use_cache=use_cache,
        generator=generator,
    )


def estimators_for(dlm: DiffusionLM) -> dict[str, dict]:
    return BLOCK_ESTIMATORS if dlm.attention == "block" else FULL_ESTIMATORS


def sequence_batch(dlm: DiffusionLM, prompts: list[str]) -> SequenceBatch:
    """Prompts with sampled completions (temperature 1, so every estimator sees a varied trajectory)."""
    out = decode(dlm, prompts, temperature=1.0, seed=1)
    ids, mask = encode(dlm, prompts)
    return SequenceBatch(ids, mask, out.completion_ids, dlm.completion_mask(out.completion_ids), out.unmask_step)


def estimates(dlm: DiffusionLM, batch: SequenceBatch, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """Every estimator the baselines use on this kind of model, with noise drawn from ``seed``."""
    results = {}
    for name, kwargs in estimators_for(dlm).items():
        estimator = build_estimator(name, **kwargs).bind(dlm)
        noise = estimator.draw(batch, torch.Generator().manual_seed(seed))
        with torch.no_grad():
            estimate = estimator.evaluate(dlm, batch, noise)
        results[name] = {k: v for k, v in estimate.__dict__.items() if isinstance(v, torch.Tensor)}
    return results


def row(batch: SequenceBatch, i: int) -> SequenceBatch:
    """Row i of a batch as a batch of one, with its left padding removed."""
    keep = batch.prompt_mask[i]
    step = None if batch.unmask_step is None else batch.unmask_step[i : i + 1]
    return SequenceBatch(
        batch.prompt_ids[i : i + 1, keep],
        batch.prompt_mask[i : i + 1, keep],
        batch.completion_ids[i : i + 1],
        batch.completion_mask[i : i + 1],
        step,
    )


def assert_batch_size_invariant(dlm: DiffusionLM) -> None:
    """Decoding 8 prompts of different lengths one at a time or all together gives the same completions
    (greedy), and every estimator gives each row the same estimate alone as in the batch (same masks)."""
    together = decode(dlm, PROMPTS).completion_ids
    for i, prompt in enumerate(PROMPTS):
        alone = decode(dlm, [prompt]).completion_ids
        assert torch.equal(alone[0], together[i]), f"prompt {i} decodes differently alone"
    batch = sequence_batch(dlm, PROMPTS)
    for name, kwargs in estimators_for(dlm).items():
        estimator = build_estimator(name, **kwargs).bind(dlm)
        noise = estimator.draw(batch, torch.Generator().manual_seed(0))
        with torch.no_grad():
            full = estimator.evaluate(dlm, batch, noise)
        for i in range(len(PROMPTS)):
            one = row(batch, i)
            with torch.no_grad():
                single = estimator.evaluate(dlm, one, _noise_row(noise, i, batch.prompt_mask[i]))
            _assert_row_equal(name, full, single, i)


def _noise_row(noise, i: int, prompt_keep: torch.Tensor):
    """The part of ``noise`` that belongs to row i (prompt dimensions unpadded)."""
    fields = {}
    for key, value in noise.__dict__.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and key != "kappa":
            value = value[i : i + 1]
            if key == "prompt_masked":
                value = value[..., prompt_keep]
        fields[key] = value
    return type(noise)(**fields)


def _assert_row_equal(name: str, full, single, i: int) -> None:
    for key in ("elbo", "eubo"):
        if getattr(full, key) is not None:
            torch.testing.assert_close(getattr(single, key)[0], getattr(full, key)[i], msg=f"{name}.{key} row {i}")
    if full.token_logp is not None:
        rows = torch.arange(full.token_logp.shape[0]) if full.row_to_seq is None else full.row_to_seq
        picked = full.token_logp[rows == i]
        torch.testing.assert_close(single.token_logp, picked, msg=f"{name}.token_logp row {i}")


def _digit_share(text: str, doc: dict, profile: str = "") -> RewardResult:
    """A reward random weights already earn unevenly, so every group has non-zero advantages."""
    del doc, profile
    return RewardResult(sum(c.isdigit() for c in text) / max(1, len(text)), {})


def _some_digits(text: str, doc: dict) -> GradeResult:
    """ "Correct" for an even sum of character codes: groups of mixed accuracy, which TraDo keeps."""
    correct = sum(map(ord, text)) % 2 == 0
    return GradeResult(correct=correct, score=float(correct), extracted=None)


def rl_step(
    model: str | Path, baseline: str, out: Path, reward: Callable[..., RewardResult] = _digit_share, **overrides
) -> dict:
    """One rollout + optimizer step of ``baseline`` from a checkpoint folder; returns the logged record.

    The reward is the share of digits in the completion (see :func:`_digit_share`; ``reward(text, doc)`` another
    one), so the loss and gradient are not trivially zero.
    """
    budget = Budget(
        max_steps=1,
        prompts_per_step=2,
        num_generations=4,
        num_iterations=1,
        max_completion_length=8,
        diffusion_steps=4,
        block_length=4,
        temperature=1.0,
        max_prompt_length=48,
    )
    if baseline == "trado":  # on an 8-token canvas TraDo's overlong rule (>= canvas - 5) would mark every answer wrong
        overrides.setdefault("baseline_options", {"overlong_margin": None})
    if baseline == "egspo":  # EGSPO chooses K of the sampler's steps: 2 of these 4
        overrides.setdefault("baseline_options", {"logps_eval_num_steps": 2})
    if baseline == "mdpo":  # so does MDPO
        overrides.setdefault("baseline_options", {"sample_train_steps": 2})
    if baseline == "dtreerpo":  # its 4 completions per prompt are the leaves of a tree
        overrides.setdefault("baseline_options", TREE_OF_FOUR)
    cfg = TrainConfig(
        baseline=baseline,
        task="gsm8k" if baseline == "igpo" else "sudoku",  # IGPO's hints need worked solutions: GSM8K's answers
        model=str(model),
        protocol="tiny",
        budget=budget,
        optim=OptimConfig(learning_rate=1e-3, max_grad_norm=1.0),
        output_dir=str(out),
        progress=False,
        **overrides,
    )
    with mock.patch("stabledrl_bench.training.trainer.plot_curves"):  # the curves PNG (2 s) is tested elsewhere
        trainer = RLTrainer(cfg)
        trainer.task.reward_many = lambda texts, docs, profile: list(map(reward, texts, docs))
        trainer.task.grade_many = lambda texts, docs: list(map(_some_digits, texts, docs))
        trainer.train()
    return read_log(out / "log.jsonl")[-1]


def protocol_for(dlm: DiffusionLM) -> str:
    return "tiny" if dlm.attention == "full" else "tiny-static"


def evaluation_rows(dlm: DiffusionLM) -> list[dict]:
    """Native evaluation of three Sudoku puzzles at 8 tokens, two per batch."""
    return evaluate(
        dlm, "sudoku", protocol=protocol_for(dlm), max_completion_length=8, limit=3, batch_size=2, progress=False
    ).samples


def lmeval_outputs(dlm: DiffusionLM) -> tuple[list[str], list[tuple[float, bool]]]:
    """The lm-eval adapter's generate_until and loglikelihood on two requests each."""

    class Request:
        def __init__(self, *args):
            self.args = args

    lm = DiffusionEvalLM(pretrained=dlm, protocol=protocol_for(dlm), max_completion_length=8, mc_num=4)
    texts = lm.generate_until([Request("3+4=", {"until": ["\n"]}), Request("12 + 30 =", {})], disable_tqdm=True)
    scores = lm.loglikelihood([Request("3+4=", "7"), Request("12 + 30 =", " 42")], disable_tqdm=True)
    return texts, scores


def write_dream_tokenizer(folder: Path) -> Path:
    """Dream's published tokenizer files in small: a byte-level BPE vocabulary of printable ASCII (space is "Ġ"),
    one merge, Dream's special tokens, and ``tokenizer_config.json`` naming ``tokenization_dream.DreamTokenizer``,
    here a canary that records it was imported."""
    for stale in ("tokenizer.json", "special_tokens_map.json"):
        (folder / stale).unlink(missing_ok=True)
    vocab = {chr(code): code - 33 for code in range(33, 127)} | {"Ġ": 94, "Ġw": 95}
    special = {"<|endoftext|>": 96, "<|mask|>": 97, "<|im_start|>": 98, "<|im_end|>": 99}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\nĠ w\n")
    (folder / "tokenization_dream.py").write_text(f"open({str(folder / 'RAN')!r}, 'w').write('ran')\n")
    added = {
        str(i): {
            "content": t,
            "special": True,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for t, i in special.items()
    }
    config = {
        "tokenizer_class": "DreamTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": 131072,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
