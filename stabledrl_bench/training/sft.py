"""Masked-diffusion SFT (LLaDA's supervised objective): the warm start before RL.

d1 is SFT followed by RL; the tiny model needs SFT even more, since it starts from random weights. The loss is
LLaDA's: mask each response token with probability p = (1 - eps) t + eps, t ~ U(0, 1) per sequence, and
minimise the 1/p-weighted cross-entropy of the masked tokens, normalised by the response length. Responses are
padded with EOS to the fixed canvas, so the model learns to end its answer and fill the rest with EOS, which
is exactly what LLaDA-Instruct does at inference.

For block-diffusion models the same objective runs on the staircase input [prompt | clean | noisy] with one t
per block (BD3-LM / SDAR training), so each block is learned given the clean earlier blocks.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.config import (
    NOT_IDENTITY,
    deep_merge,
    from_dict,
    read_mapping,
    require_positive,
    stable_hash,
    to_dict,
)
from stabledrl_bench.core.masks import staircase_mask, staircase_position_ids
from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.core.models.backends import load_model_spec
from stabledrl_bench.errors import UserError, on_interrupt, require_folder
from stabledrl_bench.processes import require_shared_folder
from stabledrl_bench.reporting.curves import plot_curves
from stabledrl_bench.tasks import get_task
from stabledrl_bench.training.checkpoint import (
    exclusive,
    export_model,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint_state,
    rerun_note,
    save_checkpoint,
)
from stabledrl_bench.training.data import PromptStream, training_docs
from stabledrl_bench.training.distributed import configure_deepspeed, declare_fsdp_blocks, make_accelerator
from stabledrl_bench.training.optim import OptimConfig, build_optimizer, build_scheduler
from stabledrl_bench.training.runlog import RunLog, read_log


@dataclass
class SFTConfig:
    task: str = "countdown"
    model: str = "tiny"
    protocol: str = "tiny"
    train_split: str = "generated"
    generator_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"num_numbers": [3]}
    max_steps: int = 400
    batch_size: int = 64
    max_completion_length: int = 32  # the canvas; targets are padded with EOS to this length
    # If set, each step's canvas is drawn uniformly from [min_completion_length, max_completion_length] instead. Why: a
    # task whose answers all have one length, always padded to one canvas, teaches the model the EOS count too,
    # and it then garbles the answer's end on any other canvas (LLaDA's SFT data varies in length, so it does not).
    min_completion_length: int | None = None
    max_prompt_length: int = 256
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(
            learning_rate=2e-3, weight_decay=0.01, lr_scheduler_type="cosine", warmup_steps=20, max_grad_norm=1.0
        )
    )
    seed: int = 0
    bf16: bool = False
    output_dir: str = "runs/sft"
    save_every: int = 200  # steps between checkpoints (an interrupted run resumes from the last); 0 = none
    progress: bool = True

    def __post_init__(self) -> None:
        if self.save_every < 0:
            raise UserError(f"save_every must be >= 0 (0 = no checkpoints), got {self.save_every}")
        require_positive(
            max_steps=self.max_steps,
            batch_size=self.batch_size,
            max_completion_length=self.max_completion_length,
            max_prompt_length=self.max_prompt_length,
        )
        low = self.min_completion_length
        if low is not None and not 1 <= low <= self.max_completion_length:
            raise UserError(
                f"min_completion_length must be between 1 and max_completion_length={self.max_completion_length}, "
                f"got {low}"
            )

    @classmethod
    def from_file(cls, path: str | Path, **overrides) -> SFTConfig:
        """A YAML/JSON config with ``overrides`` merged in key by key."""
        return cls.from_mapping(deep_merge(read_mapping(path), overrides), where=str(path))

    @classmethod
    def from_mapping(cls, data: dict[str, Any], where: str = "config") -> SFTConfig:
        return from_dict(cls, data, where=where)


def _resume(acc, cfg: SFTConfig, stream: PromptStream, generator: torch.Generator) -> tuple[int, int]:
    """Restore the latest checkpoint of ``cfg.output_dir`` in place; returns (steps done, truncated targets so far).

    A checkpoint of other settings is an error naming the folder, never silently overwritten or mixed in.
    """
    path = latest_checkpoint(cfg.output_dir)
    if path is None:
        return 0, 0
    state = read_checkpoint_state(path)
    if state.get("config_hash") != _identity_hash(cfg):
        raise UserError(f"{cfg.output_dir} holds checkpoints of an SFT run with other settings; use another folder")
    load_checkpoint(acc, path)
    stream.load_state_dict(state["prompts"])
    generator.set_state(state["generator"])  # every process draws the same masks (same shapes, same seed)
    print(f"sft: resuming {cfg.task} at step {state['step']} of {cfg.max_steps} ({path})")
    return int(state["step"]), int(state["truncated"])


def encode_targets(dlm: DiffusionLM, texts: list[str], length: int) -> tuple[torch.Tensor, int]:
    """Target completions + EOS, EOS-padded to ``length``; also returns how many had to be truncated."""
    rows, truncated = [], 0
    for text in texts:
        ids = dlm.tokenizer(text, add_special_tokens=False)["input_ids"] + [dlm.eos_id]
        if len(ids) > length:
            truncated += 1
            ids = ids[:length]
        rows.append(ids + [dlm.eos_id] * (length - len(ids)))
    return torch.tensor(rows, dtype=torch.long, device=dlm.device), truncated


def sft_loss(
    dlm: DiffusionLM,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    target_ids: torch.Tensor,
    generator: torch.Generator,
    eps: float = 1e-3,
    *,
    rows: tuple[int, int] | None = None,
) -> torch.Tensor:
    """LLaDA SFT loss: sum over masked response tokens of CE / p, divided by (batch * response length).

    ``rows=(first, total)``: the noise is drawn for ``total`` rows (a step's whole batch, alike on every process)
    and rows ``first ..`` of it are this batch's, so N processes that each take a contiguous share compute what one
    process computes for the whole batch.
    """
    batch, length = target_ids.shape
    first, total = rows or (0, batch)
    mine = slice(first, first + batch)
    if dlm.attention == "block":
        n_blocks = -(-length // dlm.block_size)
        t = torch.rand(total, n_blocks, generator=generator)[mine].repeat_interleave(dlm.block_size, dim=1)
        t = t[:, :length]
    else:
        t = torch.rand(total, 1, generator=generator)[mine].expand(batch, length)
    p_mask = ((1 - eps) * t + eps).to(target_ids.device)
    masked = torch.rand(total, length, generator=generator)[mine].to(target_ids.device) < p_mask
    noisy = torch.where(masked, torch.full_like(target_ids, dlm.mask_id), target_ids)
    if dlm.attention == "block":
        ids = torch.cat((prompt_ids, target_ids, noisy), dim=1)
        logits = dlm.logits(
            ids,
            attention_mask=staircase_mask(prompt_mask, length, dlm.block_size),
            position_ids=staircase_position_ids(prompt_mask, length),
        )[:, -length:]
    else:
        ids = torch.cat((prompt_ids, noisy), dim=1)
        key_valid = torch.cat((prompt_mask, torch.ones_like(masked)), dim=1)
        logits = dlm.logits(ids, attention_mask=key_valid)[:, -length:]
    ce = F.cross_entropy(logits.float().transpose(1, 2), target_ids, reduction="none")
    return (ce * masked / p_mask).sum() / (batch * length)


def _identity_hash(cfg: SFTConfig) -> str:
    """What a checkpoint must share with the run resuming it (where it goes, how often it saves: not that)."""
    return stable_hash({k: v for k, v in to_dict(cfg).items() if k not in NOT_IDENTITY})


def run_sft(cfg: SFTConfig) -> Path:
    """Train and save ``output_dir/final`` (a model folder loadable by ``load_diffusion_lm``).

    Every ``save_every`` steps a checkpoint stores the model, optimizer, scheduler, data position and random
    generator; a run started on a folder holding a checkpoint of the same settings continues from it and ends
    with the same weights as an uninterrupted run. The output folder is locked meanwhile: a second run into it
    refuses.
    """
    require_folder(cfg.output_dir, "output_dir")
    task = get_task(cfg.task)
    acc = make_accelerator(bf16=cfg.bf16)
    require_shared_folder(cfg.output_dir, "output_dir")

    def rerun() -> str:
        return rerun_note(cfg.output_dir, f"SFT on {cfg.task} ({cfg.output_dir})", cfg.max_steps, cfg.save_every)

    with (
        on_interrupt(rerun),
        exclusive(cfg.output_dir, "SFT run") if acc.is_main_process else contextlib.nullcontext(),
    ):
        return _run_sft(cfg, task, acc)


def _run_sft(cfg: SFTConfig, task, acc) -> Path:
    if cfg.batch_size % acc.num_processes:
        raise UserError(f"SFT batch_size={cfg.batch_size} must split evenly over {acc.num_processes} processes")
    share = cfg.batch_size // acc.num_processes
    dlm = load_model_spec(cfg.model, seed=cfg.seed)
    model = dlm.model.train()
    if acc.is_fsdp2:
        declare_fsdp_blocks(acc, model, dlm.decoder_blocks())
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.max_steps, cfg.optim)
    configure_deepspeed(acc, micro_batch_rows=share, max_grad_norm=cfg.optim.max_grad_norm)
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    train_dlm = dlm.with_model(model)
    docs = training_docs(task, cfg.train_split, seed=cfg.seed, generator_options=cfg.generator_options)
    stream = PromptStream(docs, seed=cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    out_dir = Path(cfg.output_dir)
    main = acc.is_main_process
    first, truncated_total = _resume(acc, cfg, stream, generator)
    log = RunLog(out_dir / "log.jsonl", resume_step=first if first else None, enabled=main)
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        info = {"config": to_dict(cfg), "model": dlm.config_summary()}
        atomic_write_text(out_dir / "run.json", json.dumps(info, indent=2))
    bar = tqdm(
        range(first, cfg.max_steps),
        initial=first,
        total=cfg.max_steps,
        desc=f"sft:{cfg.task}",
        disable=not (main and cfg.progress),
        dynamic_ncols=True,
    )
    first_row = acc.process_index * share
    for step in bar:
        start = time.perf_counter()
        chunk = stream.next(cfg.batch_size)[first_row : first_row + share]
        specs = [task.prompt(doc, cfg.protocol) for doc in chunk]
        prompt_ids, prompt_mask = dlm.encode_prompts(
            [s.messages for s in specs],
            chat_template=specs[0].chat_template,
            prefill=specs[0].prefill,
            max_prompt_length=cfg.max_prompt_length,
        )
        canvas = cfg.max_completion_length
        if cfg.min_completion_length is not None:
            canvas = int(
                torch.randint(cfg.min_completion_length, cfg.max_completion_length + 1, (1,), generator=generator)
            )
        targets, truncated = encode_targets(dlm, [task.target_completion(doc, cfg.protocol) for doc in chunk], canvas)
        truncated_total += truncated
        with acc.autocast():
            loss = sft_loss(train_dlm, prompt_ids, prompt_mask, targets, generator, rows=(first_row, cfg.batch_size))
        mean_loss = float(acc.reduce(loss.detach(), "mean"))  # the whole batch's, as one process computes it
        if not math.isfinite(mean_loss):  # every process sees the same value, so all of them stop
            raise UserError(f"SFT on {cfg.task}: non-finite loss at step {step + 1}; lower the learning rate")
        acc.backward(loss)
        norm = acc.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
        grad_norm = math.nan if norm is None else float(norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        log.write(
            {
                "step": step + 1,
                "loss": mean_loss,
                "grad_norm": grad_norm,
                "learning_rate": scheduler.get_last_lr()[0],
                "seconds": time.perf_counter() - start,
            }
        )
        bar.set_postfix(loss=f"{mean_loss:.3f}")
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.max_steps:
            state = {"step": step + 1, "config_hash": _identity_hash(cfg), "prompts": stream.state_dict()}
            state.update(truncated=truncated_total, generator=generator.get_state())
            save_checkpoint(acc, out_dir, step + 1, state)
    if truncated_total:
        canvases = (
            f"{cfg.min_completion_length}..{cfg.max_completion_length}"
            if cfg.min_completion_length is not None
            else cfg.max_completion_length
        )
        print(f"warning: {truncated_total} SFT targets were longer than their canvas ({canvases} tokens)")
    final = out_dir / "final"
    export_model(acc, model, dlm, final)
    if main:
        plot_curves(read_log(out_dir / "log.jsonl"), out_dir / "curves.png", title=f"SFT on {cfg.task}")
    acc.wait_for_everyone()
    return final
