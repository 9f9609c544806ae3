"""What one training loop needs to run right on one process, DDP, FSDP2 and DeepSpeed ZeRO-2.

The trainer and SFT are written once; ``accelerate launch --config_file configs/accelerate/<x>.yaml`` picks the
backend. What differs between the backends, and only that, lives here:

* **The processes**: :func:`stabledrl_bench.processes.process_state` (also the CPU rehearsal of an FSDP or
  DeepSpeed launch, which is how CI tests the shipped configs).
* **The accelerator** (:func:`make_accelerator`). ``accelerate launch`` turns a DeepSpeed config's
  ``gradient_accumulation_steps`` (``auto`` in the shipped ones, which ``Accelerator()`` cannot parse) into an
  environment variable; the count the budget implies replaces it. Configurations this harness cannot run
  correctly stop with one line: FSDP1 (its flat parameters are not usable outside its own forward, and it cannot
  run on CPU, so nothing here could test it) and DeepSpeed ZeRO-3 (its partitioned weights are empty outside the
  engine's forward, so the sampler and every probe would see no weights). FSDP2 shards parameters, gradients and
  optimizer state as ZeRO-3 does.
* **DDP's gradients** live in its communication buckets (``gradient_as_bucket_view``): by default DDP keeps the
  gradients and a second copy in the buckets it all-reduces, 4 bytes per parameter more (30 GiB per GPU at 8B). The
  reduced values are the same either way.
* **The DeepSpeed engine** (:func:`configure_deepspeed`): its micro-batch size, accumulation and clipping come from
  the run's budget and recipe (left to ``auto`` it would fail without a dataloader and clip at 1.0).
* **FSDP's wrap unit** (:func:`declare_fsdp_blocks`): the model family's decoder block. A model's own
  ``_no_split_modules`` may name a class it never instantiates (LLaDA's names ``LLaDABlock``, the base class).
* **Activation checkpointing** (:mod:`stabledrl_bench.core.models.checkpointing`): each decoder block is recomputed
  in the backward pass, whatever the model file supports (LLaDA's has no ``gradient_checkpointing_enable``).
* **Rollouts under FSDP** (:class:`UnshardedReplica`): sampling makes a data-dependent number of forward passes
  (early stops, dynamic decoding, pad-free groups), and each pass of a sharded model is a collective that every
  process must join. Rollouts therefore run on a plain replica of the policy, refreshed from the shards once per
  rollout; its weights are the policy's, so nothing changes but the cost (one unsharded copy in the compute dtype).
* **The frozen reference** (:func:`frozen_copy`): on the device in the compute dtype, sharded like the policy
  under FSDP (and then synced from rank 0 with RAM-efficient loading, like the policy). A method that syncs its
  reference with the policy (``sync_ref_model``) mixes shard into shard (:func:`mix_into`).
"""

from __future__ import annotations

import copy
import math
import os

import torch
from torch import nn

from stabledrl_bench.errors import UserError
from stabledrl_bench.processes import cpu_rehearsal, process_state

# Written by ``accelerate launch`` from a DeepSpeed config, where the shipped ones say "auto": the script decides.
_LAUNCH_ENV = ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "ACCELERATE_GRADIENT_CLIPPING")


def make_accelerator(*, grad_accum: int = 1, bf16: bool = False, log_with: list[str] | None = None, project_dir=None):
    """The ``Accelerator`` of a training run: CPU when there is no GPU, one scheduler step per optimizer step.

    Refuses, with one line, the launch configurations this harness cannot run correctly (module docstring).
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    _require_trackers(log_with or [])
    for name in _LAUNCH_ENV:  # the budget and recipe decide these (``auto`` there would not even parse)
        os.environ.pop(name, None)
    rehearsal = cpu_rehearsal()
    process_state()
    precision = "bf16" if bf16 else "no"
    _forget_other_precision(precision)
    acc = Accelerator(
        cpu=not (torch.cuda.is_available() or rehearsal),
        mixed_precision=precision,
        gradient_accumulation_steps=grad_accum,
        step_scheduler_with_optimizer=False,  # the trainer steps its schedule once per optimizer step
        log_with=log_with,
        project_dir=project_dir,
        kwargs_handlers=[DistributedDataParallelKwargs(gradient_as_bucket_view=True)],  # module docstring
    )
    refuse_unsupported(acc)
    return acc


def _forget_other_precision(precision: str) -> None:
    """Let one program train at another precision than its previous run (``reproduce`` at bf16: a float32 SFT warm
    start, then bf16 RL). accelerate keeps one ``AcceleratorState`` per program and refuses a second precision, so
    its state (not the process group, which ``PartialState`` keeps) is dropped and rebuilt from the launch."""
    from accelerate.state import AcceleratorState

    current = AcceleratorState._shared_state.get("_mixed_precision")
    if current is not None and current != precision:
        AcceleratorState._reset_state()


def _require_trackers(names: list[str]) -> None:
    """accelerate skips a tracker that is not installed with a warning; a run asked to log there stops instead."""
    from accelerate.utils import is_tensorboard_available, is_wandb_available

    available = {"tensorboard": is_tensorboard_available, "wandb": is_wandb_available}
    missing = [name for name in names if not available[name]()]
    if missing:
        hint = " or ".join({"tensorboard": "tensorboard (or tensorboardX)", "wandb": "wandb"}[n] for n in missing)
        raise UserError(f"log_with {missing}: not installed; pip install {hint}")


def refuse_unsupported(acc) -> None:
    """One clear line for the launch configurations this harness cannot run correctly (module docstring)."""
    from accelerate.utils import DistributedType

    if acc.distributed_type == DistributedType.FSDP and not acc.is_fsdp2:
        raise UserError(
            "FSDP1 (fsdp_version: 1) is not supported: its flattened parameters cannot run the sampler outside "
            "FSDP's own forward; set fsdp_version: 2, as configs/accelerate/fsdp.yaml does"
        )
    plugin = acc.state.deepspeed_plugin
    if plugin is not None and plugin.zero_stage == 3:
        raise UserError(
            "DeepSpeed ZeRO-3 is not supported: its partitioned weights are empty outside the engine's forward, so "
            "the sampler and the model probes would see no weights; use configs/accelerate/fsdp.yaml (FSDP2 "
            "shards parameters, gradients and optimizer state like ZeRO-3) or ZeRO-2"
        )


def configure_deepspeed(acc, *, micro_batch_rows: int, max_grad_norm: float) -> None:
    """Fill the DeepSpeed engine's batch and clipping settings from the run (no-op without DeepSpeed).

    The engine clips and steps inside ``backward``, so its clipping must be the recipe's ``max_grad_norm``
    (``inf``: never clip, which DeepSpeed spells 0).
    """
    plugin = acc.state.deepspeed_plugin
    if plugin is None:
        return
    plugin.deepspeed_config.update(  # every value: one process may train several runs (reproduce) in turn
        train_micro_batch_size_per_gpu=micro_batch_rows,
        train_batch_size=micro_batch_rows * acc.gradient_accumulation_steps * acc.num_processes,
        gradient_accumulation_steps=acc.gradient_accumulation_steps,
        gradient_clipping=max_grad_norm if math.isfinite(max_grad_norm) else 0.0,
    )


def uses_deepspeed(acc) -> bool:
    return acc.state.deepspeed_plugin is not None


def ram_efficient_loading(acc) -> bool:
    """Whether FSDP loads real weights on rank 0 only and broadcasts them while sharding (the other processes hold
    uninitialised memory until then)."""
    return bool(acc.is_fsdp2 and acc.state.fsdp_plugin.cpu_ram_efficient_loading)


def declare_fsdp_blocks(acc, model: nn.Module, blocks: list[nn.Module]) -> None:
    """Make the decoder blocks FSDP's wrap unit: accelerate wraps the classes named by ``_no_split_modules`` unless
    the launch config names others (``fsdp_transformer_layer_cls_to_wrap``, then those are used).

    accelerate's plugin remembers the classes of the first model it wrapped; one process may train several models
    in turn (``reproduce``: a warm start, then RL), so unless the config named them they are forgotten here.
    """
    model._no_split_modules = sorted({type(block).__name__ for block in blocks})
    if not os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP"):
        acc.state.fsdp_plugin.transformer_cls_names_to_wrap = None


def compute_dtype(acc, model: nn.Module) -> torch.dtype:
    """The dtype the forward passes run in: bf16 under bf16 mixed precision, else the weights' own."""
    return torch.bfloat16 if acc.mixed_precision == "bf16" else next(model.parameters()).dtype


def frozen_copy(acc, model: nn.Module) -> nn.Module:
    """A frozen copy of ``model`` (made before the policy is prepared) for reference-policy estimates.

    FSDP2: sharded like the policy, so it costs 1/N of the weights per process (and, with RAM-efficient loading,
    its weights come from rank 0 like the policy's). Otherwise: on this process's device in the compute dtype.
    """
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    if acc.is_fsdp2:
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        return fsdp2_prepare_model(acc, ref)
    return ref.to(device=acc.device, dtype=compute_dtype(acc, model))


def local_parameters(module: nn.Module) -> tuple[bool, dict[str, torch.Tensor]]:
    """Whether ``module`` is sharded (FSDP2), and this process's part of each of its parameters, by name.

    FSDP2 leaves a root module's parameters unsharded after its forward pass (``reshard_after_forward`` is off for
    the root): they are resharded first, so every process sees its own shard of every parameter, never a mix of
    shards and whole tensors.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    for part in module.modules():
        if isinstance(part, FSDPModule):
            part.reshard()
    params = dict(module.named_parameters())
    sharded = any(isinstance(p, DTensor) for p in params.values())
    return sharded, {name: p.to_local() if isinstance(p, DTensor) else p for name, p in params.items()}


@torch.no_grad()
def mix_into(target: nn.Module, source: nn.Module, alpha: float) -> None:
    """target <- (1 - alpha) target + alpha source, parameter by parameter, in the target's dtype: TRL's
    ``SyncRefModelCallback._sync_target_model`` (``target.mul_(1 - alpha).add_(source, alpha=alpha)``).

    Both hold their parameters the same way (plain on every process, or sharded alike under FSDP2, where each
    process mixes its own shards and no collective is needed), matched by name: a frozen reference and the policy
    it was copied from (:func:`frozen_copy`; ``source`` unwrapped from DDP or DeepSpeed).
    """
    _, theirs = local_parameters(source)
    for name, ours in local_parameters(target)[1].items():
        other = theirs[name]
        if ours.shape != other.shape:
            raise RuntimeError(f"{name}: shapes {tuple(ours.shape)} and {tuple(other.shape)} cannot be mixed")
        ours.mul_(1.0 - alpha).add_(other.to(ours.dtype), alpha=alpha)


class UnshardedReplica:
    """A plain copy of a sharded policy that rollouts run on (module docstring); refresh it after every update.

    Made from the model before it is sharded; :meth:`refresh` gathers every parameter from the shards (one
    all-gather per tensor, the same on every process) into it.
    """

    def __init__(self, acc, model: nn.Module) -> None:
        self.module = copy.deepcopy(model).requires_grad_(False).to(acc.device, dtype=compute_dtype(acc, model))

    @torch.no_grad()
    def refresh(self, sharded: nn.Module) -> nn.Module:
        from torch.distributed.tensor import DTensor

        own = dict(self.module.named_parameters())
        for name, param in sharded.named_parameters():
            full = param.full_tensor() if isinstance(param, DTensor) else param
            own[name].copy_(full)
        return self.module
