"""The pieces of the multi-process path that one process can check (the launches are in test_multiprocess.py).

Activation checkpointing recomputes each block and changes nothing else; the extra forward passes that keep FSDP
processes in step count zero; the launch configurations the harness cannot run are refused with one line; keyed
random streams depend on their key only.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from conftest import SMALL

from stabledrl_bench.core.estimators import SequenceBatch, SPGBlock
from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.core.models.checkpointing import enable_activation_checkpointing
from stabledrl_bench.core.models.interface import DiffusionLM
from stabledrl_bench.errors import UserError
from stabledrl_bench.processes import keyed_generator
from stabledrl_bench.training.distributed import (
    declare_fsdp_blocks,
    refuse_unsupported,
)


def _batch(dlm, rows: int = 4, length: int = 8, seed: int = 0) -> SequenceBatch:
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(5, 60, (rows, 6), generator=gen)
    prompt_mask = torch.ones(rows, 6, dtype=torch.bool)
    prompt_mask[0, :2] = False  # left padding in one row
    completion = torch.randint(5, 60, (rows, length), generator=gen)
    return SequenceBatch(prompt, prompt_mask, completion, torch.ones(rows, length, dtype=torch.bool))


def _loss_and_grads(dlm: DiffusionLM, batch: SequenceBatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    dlm.model.train()
    dlm.model.zero_grad(set_to_none=True)
    estimator = SPGBlock(num_mc=2, micro_batch_size=3, block_length=4)
    noise = estimator.draw(batch, torch.Generator().manual_seed(1))
    loss = estimator.evaluate(dlm, batch, noise).elbo.sum()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in dlm.model.parameters()]


def test_activation_checkpointing_recomputes_each_block_and_changes_nothing(monkeypatch):
    from stabledrl_bench.core.models.tiny import Block

    calls = []
    original = Block.forward
    monkeypatch.setattr(Block, "forward", lambda self, *a, **k: calls.append(self) or original(self, *a, **k))
    plain = build_tiny(**SMALL, seed=2)
    checkpointed = build_tiny(**SMALL, seed=2)
    enable_activation_checkpointing(checkpointed.decoder_blocks())
    batch = _batch(plain)
    loss_a, grads_a = _loss_and_grads(plain, batch)
    plain_calls = len(calls)
    loss_b, grads_b = _loss_and_grads(checkpointed, batch)
    assert len(calls) - plain_calls == 2 * plain_calls  # every block forward ran again in the backward pass
    assert torch.equal(loss_a, loss_b)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(grads_a, grads_b, strict=True))
    calls.clear()
    with torch.no_grad():  # without gradients nothing is recomputed
        checkpointed.logits(batch.prompt_ids)
    assert len(calls) == SMALL["num_hidden_layers"]


def test_activation_checkpointing_survives_a_deep_copy():
    """A copy of a checkpointed model (a frozen reference, a rollout replica) runs its own weights."""
    dlm = build_tiny(**SMALL, seed=2)
    enable_activation_checkpointing(dlm.decoder_blocks())
    twin = copy.deepcopy(dlm.model)
    with torch.no_grad():
        for param in twin.parameters():
            param.mul_(0.5)
    ids = torch.randint(5, 60, (2, 10))
    mine = dlm.logits(ids)
    theirs = dlm.with_model(twin).logits(ids)
    assert not torch.allclose(mine, theirs)


def test_extra_passes_that_keep_fsdp_processes_in_step_count_zero(monkeypatch):
    """Under FSDP a process with fewer chunks or pad-free groups repeats one (agreed_passes); result and gradient
    stay those of its own passes."""
    dlm = build_tiny(**SMALL, seed=4)
    dlm.pad_free = True  # one pass per amount of left padding: a data-dependent count
    batch = _batch(dlm)
    loss_a, grads_a = _loss_and_grads(dlm, batch)
    passes = []
    monkeypatch.setattr(DiffusionLM, "agreed_passes", lambda self, count: passes.append(count) or count + 2)
    loss_b, grads_b = _loss_and_grads(dlm, batch)
    assert passes  # both loops asked
    assert torch.equal(loss_a, loss_b)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(grads_a, grads_b, strict=True))


def test_fsdp_wraps_the_family_blocks():
    dlm = build_tiny(**SMALL)
    dlm.model._no_split_modules = ["LLaDABlock"]  # as LLaDA's file declares: a base class it never instantiates
    plugin = SimpleNamespace(transformer_cls_names_to_wrap=["DreamDecoderLayer"])  # left by an earlier model
    declare_fsdp_blocks(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)), dlm.model, dlm.decoder_blocks())
    assert dlm.model._no_split_modules == ["Block"] and plugin.transformer_cls_names_to_wrap is None


def test_a_model_without_the_family_blocks_is_one_clear_error():
    dlm = build_tiny(**SMALL)
    dlm.block_classes = ("LLaDALlamaBlock",)
    with pytest.raises(UserError, match=r"no decoder block of the tiny family's classes \['LLaDALlamaBlock'\]"):
        dlm.decoder_blocks()


def _acc(distributed: str, fsdp2: bool = True, zero_stage: int | None = None):
    from accelerate.utils import DistributedType

    plugin = None if zero_stage is None else SimpleNamespace(zero_stage=zero_stage)
    return SimpleNamespace(
        distributed_type=DistributedType[distributed], is_fsdp2=fsdp2, state=SimpleNamespace(deepspeed_plugin=plugin)
    )


def test_the_configs_the_harness_cannot_run_are_refused_with_one_line():
    with pytest.raises(UserError, match=r"FSDP1 .* set fsdp_version: 2"):
        refuse_unsupported(_acc("FSDP", fsdp2=False))
    with pytest.raises(UserError, match=r"ZeRO-3 is not supported.*configs/accelerate/fsdp\.yaml"):
        refuse_unsupported(_acc("DEEPSPEED", zero_stage=3))
    for ok in (_acc("FSDP"), _acc("DEEPSPEED", zero_stage=2), _acc("MULTI_GPU"), _acc("NO")):
        refuse_unsupported(ok)


def test_keyed_streams_depend_on_their_key_only():
    draw = lambda *key: torch.rand(4, generator=keyed_generator(*key))  # noqa: E731
    assert torch.equal(draw(0, "rollout", 3, 1), draw(0, "rollout", 3, 1))
    different = [draw(0, "rollout", 3, 2), draw(0, "mask", 3, 1), draw(1, "rollout", 3, 1), draw(0, "rollout", 4, 1)]
    assert all(not torch.equal(draw(0, "rollout", 3, 1), other) for other in different)
