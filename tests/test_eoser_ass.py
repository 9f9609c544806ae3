"""CJ-GRPO's EOSER-ASS sampler (``yjyddq/EOSER-ASS-RL`` at ``5affb4e``, ``cj-grpo/cj_grpo_trainer_eoser_ass.py``):
the ascending schedule and the EOS factors against hand values and a transcription of the official schedule; the
sampler against a slow loop written here; EOS committed later with the rule on constructed logits; the ``eoser_ass``
rollout, CJ-GRPO's replay of its variable quota and one CJ-GRPO step on the tiny model.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from conftest import small_budget
from test_egspo import _config
from test_sampling import NEG_INF, _gen, _pick, _prompts, _proposals, _row_logits_full, _tiny, ref_llada

from stabledrl_bench.config import read_recipe
from stabledrl_bench.core.baseline import build_baseline
from stabledrl_bench.core.estimators import SequenceBatch, TraceReplay, replay_rounds
from stabledrl_bench.core.rollouts import ROLLOUTS, EoserAss, Independent
from stabledrl_bench.core.sampling import (
    RECORD_FIELDS,
    BlockDecode,
    DecodeSettingsError,
    FullDecode,
    ascending_schedule,
    eos_factors,
    generate,
    llada_generate,
    recorded_decode,
)
from stabledrl_bench.errors import UserError
from stabledrl_bench.training.trainer import RLTrainer


@pytest.fixture(scope="module")
def model():
    return _tiny("full")


def _ascending(length: int, **rules) -> FullDecode:
    """One block of ``length`` tokens in floor(log2 length) steps, under the ascending schedule."""
    steps = length.bit_length() - 1
    return FullDecode(max_completion_length=length, block_length=length, steps=steps, schedule="ascending", **rules)


# ------------------------------------------------------------------------------------------------- the schedule
def _official_quotas(gen_length: int, steps: int) -> list[int]:
    """``get_block_sizes`` with ``block_num`` 1 (lines 347-364) and ``get_num_transfer_tokens_ass`` (531-556) for one
    row, transcribed: one block of the whole canvas, 2^i tokens at step i, the block's rest at the last step."""
    s = int(math.log2(gen_length))
    assert s == steps
    block_sizes = [gen_length]
    quotas = [0] * steps
    for i in range(steps):
        if i == steps - 1:
            quotas[i] = block_sizes[-1] - (2**i - 1)
        else:
            quotas[i] = 2**i
    return quotas


def test_ascending_schedule_hand_values() -> None:
    # 256 = 2^8: 1 + 2 + ... + 64 = 127 tokens in the first 7 steps, the other 129 at the last
    assert ascending_schedule(256, 8) == [1, 2, 4, 8, 16, 32, 64, 129]
    assert ascending_schedule(128, 7) == [1, 2, 4, 8, 16, 32, 65]
    assert ascending_schedule(40, 5) == [1, 2, 4, 8, 25]  # not a power of two: the last step takes the rest
    assert ascending_schedule(3, 1) == [3]


@pytest.mark.parametrize("length", [2, 3, 16, 40, 100, 255, 256, 512, 1000])
def test_ascending_schedule_is_the_official_one(length: int) -> None:
    steps = length.bit_length() - 1
    assert ascending_schedule(length, steps) == _official_quotas(length, steps)
    assert sum(ascending_schedule(length, steps)) == length


def test_eos_factor_hand_values() -> None:
    # ascending (ass_sampling): t = (2^(i+1) - 1) / 2^S; S = 3: t = 1/8, 3/8, 7/8, fac = 0.01 + 0.99 t
    got = eos_factors(_ascending(8, eos_min_gamma=0.01))
    assert got == pytest.approx([0.01 + 0.99 / 8, 0.01 + 0.99 * 3 / 8, 0.01 + 0.99 * 7 / 8], abs=1e-15)
    # 256 tokens: the last factor is 0.01 + 0.99 * 255/256, not 1
    assert eos_factors(_ascending(256, eos_min_gamma=0.01))[-1] == pytest.approx(0.01 + 0.99 * 255 / 256, abs=1e-15)
    # linear (sampling), one block: t = i / (S - 1); S = 5, min 0.4: 0.4, 0.55, 0.7, 0.85, 1
    one_block = FullDecode(max_completion_length=10, block_length=10, steps=5, eos_min_gamma=0.4)
    assert eos_factors(one_block) == pytest.approx([0.4, 0.55, 0.7, 0.85, 1.0], abs=1e-15)
    # linear, two blocks of 2 steps: i is the step within its block over S - 1 = 3 (eoser_generate), so 0, 1/3, 0, 1/3
    two_blocks = FullDecode(max_completion_length=8, block_length=4, steps=4, eos_min_gamma=0.0, eos_max_gamma=3.0)
    assert eos_factors(two_blocks) == pytest.approx([0.0, 1.0, 0.0, 1.0], abs=1e-15)
    # one step: the official code takes the max factor; no rule: None
    assert eos_factors(FullDecode(max_completion_length=4, block_length=4, steps=1, eos_min_gamma=0.2)) == [1.0]
    assert eos_factors(FullDecode()) is None and eos_factors(_ascending(16)) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_completion_length": 16, "block_length": 8, "steps": 4, "schedule": "ascending"}, "one block"),
        ({"max_completion_length": 16, "block_length": 16, "steps": 8, "schedule": "ascending"}, r"log2 16\) = 4"),
        ({"max_completion_length": 16, "block_length": 16, "steps": 4, "schedule": "cosine"}, "schedule must be"),
        (
            {
                "max_completion_length": 16,
                "block_length": 16,
                "steps": 4,
                "schedule": "ascending",
                "strategy": "dynamic",
            },
            "strategy='static'",
        ),
        ({"eos_min_gamma": 0.5, "remasking": "random"}, "low_confidence"),
        ({"eos_min_gamma": -0.1}, ">= 0"),
        ({"eos_max_gamma": float("inf")}, "finite"),
    ],
)
def test_settings_are_checked(kwargs: dict, message: str) -> None:
    with pytest.raises(DecodeSettingsError, match=message) as info:
        FullDecode(**kwargs)
    assert "\n" not in str(info.value)


def test_records_name_the_rules_only_when_set() -> None:
    """Records of every other decode keep their fields (byte-identical); a rule set is recorded and reads back."""
    assert list(FullDecode().to_dict()) == list(RECORD_FIELDS)
    assert list(BlockDecode().to_dict()) == list(RECORD_FIELDS)
    settings = _ascending(16, eos_min_gamma=0.01)
    record = settings.to_dict()
    assert list(record) == [*RECORD_FIELDS, "schedule", "eos_min_gamma"]  # eos_max_gamma is at its usual 1
    assert recorded_decode(record, "full") == settings
    assert recorded_decode(FullDecode().to_dict(), "full") == FullDecode()


# ------------------------------------------------------------------------------------------------- the sampler
def ref_eoser_ass(model, ids, valid, settings: FullDecode, generator=None):
    """``reversed_process`` (lines 392-493) with ``ass_sampling`` (329-345) for one block, one row and one position
    at a time: ``x0`` by Gumbel-max (the sampler's order of draws, [B, L, V] per step; LLaDA's exp(l) / (-log u)^tau),
    confidence softmax(l)[x0] (MASK excluded) times the step's factor where x0 is EOS, the step's top-k committed."""
    batch, plen = ids.shape
    length, steps, tau = settings.max_completion_length, settings.steps, settings.temperature
    low, high = settings.eos_min_gamma, settings.eos_max_gamma
    rows = [ids[r].tolist() + [model.mask_id] * length for r in range(batch)]
    keys = [valid[r].tolist() + [True] * length for r in range(batch)]
    steps_of = [[-1] * length for _ in range(batch)]
    quotas = [2**i for i in range(steps - 1)] + [length - (2 ** (steps - 1) - 1)]
    for i in range(steps):
        fac = low + (high - low) * (2 ** (i + 1) - 1) / 2**steps if steps > 1 else high
        u = None
        if tau > 0:
            u = torch.rand((batch, length, model.vocab_size), generator=generator, dtype=torch.float64)
        for r in range(batch):
            row_logits = _row_logits_full(model, rows[r], keys[r], plen, valid[r], 0.0)
            proposal = _proposals(model, rows[r], row_logits, plen, length, tau, None if u is None else u[r])
            candidates = [(p * (fac if t == model.eos_id else 1.0), pos) for pos, (t, p) in proposal.items()]
            for pos in _pick(candidates, quotas[i]):
                rows[r][pos] = proposal[pos][0]
                steps_of[r][pos - plen] = i
    return torch.tensor(rows), torch.tensor(steps_of)


@pytest.mark.parametrize(
    ("temperature", "rules"),
    [(0.0, {}), (0.0, {"eos_min_gamma": 0.01}), (1.0, {"eos_min_gamma": 0.01}), (1.0, {"eos_min_gamma": 0.3})],
)
def test_sampler_matches_the_slow_loop(model, temperature: float, rules: dict) -> None:
    ids, mask = _prompts(model)
    settings = dataclasses.replace(_ascending(16, **rules), temperature=temperature)
    out = generate(model, ids, mask, settings, generator=_gen(3))
    seqs, steps = ref_eoser_ass(model, ids, mask, settings, generator=_gen(3))
    assert torch.equal(out.sequences, seqs) and torch.equal(out.unmask_step, steps)
    assert out.nfe == 4
    per_step = torch.stack([(out.unmask_step == i).sum(dim=1) for i in range(4)], dim=1)
    assert per_step.tolist() == [[1, 2, 4, 9]] * ids.shape[0]


class _Constant:
    """Logits that never depend on the input: at completion position k the top token (5 + k; EOS at the last
    position) has probability ``TOP_PROBS[k]``, the rest is spread evenly over the other tokens but MASK (never
    drawn). Put in place of a tiny model's ``logits``."""

    TOP_PROBS = (0.5, 0.45, 0.4, 0.9)  # the last position is confident about EOS

    def __init__(self, dlm) -> None:
        self.dlm = dlm

    def __call__(self, input_ids, attention_mask=None, position_ids=None, keep=None):
        del attention_mask, position_ids
        dlm, vocab = self.dlm, self.dlm.vocab_size
        length = len(self.TOP_PROBS)
        logits = torch.full((input_ids.shape[1], vocab), 0.0, dtype=torch.float64)
        for k, p in enumerate(self.TOP_PROBS):
            top = dlm.eos_id if k == length - 1 else 5 + k
            rest = (1 - p) / (vocab - 2)  # over every token but the top one and MASK
            logits[input_ids.shape[1] - length + k] = math.log(rest)
            logits[input_ids.shape[1] - length + k, top] = math.log(p)
        logits[:, dlm.mask_id] = NEG_INF
        return logits.expand(input_ids.shape[0], -1, -1)[:, keep]


@pytest.mark.parametrize(
    ("settings", "plain", "with_rule"),
    [
        # one token per step: alone, EOS (0.9) goes first; with factors 0.1, 0.4, 0.7, 1 its confidence is 0.09,
        # 0.36, 0.63: below 0.5 and 0.45 at steps 0 and 1, above 0.4 at step 2
        (FullDecode(max_completion_length=4, block_length=4, steps=4), [1, 2, 3, 0], [0, 1, 3, 2]),
        # ascending, quotas 1 and 3: factor 0.1 + 0.9 / 4 = 0.325 at step 0, so 0.2925 < 0.5 and EOS waits
        (_ascending(4), [1, 1, 1, 0], [0, 1, 1, 1]),
    ],
)
def test_eos_is_committed_later_with_the_rule(settings: FullDecode, plain: list, with_rule: list) -> None:
    dlm = copy.copy(_tiny("full"))
    dlm.logits = _Constant(dlm)
    ids, mask = _prompts(dlm, ["hi"])
    out = generate(dlm, ids, mask, settings)
    ruled = generate(dlm, ids, mask, dataclasses.replace(settings, eos_min_gamma=0.1))
    assert out.unmask_step[0].tolist() == plain and ruled.unmask_step[0].tolist() == with_rule
    assert torch.equal(out.completion_ids, ruled.completion_ids)  # the same tokens, in another order
    assert int(out.completion_ids[0, -1]) == dlm.eos_id


def test_a_run_without_the_rules_is_llada_s(model) -> None:
    """With the rules at their defaults (linear schedule, both factors 1) the sampler is LLaDA's, the slow loop of
    tests/test_sampling.py (regress's samplers cases pin the plain runs bitwise)."""
    ids, mask = _prompts(model)
    plain = {"max_completion_length": 12, "block_length": 4, "steps": 6, "temperature": 1.0}
    rules = {"schedule": "linear", "eos_min_gamma": 1.0, "eos_max_gamma": 1.0}
    out = llada_generate(model, ids, mask, generator=_gen(1), **plain, **rules)
    seqs, steps = ref_llada(model, ids, mask, generator=_gen(1), **plain)
    assert torch.equal(out.sequences, seqs) and torch.equal(out.unmask_step, steps)


@pytest.mark.parametrize("at", [1, 3])
def test_resuming_an_ascending_decode(model, at: int) -> None:
    ids, mask = _prompts(model)
    settings = dataclasses.replace(_ascending(16, eos_min_gamma=0.01), temperature=1.0)
    full = generate(model, ids, mask, settings, generator=_gen(2), snapshots=[at])
    state = full.states[at]
    resumed = generate(model, ids, mask, settings, generator=state.generator(), start=state)
    assert torch.equal(resumed.sequences, full.sequences) and torch.equal(resumed.unmask_step, full.unmask_step)
    assert resumed.nfe == 4 - at


# ------------------------------------------------------------------------------------------------- the rollout
def test_rollout_scheme_and_cj_grpo_options() -> None:
    assert ROLLOUTS.get("eoser_ass") is EoserAss
    assert EoserAss() == EoserAss(schedule="ascending", eos_min_gamma=0.01, eos_max_gamma=1.0)  # train.yaml 74-75
    assert build_baseline("cj_grpo").rollout() == Independent()  # decoding: semi-ar (train.yaml line 76)
    assert build_baseline("cj_grpo", decoding="eoser-ass").rollout() == EoserAss()
    assert build_baseline("cj_grpo", decoding="ass").rollout() == EoserAss(eos_min_gamma=1.0)
    eoser = build_baseline("cj_grpo", decoding="eoser", eos_min_gamma=0.4).rollout()
    assert eoser == EoserAss(schedule="linear", eos_min_gamma=0.4)
    with pytest.raises(UserError, match="decoding must be one of"):
        build_baseline("cj_grpo", decoding="semi-AR")


def test_rollout_refuses_what_it_cannot_decode() -> None:
    scheme = EoserAss()
    with pytest.raises(UserError, match=r"eoser_ass rollout: .*one block"):
        scheme.check(FullDecode(max_completion_length=16, block_length=8, steps=4))
    with pytest.raises(UserError, match=r"eoser_ass rollout: .*= 4 steps, got steps=8"):
        scheme.check(FullDecode(max_completion_length=16, block_length=16, steps=8))
    with pytest.raises(UserError, match="full-attention"):
        scheme.check(BlockDecode(max_completion_length=16, block_length=4, steps=8))
    scheme.check(FullDecode(max_completion_length=16, block_length=16, steps=4))
    linear = EoserAss(schedule="linear")  # EOSER alone: any number of steps, one block
    linear.check(FullDecode(max_completion_length=16, block_length=16, steps=8))
    with pytest.raises(UserError, match=r"eoser_ass rollout: .*one block: block_length must be .*16\), got 8"):
        linear.check(FullDecode(max_completion_length=16, block_length=8, steps=8))


def test_cj_grpo_replays_every_ascending_step(model) -> None:
    """The replay takes the state before each of the S steps, its targets the step's 2^i tokens (the official
    ``reversed_traj_unmask_positions``): S rows per completion, the quota's tokens in each."""
    ids, mask = _prompts(model)
    settings = dataclasses.replace(_ascending(16), temperature=1.0)
    rollout = EoserAss().sample(model, ids, mask, settings, _gen(4))
    every = torch.ones_like(rollout.completion_ids, dtype=torch.bool)
    batch = SequenceBatch(ids, mask, rollout.completion_ids, every, unmask_step=rollout.unmask_step)
    plan = TraceReplay(shrink=1, post_num=None).plan(model, batch)
    rows = ids.shape[0]
    rounds = replay_rounds(plan.row_to_seq)
    assert plan.row_to_seq.tolist() == [r for r in range(rows) for _ in range(4)]
    assert rounds.tolist() == [0, 1, 2, 3] * rows
    assert plan.targets.sum(dim=1).tolist() == [1, 2, 4, 9] * rows
    # the state before round s: every token committed at step >= s masked
    assert torch.equal(plan.masked, rollout.unmask_step[plan.row_to_seq] >= rounds[:, None])


def test_cj_grpo_steps_with_eoser_ass(tmp_path) -> None:
    """The trainer draws CJ-GRPO's rollouts with the scheme (a 16-token canvas in 4 steps of 1, 2, 4 and 9 tokens)
    and takes its optimizer steps on their replay; a budget the scheme cannot decode stops the run before any
    rollout."""
    budget = small_budget(block_length=16, diffusion_steps=4)
    cfg = _config(tmp_path, "full", budget, baseline="cj_grpo", baseline_options={"decoding": "eoser-ass"})
    trainer = RLTrainer(cfg)
    assert trainer.scheme == EoserAss()
    sampled = []
    sample = trainer.sample_rollout

    def recording():
        out = sample()
        sampled.extend(out)
        return out

    trainer.sample_rollout = recording
    records = list(trainer.run_phase())
    assert len(records) == budget.num_iterations and all(math.isfinite(r["loss"]) for r in records)
    steps = torch.cat([s.batch.unmask_step for s in sampled])
    per_step = torch.stack([(steps == i).sum(dim=1) for i in range(4)], dim=1)
    assert per_step.tolist() == [[1, 2, 4, 9]] * budget.prompts_per_step * budget.num_generations
    assert records[0]["rollout_nfe"] == 4 * len(sampled)  # 4 forwards per row, summed over micro-batches
    with pytest.raises(UserError, match="eoser_ass rollout"):
        RLTrainer(dataclasses.replace(cfg, budget=small_budget(block_length=8)))


def test_the_recipe_decodes_as_run_sh() -> None:
    """configs/recipes/cj_grpo: decoding eoser-ass (run.sh line 37) on train.yaml's 256 tokens as one block in
    log2(256) = 8 steps, which the scheme accepts."""
    recipe = read_recipe("cj_grpo/_base.yaml")
    scheme = build_baseline(recipe["baseline"], **recipe["baseline_options"]).rollout()
    budget = recipe["budget"]
    settings = FullDecode(
        max_completion_length=budget["max_completion_length"],
        block_length=budget["block_length"],
        steps=budget["diffusion_steps"],
        temperature=budget["temperature"],
    )
    assert scheme == EoserAss() and scheme.decode(settings) == _ascending(256, eos_min_gamma=0.01, temperature=1.0)
