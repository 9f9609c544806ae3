"""The models of one RL run, assembled: the policy loaded, wrapped for the launch, and its frozen copies.

The trainer reads rollout -> estimates -> loss -> step; what it trains and scores with is built here once, in an
order that matters:

1. the policy is loaded (on rank 0 only with FSDP's RAM-efficient loading; the others get its weights while
   sharding);
2. its decoder blocks are declared FSDP's wrap unit, then LoRA adapters are added when asked for;
3. the frozen reference (a method's KL term, ``needs_ref``) and the anchor's frozen start (``anchor_beta`` > 0)
   are copied from the policy *before* accelerate wraps it, so they hold the starting weights. They are one module
   unless the method syncs its reference toward the policy, which would drag the anchor along. Under LoRA neither
   is copied: the adapter-free model is the reference, as in TRL;
4. activation checkpointing, the optimizer and its schedule, then ``accelerate.prepare``;
5. the views every pass uses: the wrapped policy for gradient passes, a plain module for rollouts and no-grad
   estimates (under FSDP a replica refreshed every rollout, see :class:`~.distributed.UnshardedReplica`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.core.models.backends import TINY_SPECS, detect_pad_free, load_model_spec
from stabledrl_bench.core.models.checkpointing import enable_activation_checkpointing
from stabledrl_bench.core.models.probes import require_conventions
from stabledrl_bench.errors import UserError
from stabledrl_bench.processes import keyed_generator
from stabledrl_bench.training.config import TRAIN_DTYPES, LoraSettings, TrainConfig
from stabledrl_bench.training.distributed import (
    UnshardedReplica,
    compute_dtype,
    configure_deepspeed,
    declare_fsdp_blocks,
    frozen_copy,
    ram_efficient_loading,
)
from stabledrl_bench.training.optim import build_optimizer, build_scheduler


@dataclass
class RunModels:
    """What an RL run trains and scores with, after ``accelerate.prepare``."""

    train_dlm: DiffusionLM  # the policy as prepared (DDP/FSDP/DeepSpeed-wrapped): every gradient pass
    dlm: DiffusionLM  # the same weights as a plain module: rollouts and no-grad estimates
    ref_dlm: DiffusionLM | None  # the method's frozen reference (None: none needed, or LoRA's adapter-free model)
    anchor_dlm: DiffusionLM | None  # the anchor's frozen start (the reference's module unless that one is synced)
    replica: UnshardedReplica | None  # under FSDP, the plain module ``dlm`` runs on, refreshed every rollout
    optimizer: Any  # as prepared by accelerate
    scheduler: Any


def load_policy(cfg: TrainConfig, acc) -> DiffusionLM:
    """The policy as loaded, not yet wrapped: cheap checks on it (its decoder, its estimator) run before the costly
    preparation."""
    dtype = TRAIN_DTYPES[cfg.dtype]
    return load_model_spec(cfg.model, seed=cfg.seed, dtype=dtype, rank0_weights=ram_efficient_loading(acc))


def prepare_models(
    cfg: TrainConfig, acc, dlm: DiffusionLM, *, reference: bool, anchor: bool, synced_reference: bool
) -> RunModels:
    """Wrap ``dlm`` (from :func:`load_policy`) for this launch and make the frozen copies the run needs.

    ``reference``: the method needs a frozen reference; ``anchor``: the run has an anchor term; ``synced_reference``:
    the reference moves toward the policy during the run, so the anchor needs its own copy of the start.
    """
    model = dlm.model
    blocks = dlm.decoder_blocks() if cfg.gradient_checkpointing or acc.is_fsdp2 else []
    if acc.is_fsdp2:
        declare_fsdp_blocks(acc, model, blocks)
    if cfg.lora is not None:
        model = _apply_lora(model, cfg.lora, seed=cfg.seed)
    ref_model = anchor_model = None
    if (reference or anchor) and cfg.lora is None:
        ref_model = anchor_model = frozen_copy(acc, model)
        if anchor and synced_reference:  # the anchor stays at the start
            anchor_model = frozen_copy(acc, model)
    replica = UnshardedReplica(acc, model) if acc.is_fsdp2 else None
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(blocks)
    model.train()
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.budget.max_steps, cfg.optim)
    rows = cfg.per_device_prompts * cfg.budget.num_generations
    configure_deepspeed(acc, micro_batch_rows=rows, max_grad_norm=cfg.optim.max_grad_norm)
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    train_dlm = dlm.with_model(model)
    train_dlm.compute_dtype = compute_dtype(acc, model)  # its probes judge bf16 by bf16's rounding
    if ram_efficient_loading(acc):  # every process holds rank 0's weights only now
        train_dlm.pad_free = detect_pad_free(train_dlm).pad_free
    if cfg.check_model and cfg.model not in TINY_SPECS:
        # on the prepared model, so every process probes the same way (collectives stay in step)
        require_conventions(train_dlm, cfg.model)
    return RunModels(
        train_dlm=train_dlm,
        dlm=train_dlm.with_model(acc.unwrap_model(model) if replica is None else replica.module),
        ref_dlm=train_dlm.with_model(ref_model) if ref_model is not None else None,
        anchor_dlm=train_dlm.with_model(anchor_model) if anchor_model is not None else None,
        replica=replica,
        optimizer=optimizer,
        scheduler=scheduler,
    )


def _apply_lora(model, lora: LoraSettings, seed: int):
    """The model with LoRA adapters; their random initialisation is drawn from ``seed`` (peft draws from the global
    RNG, so it runs inside a forked RNG state), the same in every process and every run of the seed."""
    from peft import LoraConfig, get_peft_model

    names = {name.split(".")[-1] for name, _ in model.named_modules()}
    targets = [t for t in lora.target_modules if t in names]
    if not targets:
        raise UserError(f"lora.target_modules {lora.target_modules} match no module of this model")
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(keyed_generator(seed, "lora").initial_seed()))
        return get_peft_model(model, config)
