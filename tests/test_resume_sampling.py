"""Resuming the LLaDA sampler from a partial state (docs/rollouts.md#resuming-a-decode).

What d-TreeRPO's rollout trees and IGPO's hint injection rely on: a snapshot taken before step s and resumed with
the snapshot's random stream is bitwise the uninterrupted run, any other stream gives an independent continuation,
and a run that asks for neither computes exactly what it computed before. The tiny model runs in float64 as in
tests/test_sampling.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_sampling import _gen, _prompts, _tiny, ref_llada

from stabledrl_bench.core.sampling import BlockDecode, DecodeState, FullDecode, generate, llada_generate
from stabledrl_bench.errors import UserError

# 3 blocks of 4 tokens, 3 steps each: steps 0, 3, 6 start a block, 4 is mid-block, 8 is the last step
SETTINGS = {"max_completion_length": 12, "block_length": 4, "steps": 9}
AT = (0, 3, 4, 8)
MODES = [
    {"temperature": 0.0},
    {"temperature": 1.5},
    {"temperature": 0.0, "remasking": "random"},
    {"temperature": 0.7, "remasking": "random"},
    {"temperature": 1.0, "cfg_scale": 0.5},
]


@pytest.fixture(scope="module")
def model():
    return _tiny("full")


def _decode(model, **kwargs):
    """The tiny model's decode of the test prompts under SETTINGS; the generator is seeded 5 unless given."""
    ids, mask = _prompts(model)
    kwargs.setdefault("generator", _gen(5))
    return llada_generate(model, ids, mask, **SETTINGS, **kwargs)


def _same(a, b) -> bool:
    return torch.equal(a.sequences, b.sequences) and torch.equal(a.unmask_step, b.unmask_step)


@pytest.mark.parametrize("mode", MODES)
def test_resuming_a_snapshot_is_the_uninterrupted_run(model, mode):
    full = _decode(model, **mode)
    snapped = _decode(model, snapshots=AT, **mode)
    assert _same(snapped, full) and snapped.nfe == full.nfe, "taking snapshots changes nothing the run computes"
    assert sorted(snapped.states) == list(AT)
    per_step = full.nfe // SETTINGS["steps"]
    for step, state in snapped.states.items():
        assert state.step == step and bool((state.unmask_step < step).all())
        resumed = _decode(model, start=state, generator=state.generator(), **mode)
        assert _same(resumed, full), f"resumed at step {step}"
        assert resumed.nfe == per_step * (SETTINGS["steps"] - step), "nfe counts the remaining forwards"
        assert resumed.states == {}


def test_snapshot_is_the_state_an_observer_sees(model):
    seen: dict[int, torch.Tensor] = {}
    out = _decode(model, temperature=1.0, snapshots=AT, observer=lambda s: seen.setdefault(s.index, s.state.clone()))
    for step, state in out.states.items():
        assert torch.equal(state.sequences, seen[step])


def test_continuations_from_one_state_are_independent(model):
    state = _decode(model, temperature=1.5, snapshots=(2,)).states[2]
    before = (state.sequences.clone(), state.unmask_step.clone(), state.rng_state.clone())
    branches = [_decode(model, start=state, generator=_gen(100 + k), temperature=1.5) for k in range(2)]
    assert not torch.equal(branches[0].sequences, branches[1].sequences)
    for k, branch in enumerate(branches):
        again = _decode(model, start=state, generator=_gen(100 + k), temperature=1.5)
        assert _same(branch, again), "a continuation is a function of the state and its generator"
        committed = state.unmask_step >= 0
        assert torch.equal(branch.unmask_step[committed], state.unmask_step[committed]), "commits are kept"
    assert all(
        torch.equal(x, y) for x, y in zip(before, (state.sequences, state.unmask_step, state.rng_state), strict=True)
    )


def test_a_state_nests_branch_snapshots(model):
    """A tree: branch at step 2, snapshot the branch at step 5, resume that: still the branch's own run."""
    state = _decode(model, temperature=1.5, snapshots=(2,)).states[2]
    branch = _decode(model, start=state, generator=_gen(7), temperature=1.5, snapshots=(5,))
    inner = branch.states[5]
    assert _same(_decode(model, start=inner, generator=inner.generator(), temperature=1.5), branch)


@pytest.mark.parametrize("mode", [MODES[0], MODES[3]])
def test_plain_run_is_the_reference_sampler(model, mode):
    """No snapshot and no start: the loop reference of tests/test_sampling.py (untouched by resuming) and the
    dispatcher give the same tokens and steps, bitwise."""
    ids, mask = _prompts(model)
    out = _decode(model, **mode)
    seq, steps_of = ref_llada(model, ids, mask, generator=_gen(5), **SETTINGS, **mode)
    assert torch.equal(out.sequences, seq) and torch.equal(out.unmask_step, steps_of)
    via_generate = generate(model, ids, mask, FullDecode(**SETTINGS, **mode), _gen(5))
    assert _same(via_generate, out) and via_generate.nfe == out.nfe == SETTINGS["steps"]
    assert out.states == {}


def _bad(state: DecodeState, **changes) -> DecodeState:
    return dataclasses.replace(state, **changes)


def test_bad_states_are_refused(model):
    state = _decode(model, generator=None, snapshots=(4,)).states[4]
    prompt_len = _prompts(model)[0].shape[1]
    cases = [
        (_bad(state, sequences=state.sequences[:, :-1]), "sequences is"),
        (_bad(state, unmask_step=state.unmask_step[:2]), "unmask_step is"),
        (_bad(state, unmask_step=state.unmask_step.int()), "unmask_step is"),
        (_bad(state, step=SETTINGS["steps"]), r"in \[0, 9\)"),
        (_bad(state, step=-1), r"in \[0, 9\)"),
        (_bad(state, step=2), "at or after its step"),
    ]
    changed = state.sequences.clone()
    changed[0, prompt_len - 1] = (changed[0, prompt_len - 1] + 1) % model.vocab_size
    cases.append((_bad(state, sequences=changed), "different prompt"))
    for bad, message in cases:
        with pytest.raises(UserError, match=message):
            _decode(model, start=bad)
    with pytest.raises(UserError, match=r"in \[0, 9\)"):
        _decode(model, generator=None, snapshots=(9,))


@pytest.mark.parametrize("change", [{"cache": "dual"}, {"strategy": "dynamic"}, {"stop_at_eos": True}])
def test_approximate_modes_are_refused(model, change):
    state = _decode(model, generator=None, snapshots=(4,)).states[4]
    ids, mask = _prompts(model)
    settings = dataclasses.replace(FullDecode(**SETTINGS), **change)
    for kwargs in ({"start": state}, {"snapshots": (4,)}):
        with pytest.raises(UserError, match="needs exact decoding"):
            generate(model, ids, mask, settings, **kwargs)


def test_block_models_are_refused():
    block = _tiny("block")
    ids, mask = _prompts(block)
    state = DecodeState(torch.zeros(1), torch.zeros(1), 0, None)
    for kwargs in ({"start": state}, {"snapshots": (1,)}):
        with pytest.raises(UserError, match="needs the full-attention"):
            generate(block, ids, mask, BlockDecode(max_completion_length=8, steps=4), **kwargs)


def test_an_edited_state_keeps_its_hint(model):
    """IGPO's use: tokens written into the canvas of a state (unmask_step -1) stay, and the rest is decoded."""
    state = _decode(model, generator=None, snapshots=(3,)).states[3]
    canvas = state.sequences.clone()
    hint = canvas.shape[1] - 2  # in the last block, which no step has reached yet
    canvas[:, hint] = 7
    out = _decode(model, generator=None, start=dataclasses.replace(state, sequences=canvas))
    assert bool((out.sequences[:, hint] == 7).all()) and bool((out.unmask_step[:, -2] == -1).all())
    assert not bool((out.completion_ids == model.mask_id).any())
    # the block's 3 masked positions over its 3 steps (6, 7, 8): one each, LLaDA's schedule of the masked count
    # (with the quota of a full block, 2, 1, 1, step 8 would commit nothing)
    assert out.unmask_step[:, -4:].sort(dim=1).values.tolist() == [[-1, 6, 7, 8]] * out.unmask_step.shape[0]
