"""The RL trainer shared by every baseline: one loop, so methods differ only in their loss and estimator.

Per rollout phase (every ``num_iterations`` optimizer steps):

1. draw ``prompts_per_step`` prompts (this process takes its slice), generate ``num_generations`` completions
   each with the diffusion sampler, score them with the task's reward profile;
2. advantages per group (the baseline's rule), likelihood estimates of the rollout policy (and of the
   reference policy when beta > 0, or for the shared anchor when ``anchor_beta`` > 0) for every inner iteration;
3. ``num_iterations`` optimizer steps on that rollout: for each micro-batch, estimate the current policy's
   likelihood (same masks as the rollout estimate when the baseline is coupled, fresh masks otherwise), call
   the baseline's pure loss, backpropagate; clip the gradient norm (logged *before* clipping), AdamW, LR step.

Runs on ``accelerate`` (CPU, one GPU, DDP, FSDP2, DeepSpeed ZeRO-2 through the configs in
``configs/accelerate/``; what differs between them is in :mod:`.distributed`), checkpoints at rollout boundaries,
resumes bit-identically, logs every step to ``log.jsonl`` and plots the curves to ``curves.png``.

Every random number comes from a generator keyed by what it is for (the seed, the purpose, the rollout phase, the
micro-batch's place in the step: :func:`~stabledrl_bench.processes.keyed_generator`), never from a per-process
stream. Each process takes a
contiguous share of the step's prompts in the same micro-batches as one process would, so the rollouts, masks and
losses of a run do not depend on how many processes share it (tested against one process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.config import to_dict
from stabledrl_bench.core.baseline import Baseline, LossInputs, bound_estimator, build_baseline, training_estimator
from stabledrl_bench.core.estimators import ESPOElbo, Estimate, Estimator, SequenceBatch
from stabledrl_bench.core.losses import anchor_kl
from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.core.rollouts import Feedback
from stabledrl_bench.errors import UserError, on_interrupt, require_folder
from stabledrl_bench.processes import gather_lists, keyed_generator, process_state, require_shared_folder
from stabledrl_bench.reporting.curves import plot_curves
from stabledrl_bench.tasks import REWARD_PROFILES, Task, get_task
from stabledrl_bench.training.assembly import load_policy, prepare_models
from stabledrl_bench.training.checkpoint import (
    exclusive,
    export_model,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint_state,
    rerun_note,
    save_checkpoint,
)
from stabledrl_bench.training.config import TRAIN_DTYPES, TrainConfig
from stabledrl_bench.training.data import PromptStream, training_docs
from stabledrl_bench.training.distributed import (
    make_accelerator,
    mix_into,
    uses_deepspeed,
)
from stabledrl_bench.training.runlog import RunLog, read_log
from stabledrl_bench.training.validation import Validator

VALIDATION_FILE = "validation.json"  # a run's validation history and its best step (when validation is on)


@dataclass
class MicroBatch:
    """One micro-batch of a rollout with everything the inner iterations need.

    ``weight`` 0 marks a micro-batch whose every group the baseline dropped (TraDo keeps only groups of medium
    accuracy): it still runs its forward and backward, with loss x 0, so that every process makes the same
    collective calls (a process skipping them leaves the others waiting forever under DDP, FSDP or DeepSpeed).
    """

    batch: SequenceBatch
    advantages: torch.Tensor
    group_ids: torch.Tensor
    noises: list[Any]  # per inner iteration (coupled) or [] (fresh masks every time)
    old: list[Estimate | None]  # per inner iteration; None at iteration 0 of a coupled baseline
    ref: list[Estimate | None]
    generators: dict[str, torch.Generator]  # this micro-batch's "mask" and "noise" (and "anchor") streams
    weight: float = 1.0
    anchor: list[tuple[Any, Estimate]] = field(default_factory=list)  # per inner iteration: masks, reference ELBO
    context: dict[str, float] = field(default_factory=dict)  # from the step's other micro-batches (step_context)


@dataclass
class SampledBatch:
    """One micro-batch of rollouts as sampled and scored, before advantages and likelihood estimates."""

    batch: SequenceBatch
    rewards: torch.Tensor  # [rows] the reward profile's total
    correct: torch.Tensor  # [rows] 1.0 where the task's grader accepts the answer
    group_ids: torch.Tensor  # [rows] one id per prompt: its place in the step's prompts
    components: dict[str, list[float]]  # the reward profile's parts, per row
    nfe: int
    unit: int  # the micro-batch's place in the step (the key of its random streams)


# The anchor's estimator (TrainConfig.anchor_beta): one method-independent ELBO, ESPO's antithetic pair of masks with
# one Monte-Carlo sample (the staircase ELBO on block-diffusion models), drawn from the anchor's own random stream.
ANCHOR_ESTIMATOR = ESPOElbo(num_mc=1)


# Called on every rollout-policy estimate before the loss sees it, with the trainer's private "noise" generator:
# how an experiment perturbs the ratio without touching the trainer (e.g. the stress test's exploding noise).
OldEstimateHook = Callable[[Estimate, torch.Generator], Estimate]


def accumulation_steps(prompts_per_step: int, per_device_prompts: int) -> int:
    """Micro-batches per optimizer step on each process of this launch; a step's prompts that do not split evenly
    over the processes in micro-batches of ``per_device_prompts`` are one line (``reproduce`` asks before its warm
    start, so a launch that cannot train stops before any work)."""
    world = process_state().num_processes
    per_process = prompts_per_step / world
    if per_process != int(per_process) or int(per_process) % per_device_prompts:
        raise UserError(
            f"prompts_per_step={prompts_per_step} must split evenly over {world} process(es) "
            f"in micro-batches of per_device_prompts={per_device_prompts}"
        )
    return int(per_process) // per_device_prompts


class TrainingDiverged(UserError):
    """Too many consecutive non-finite losses or gradients."""


class RLTrainer:
    """Trains ``cfg.model`` on ``cfg.task`` with baseline ``cfg.baseline`` under ``cfg.budget``."""

    def __init__(self, cfg: TrainConfig, old_estimate_hook: OldEstimateHook | None = None) -> None:
        self.cfg = cfg
        self.old_estimate_hook = old_estimate_hook
        self.budget = cfg.budget
        # Cheap checks first: a bad name or output folder fails before any model is loaded.
        require_folder(cfg.output_dir, "output_dir")
        self.task = get_task(cfg.task)
        REWARD_PROFILES.get(cfg.reward_profile)  # an unknown profile fails here, not at the first reward
        self.baseline = build_baseline(cfg.baseline, **cfg.baseline_options)
        self.baseline.require_groups(cfg.budget.num_generations)
        self.scheme = self.baseline.rollout()
        if self.scheme.needs_references and type(self.task).worked_solution is Task.worked_solution:
            raise UserError(
                f"the {self.scheme.name} rollout ({cfg.baseline}) draws hints from the prompts' worked solutions, and "
                f"task {cfg.task!r} carries none (GSM8K's answers do)"
            )
        self.grad_accum = accumulation_steps(cfg.budget.prompts_per_step, cfg.per_device_prompts)
        self.baseline.require_micro_batches(cfg.budget.prompts_per_step // cfg.per_device_prompts)
        # accelerate's own accumulation (no_sync under DDP, the engine under DeepSpeed)
        self.acc = make_accelerator(
            grad_accum=self.grad_accum, bf16=cfg.bf16, log_with=cfg.log_with or None, project_dir=cfg.output_dir
        )
        self.output_dir = Path(cfg.output_dir)
        require_shared_folder(self.output_dir, "output_dir")

        dlm = load_policy(cfg, self.acc)
        self.decode = cfg.budget.decode_settings(dlm)
        self.scheme.check(self.decode)  # a rollout scheme that cannot decode this model stops the run here
        self.estimator = training_estimator(
            self.baseline, dlm, block_length=cfg.budget.block_length, micro_batch_size=cfg.estimator_micro_batch
        )
        self.anchor: Estimator | None = None
        if cfg.anchor_beta > 0:
            self.anchor = bound_estimator(
                ANCHOR_ESTIMATOR, dlm, block_length=cfg.budget.block_length, micro_batch_size=cfg.estimator_micro_batch
            )
        # TRL's reference sync (BaselineConfig.sync_ref_model) mixes the policy into the method's own reference; under
        # LoRA that reference is the adapter-free model, which TRL leaves alone too (its callback gets no ref model).
        self.syncs_reference = self.baseline.needs_ref and self.baseline.config.sync_ref_model and cfg.lora is None
        if self.baseline.needs_ref and self.baseline.config.sync_ref_model and cfg.lora is not None:
            warnings.warn(
                f"{cfg.baseline}: sync_ref_model does nothing under LoRA (the reference is the adapter-free model, "
                "which TRL does not sync either)",
                stacklevel=2,
            )
        models = prepare_models(
            cfg,
            self.acc,
            dlm,
            reference=self.baseline.needs_ref,
            anchor=self.anchor is not None,
            synced_reference=self.syncs_reference,
        )
        self.train_dlm, self.dlm = models.train_dlm, models.dlm
        self.ref_dlm, self.anchor_dlm, self.replica = models.ref_dlm, models.anchor_dlm, models.replica
        self.optimizer, self.scheduler = models.optimizer, models.scheduler

        self.prompts = PromptStream(
            training_docs(self.task, cfg.train_split, seed=cfg.seed, generator_options=cfg.generator_options),
            seed=cfg.seed,
        )
        self.validator: Validator | None = None
        if cfg.validation.every:
            self.validator = Validator(
                cfg.validation,
                task=self.task,
                train_split=cfg.train_split,
                generator_options=cfg.generator_options,
                training_docs=self.prompts.docs,
                canvas=cfg.budget.max_completion_length,
                seed=cfg.seed,
            )
        self.validation: dict[str, Any] = {"history": [], "best": None}
        self.step = 0
        self.phase = 0  # rollout phases drawn so far (the key of their random streams)
        self.nfe_total = 0
        self._nonfinite = 0

    # ------------------------------------------------------------------ run metadata
    def run_info(self) -> dict[str, Any]:
        return {
            "config": to_dict(self.cfg),
            "budget": self.budget.to_dict(),
            "budget_hash": self.budget.hash(),
            "baseline_config": to_dict(self.baseline.config),
            "advantage": self.baseline.advantage_record(),
            "estimator": type(self.estimator).name,
            "rollout": self.scheme.settings(),
            "model": self.dlm.config_summary(),
            "world_size": self.acc.num_processes,
            "distributed": str(self.acc.distributed_type).rsplit(".", 1)[-1],
            "mixed_precision": self.acc.mixed_precision,
            "grad_accum": self.grad_accum,
            "old_estimate_hook": None if self.old_estimate_hook is None else repr(self.old_estimate_hook),
            "validation": None if self.validator is None else self.validator.describe(),
            "reference_sync": (
                {
                    "steps": self.baseline.config.ref_model_sync_steps,
                    "alpha": self.baseline.config.ref_model_mixup_alpha,
                }
                if self.syncs_reference
                else None
            ),
        }

    # ------------------------------------------------------------------ rollout
    @torch.no_grad()
    def sample_rollout(self) -> list[SampledBatch]:
        """Draw the next ``prompts_per_step`` prompts (this process's share) and sample and score their completions,
        one :class:`SampledBatch` per micro-batch. The only place rollouts are made, for training and for every
        experiment that needs rollouts of a policy (they get the trainer's prompts and random streams).

        Process r takes the r-th contiguous share, in the micro-batches one process would make, each sampled with
        its own keyed generator: the rollouts do not depend on the number of processes.
        """
        cfg, budget = self.cfg, self.budget
        docs = self.prompts.next(budget.prompts_per_step)
        share = len(docs) // self.acc.num_processes
        first = self.acc.process_index * share
        if self.replica is not None:
            self.replica.refresh(self.train_dlm.model)  # the policy as the last optimizer step left it
        phase, self.phase = self.phase, self.phase + 1
        was_training = self.dlm.model.training
        self.dlm.model.eval()
        sampled = []
        for start in range(first, first + share, cfg.per_device_prompts):
            chunk = docs[start : start + cfg.per_device_prompts]
            unit = start // cfg.per_device_prompts
            rollout_gen = keyed_generator(cfg.seed, "rollout", phase, unit, device=self.dlm.device)
            specs = [self.task.prompt(doc, cfg.protocol) for doc in chunk]
            repeated = [s.messages for s in specs for _ in range(budget.num_generations)]
            prompt_ids, prompt_mask = self.dlm.encode_prompts(
                repeated,
                chat_template=specs[0].chat_template,
                prefill=specs[0].prefill,
                max_prompt_length=budget.max_prompt_length,
            )
            doc_rows = [doc for doc in chunk for _ in range(budget.num_generations)]
            with self.acc.autocast():
                out = self.scheme.sample_with_feedback(
                    self.dlm, prompt_ids, prompt_mask, self.decode, rollout_gen, self._feedback(doc_rows)
                )
            texts = self.dlm.decode(out.completion_ids)
            # the whole chunk at once: math tasks check it concurrently on every math-verify worker
            results = self.task.reward_many(texts, doc_rows, cfg.reward_profile)
            records = self._batch_records(out.records, doc_rows)
            components: dict[str, list[float]] = {}
            for result in results:
                for name, value in result.components.items():
                    components.setdefault(name, []).append(value)
            batch = SequenceBatch(
                prompt_ids=prompt_ids,
                prompt_mask=prompt_mask,
                completion_ids=out.completion_ids,
                completion_mask=self.dlm.completion_mask(out.completion_ids),
                unmask_step=out.unmask_step,
                records=records,
            )
            sampled.append(
                SampledBatch(
                    batch=batch,
                    rewards=torch.tensor([result.total for result in results], dtype=torch.float32),
                    correct=torch.tensor(
                        [float(grade.correct) for grade in self.task.grade_many(texts, doc_rows)], dtype=torch.float32
                    ),
                    group_ids=torch.arange(len(chunk)).repeat_interleave(budget.num_generations) + start,
                    components=components,
                    nfe=out.nfe,
                    unit=unit,
                )
            )
        self.dlm.model.train(was_training)
        return sampled

    def _feedback(self, doc_rows: list[dict[str, Any]]) -> Feedback:
        """What a rollout scheme may ask about one micro-batch's rows while it draws them (``rollouts.Feedback``): the
        task grader's verdicts, and each prompt's worked solution written as a completion in the run's protocol
        (``Task.target_completion``), tokenized as the completions are. Nothing is graded or tokenized unless the
        scheme asks (the default scheme never does)."""

        def correct(rows: torch.Tensor, completion_ids: torch.Tensor) -> torch.Tensor:
            docs = [doc_rows[row] for row in rows.tolist()]
            grades = self.task.grade_many(self.dlm.decode(completion_ids), docs)
            return torch.tensor([grade.correct for grade in grades], dtype=torch.bool)

        def reference(row: int) -> list[int]:
            doc = doc_rows[row]
            if self.task.worked_solution(doc) is None:
                raise UserError(
                    f"{doc.get('doc_id', 'a prompt')} carries no worked solution to draw hints from (the "
                    f"{self.scheme.name} rollout needs one for every training prompt; GSM8K's answers have one)"
                )
            text = self.task.target_completion(doc, self.cfg.protocol)
            return list(self.dlm.tokenizer(text, add_special_tokens=False)["input_ids"])

        return Feedback(self.budget.num_generations, correct, reference)

    def _batch_records(self, records: Mapping[str, Any], doc_rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """What a rollout scheme recorded per completion (tensors of one row each), for the estimator and the
        advantages; intermediate ``predictions`` [rows, K, L] are scored as the completions are, into
        ``prediction_rewards`` [rows, K] (the reward profile's total; EGSPO's stepwise rewards)."""
        rows = len(doc_rows)
        kept = {k: v for k, v in records.items() if isinstance(v, torch.Tensor) and v.shape[:1] == (rows,)}
        predictions = kept.get("predictions")
        if predictions is not None:
            k = predictions.shape[1]
            texts = self.dlm.decode(predictions.flatten(0, 1))
            docs = [doc for doc in doc_rows for _ in range(k)]
            results = self.task.reward_many(texts, docs, self.cfg.reward_profile)
            totals = torch.tensor([result.total for result in results], dtype=torch.float32)
            kept["prediction_rewards"] = totals.view(rows, k)
        return kept

    @torch.no_grad()
    def rollout(self) -> tuple[list[MicroBatch], dict[str, float]]:
        """Sample, score and pre-estimate one rollout batch; returns micro-batches and rollout metrics."""
        self.dlm.model.eval()  # the rollout-policy estimates too, as the samples were drawn
        phase = self.phase
        sampled = self.sample_rollout()
        micro_batches: list[MicroBatch] = []
        informative = 0
        kept = 0
        for s in sampled:
            ids = s.batch.completion_ids
            correct = self.baseline.correctness(s.correct, self.dlm.response_lengths(ids), canvas=ids.shape[1])
            advantages, keep = self.baseline.advantages(s.rewards, s.group_ids, correct, records=s.batch.records)
            spread = s.rewards.view(-1, self.budget.num_generations)
            informative += int((spread.amax(dim=1) > spread.amin(dim=1)).sum())
            records = self.baseline.estimator_records(s.batch.records, advantages)
            batch, group_ids, weight = dataclasses.replace(s.batch, records=records), s.group_ids, 1.0
            if not bool(keep.any()):  # nothing to learn from, but the same forward/backward as every process
                advantages, weight = torch.zeros_like(advantages), 0.0
            elif not bool(keep.all()):
                batch = batch.select(keep)
                advantages, group_ids = advantages[keep], group_ids[keep]
            kept += int(keep.sum())
            streams = ("mask", "noise", "anchor") if self.anchor is not None else ("mask", "noise")
            generators = {name: keyed_generator(self.cfg.seed, name, phase, s.unit) for name in streams}
            with self.acc.autocast():  # as the gradient passes run, so old and new estimates agree
                micro_batches.append(
                    self._pre_estimate(batch, advantages.to(self.dlm.device), group_ids, generators, weight)
                )
        contexts = self._step_contexts([mb.advantages for mb in micro_batches])
        for mb, context in zip(micro_batches, contexts, strict=True):
            mb.context = context
        self.dlm.model.train()
        # every process's rows, in the order one process would hold them: the metrics of the whole rollout
        shares = gather_lists([(sampled_rows(sampled), informative, kept, sum(s.nfe for s in sampled))])
        rows = [row for part, *_ in shares for row in part]
        rewards = torch.tensor([row["reward"] for row in rows], dtype=torch.float32)
        components: dict[str, list[float]] = {}
        for row in rows:
            for name, value in row["components"].items():
                components.setdefault(name, []).append(value)
        metrics = {
            "reward_mean": rewards.mean().item(),
            "reward_std": rewards.std(unbiased=False).item(),
            "accuracy": torch.tensor([row["correct"] for row in rows], dtype=torch.float32).mean().item(),
            "rollout_nfe": sum(part[3] for part in shares),  # per-sample NFE, summed over micro-batches
            # groups whose completions got different rewards: the only ones any of the baselines learns from
            "informative_groups": sum(part[1] for part in shares) / max(1, len(rows) // self.budget.num_generations),
            "kept_fraction": sum(part[2] for part in shares) / len(rows),
        }
        metrics.update({f"reward/{k}": sum(v) / len(v) for k, v in components.items()})
        return micro_batches, metrics

    def _step_contexts(self, advantages: list[torch.Tensor]) -> list[dict[str, float]]:
        """This process's share of the baseline's :meth:`~Baseline.step_context` over the whole step: the
        advantages of every process's micro-batches are gathered only for a method that overrides it (the others
        get empty contexts, and no collective call)."""
        if type(self.baseline).step_context is Baseline.step_context:
            return [{} for _ in advantages]
        shares = gather_lists([[a.detach().cpu() for a in advantages]])  # rank order: the step's order
        contexts = self.baseline.step_context([a for share in shares for a in share])
        if contexts is None:
            return [{} for _ in advantages]
        start = sum(len(share) for share in shares[: process_state().process_index])
        return contexts[start : start + len(advantages)]

    def _pre_estimate(
        self, batch: SequenceBatch, advantages, group_ids, generators: dict[str, torch.Generator], weight: float
    ) -> MicroBatch:
        """Rollout-policy (and reference, and the anchor's reference) likelihoods for every inner iteration, under
        no_grad.

        A zero-weighted micro-batch needs none: its loss compares the policy with itself (``_micro_loss``). Unless
        the reference is sharded (FSDP2): each of its passes is a collective, so such a micro-batch makes the same
        passes as every other process, and its loss ignores them.
        """
        mu = self.budget.num_iterations
        coupled = self.baseline.config.coupled
        mask_gen = generators["mask"]
        noises: list[Any] = []
        old: list[Estimate | None] = []
        ref: list[Estimate | None] = []
        if weight == 0 and not (self.ref_dlm is not None and self.ref_dlm.sharded):
            return MicroBatch(batch, advantages, group_ids, noises, [None] * mu, [None] * mu, generators, weight)
        if coupled:
            noises = [self.estimator.draw_for(batch, mask_gen, it, mu) for it in range(mu)]
        for it in range(mu):
            if self.baseline.needs_old:
                if coupled and it == 0:
                    old.append(None)  # identical to the current policy's estimate: reuse it, detached
                elif coupled:
                    old.append(self.estimator.evaluate(self.dlm, batch, noises[it]).detach())
                elif it == 0:
                    first = self.estimator.draw_for(batch, mask_gen, 0, mu)
                    old.append(self.estimator.evaluate(self.dlm, batch, first).detach())
                else:
                    old.append(old[0])  # independent masks: one rollout estimate, as the official code does
            if self.baseline.needs_ref:
                ref_noise = noises[it] if coupled else self.estimator.draw_for(batch, mask_gen, it, mu)
                ref.append(self._reference_estimate(self.estimator, batch, ref_noise, self.ref_dlm))
        anchor = []
        if self.anchor is not None:  # the same masks for the reference now and the current policy in the loss
            draws = [self.anchor.draw(batch, generators["anchor"]) for _ in range(mu)]
            anchor = [(noise, self._reference_estimate(self.anchor, batch, noise, self.anchor_dlm)) for noise in draws]
        return MicroBatch(batch, advantages, group_ids, noises, old, ref, generators, weight, anchor=anchor)

    def _reference_estimate(
        self, estimator: Estimator, batch: SequenceBatch, noise, reference: DiffusionLM | None
    ) -> Estimate:
        """``estimator`` on ``reference`` (a frozen copy), or on the adapter-free policy when there is none (LoRA)."""
        if reference is not None:
            return estimator.evaluate(reference, batch, noise).detach()
        with self.dlm.model.disable_adapter():  # LoRA: the reference is the adapter-free base model
            return estimator.evaluate(self.dlm, batch, noise).detach()

    # ------------------------------------------------------------------ optimisation
    def optimizer_step(self, micro_batches: list[MicroBatch], iteration: int) -> dict[str, float]:
        """One optimizer step over all micro-batches of the current rollout (gradient accumulation).

        A step whose gradient norm is not finite (after the all-reduce, so every process agrees) is skipped:
        no parameter changes, the schedule still advances, and ``skipped`` is logged. (DeepSpeed applies the step
        inside ``backward``, before the norm is known: there the run stops instead, see :meth:`train`.)
        The logged loss and metrics are over the micro-batches of every process, as one process would log them.
        """
        if len(micro_batches) != self.acc.gradient_accumulation_steps:
            raise RuntimeError(f"{len(micro_batches)} micro-batches for {self.acc.gradient_accumulation_steps} steps")
        model = self.train_dlm.model
        per_mb: list[dict[str, float]] = []
        losses = []
        grad_norm = math.nan
        for mb in micro_batches:
            with self.acc.accumulate(model):
                with self.acc.autocast():
                    loss, metrics = self._micro_loss(mb, iteration)
                self.acc.backward(loss)  # accelerate divides by the number of accumulation steps
                if self.acc.sync_gradients:
                    params = [p for p in model.parameters() if p.requires_grad]
                    norm = self.acc.clip_grad_norm_(params, self.cfg.optim.max_grad_norm)
                    grad_norm = math.nan if norm is None else float(norm)
                    if math.isfinite(grad_norm):
                        self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            per_mb.append(metrics)
        finite = math.isfinite(grad_norm)
        self._nonfinite = 0 if finite else self._nonfinite + 1
        self.scheduler.step()
        if self.acc.num_processes > 1:
            from accelerate.utils import gather_object

            gathered = gather_object([(losses, per_mb)])
            losses = [value for part, _ in gathered for value in part]
            per_mb = [metrics for _, part in gathered for metrics in part]
        metrics = _merge_metrics(per_mb)
        metrics.update({"loss": sum(losses) / len(losses), "grad_norm": grad_norm, "skipped": not finite})
        return metrics

    def _micro_loss(self, mb: MicroBatch, iteration: int) -> tuple[torch.Tensor, dict[str, float]]:
        """The baseline's loss on one micro-batch at inner iteration ``iteration``.

        A micro-batch of dropped groups contributes an exactly zero gradient and no metrics: through the whole
        forward/backward (x 0) when other processes must make the same collective calls, else from the parameters
        directly (its passes would cost a full step for nothing).
        """
        if mb.weight == 0 and self.acc.num_processes == 1:  # alone, no other process waits for its passes
            return sum(p.sum() for p in self.train_dlm.model.parameters() if p.requires_grad) * 0.0, {}
        mask_gen = mb.generators["mask"]
        mu = self.budget.num_iterations
        noise = mb.noises[iteration] if mb.noises else self.estimator.draw_for(mb.batch, mask_gen, iteration, mu)
        new = self.estimator.evaluate(self.train_dlm, mb.batch, noise)
        old = None
        if self.baseline.needs_old:
            old = mb.old[iteration] if mb.old[iteration] is not None else new.detach()
            if self.old_estimate_hook is not None and mb.weight:
                old = self.old_estimate_hook(old, mb.generators["noise"])
        ref = mb.ref[iteration] if mb.ref else None
        if mb.weight == 0 and self.baseline.needs_ref:
            ref = new.detach()
        inputs = LossInputs(
            new=new,
            old=old,
            ref=ref,
            advantages=mb.advantages,
            completion_mask=mb.batch.completion_mask,
            group_ids=mb.group_ids.to(mb.advantages.device),
            context=mb.context,
            step=self.step,
            total_steps=self.budget.max_steps,
        )
        loss, metrics = self.baseline.loss(inputs)
        if self.anchor is not None:
            loss, metrics = self._anchored(loss, metrics, mb, iteration)
        if mb.weight == 0:
            return loss * 0.0, {}
        return loss, metrics

    def _anchored(
        self, loss: torch.Tensor, metrics: dict[str, float], mb: MicroBatch, iteration: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``loss`` plus ``anchor_beta`` x the shared anchor (:func:`~stabledrl_bench.core.losses.anchor_kl`) on
        this iteration's anchor masks; a zero-weighted micro-batch compares the policy with itself."""
        assert self.anchor is not None
        noise, ref = mb.anchor[iteration] if mb.anchor else (self.anchor.draw(mb.batch, mb.generators["anchor"]), None)
        new = self.anchor.evaluate(self.train_dlm, mb.batch, noise).elbo
        ref_elbo = new.detach() if ref is None else ref.elbo
        kl = anchor_kl(new, ref_elbo, mb.batch.completion_ids.shape[1])
        return loss + self.cfg.anchor_beta * kl, {**metrics, "anchor_kl": kl.item()}

    # ------------------------------------------------------------------ main loop
    def run_phase(self) -> Iterator[dict[str, Any]]:
        """One rollout phase: sample and score a rollout, then its ``num_iterations`` optimizer steps, yielding each
        step's log record as it is made.

        The whole numerical content of a run, without files: :meth:`train` writes, checks and checkpoints around
        it, and ``regress`` (:mod:`stabledrl_bench.regression`) pins its numbers.
        """
        start = time.perf_counter()
        micro_batches, rollout_metrics = self.rollout()
        self.nfe_total += rollout_metrics["rollout_nfe"]
        for iteration in range(self.budget.num_iterations):
            metrics = self.optimizer_step(micro_batches, iteration)
            self.step += 1
            yield {
                "step": self.step,
                "phase_iteration": iteration,
                **(rollout_metrics if iteration == 0 else {}),
                "reward_mean": rollout_metrics["reward_mean"],
                **metrics,
                **self._sync_reference(),
                "learning_rate": self.scheduler.get_last_lr()[0],
                "nfe_total": self.nfe_total,
                "seconds": time.perf_counter() - start,
            }
            start = time.perf_counter()

    def train(self, *, resume: bool | None = False, stop_after: int | None = None) -> Path:
        """Run to ``budget.max_steps`` (or stop after step ``stop_after``); returns the ``final`` model folder.

        ``stop_after`` stops at a rollout boundary with a checkpoint, as if the job had been pre-empted, so a
        later ``train(resume=True)`` continues exactly where this one left off. ``resume=None`` resumes when the
        output folder holds a checkpoint and starts fresh otherwise (what re-running a command should do);
        ``False`` refuses to overwrite checkpoints, ``True`` requires one. The output folder is locked meanwhile: a
        second run into it refuses.
        """
        main = self.acc.is_main_process
        with (
            on_interrupt(self._rerun_note),
            exclusive(self.output_dir, "training run") if main else contextlib.nullcontext(),
        ):
            return self._train(resume, stop_after)

    def _rerun_note(self) -> str:
        what = f"{self.cfg.baseline} on {self.cfg.task} ({self.output_dir})"
        return rerun_note(self.output_dir, what, self.budget.max_steps, self.cfg.checkpoint_every())

    def _train(self, resume: bool | None, stop_after: int | None) -> Path:
        cfg, budget = self.cfg, self.budget
        if resume is None:
            resume = latest_checkpoint(self.output_dir) is not None
        if stop_after is not None and stop_after < 1:
            raise UserError(f"stop_after must be positive, got {stop_after}")
        if resume:
            self._resume()
        elif latest_checkpoint(self.output_dir) is not None:
            raise UserError(f"{self.output_dir} already holds checkpoints; pass --resume or another --output-dir")
        main = self.acc.is_main_process
        log = RunLog(self.output_dir / "log.jsonl", resume_step=self.step if resume else None, enabled=main)
        if main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.output_dir / "run.json", _dumps(self.run_info()))
        if cfg.log_with:  # TensorBoard / W&B through accelerate, into the run folder; log.jsonl stays the record
            self.acc.init_trackers(
                f"{cfg.baseline}-{cfg.task}",
                config=_tracker_config(self.run_info()),
                init_kwargs={"wandb": {"dir": str(self.output_dir)}},  # else W&B writes where the command ran
            )
        bar = tqdm(
            total=budget.max_steps,
            initial=self.step,
            desc=f"{cfg.baseline}:{cfg.task}",
            disable=not (main and cfg.progress),
            dynamic_ncols=True,
        )
        stop = budget.max_steps if stop_after is None else min(stop_after, budget.max_steps)
        while self.step < stop:
            for record in self.run_phase():
                log.write(record)
                if cfg.log_with:
                    self.acc.log({k: v for k, v in record.items() if isinstance(v, int | float)}, step=self.step)
                bar.update(1)
                bar.set_postfix(reward=f"{record['reward_mean']:.3f}", gnorm=f"{record['grad_norm']:.2g}")
                if not record["skipped"] and not self._weights_finite():
                    raise TrainingDiverged(
                        f"{cfg.baseline} on {cfg.task}: the weights became non-finite at step {self.step} (learning "
                        f"rate {record['learning_rate']:.3g}); nothing was saved from it, the last checkpoint "
                        f"({latest_checkpoint(self.output_dir) or 'none saved yet'}) holds earlier weights"
                    )
                if self._nonfinite and uses_deepspeed(self.acc):
                    raise TrainingDiverged(
                        f"{cfg.baseline} on {cfg.task}: non-finite gradient at step {self.step}; DeepSpeed applies "
                        "the step inside backward, so it cannot be skipped. Parameters from before it are in the "
                        f"last checkpoint ({latest_checkpoint(self.output_dir) or 'none saved yet'})"
                    )
                if self._nonfinite >= cfg.max_nonfinite_steps:
                    path = self._save()
                    raise TrainingDiverged(
                        f"{cfg.baseline} on {cfg.task}: {self._nonfinite} consecutive non-finite steps at step "
                        f"{self.step}; parameters kept from before them in {path}"
                    )
            at_boundary = self.step % budget.num_iterations == 0
            every = cfg.validation.every
            if self.validator is not None and (
                self.step % every < budget.num_iterations or self.step == budget.max_steps
            ):
                self._validate()
            every = cfg.checkpoint_every()
            if at_boundary and every and self.step % every < budget.num_iterations and self.step < stop:
                self._save()  # (the last step's checkpoint is the one saved below)
        bar.close()
        self._save()
        final = self.output_dir / "final"
        if main:
            records = read_log(self.output_dir / "log.jsonl")
            title = f"{cfg.baseline} on {cfg.task} (budget {budget.hash()})"
            plot_curves(records, self.output_dir / "curves.png", title=title)
            _warn_if_nothing_to_learn(records, cfg)
        if self.step == budget.max_steps:  # a stopped run has a checkpoint, not a final model
            self._export(final)
        if cfg.log_with:
            self.acc.end_training()
        self.acc.wait_for_everyone()
        return final

    def _sync_reference(self) -> dict[str, bool]:
        """After every ``ref_model_sync_steps``-th optimizer step (TRL's ``on_step_end``, skipped steps included):
        reference <- (1 - alpha) reference + alpha policy. Rollouts estimate the reference at sampling time, so the
        mixed reference first scores the next rollout, as in TRL. Returns the log entry of a step that synced."""
        config = self.baseline.config
        if not self.syncs_reference or self.step % config.ref_model_sync_steps:
            return {}
        assert self.ref_dlm is not None
        mix_into(self.ref_dlm.model, self.acc.unwrap_model(self.train_dlm.model), config.ref_model_mixup_alpha)
        return {"reference_synced": True}

    def _export(self, path: Path) -> None:
        """The current policy as a model folder (collective), in the dtype evaluation runs in."""
        if self.replica is not None:
            self.replica.refresh(self.train_dlm.model)  # the unsharded module a LoRA export merges from
        export_model(self.acc, self.train_dlm.model, self.dlm, path, dtype=self._export_dtype())

    def _validate(self) -> None:
        """Score the current policy on the validation docs (collective); when it beats every earlier score (ties
        keep the earlier step), export it to ``best/``. The history and the best step are in ``validation.json``
        and in every later checkpoint, so a resumed run chooses as an uninterrupted one does."""
        assert self.validator is not None
        if self.replica is not None:
            self.replica.refresh(self.train_dlm.model)
        was_training = self.dlm.model.training
        with self.acc.autocast():
            entry = {"step": self.step, **self.validator.score(self.dlm)}
        self.dlm.model.train(was_training)
        self.validation["history"].append(entry)
        best = self.validation["best"]
        if best is None or entry["score"] > best["score"]:
            self.validation["best"] = entry
            self._export(self.output_dir / "best")
        if self.acc.is_main_process:
            record = {**self.validator.describe(), **self.validation}
            atomic_write_text(self.output_dir / VALIDATION_FILE, _dumps(record))

    def _weights_finite(self) -> bool:
        """Whether every trained parameter is finite, on every process (each checks its own shard under FSDP).

        A finite loss and gradient do not guarantee it (an infinite learning rate, say), and a run must never end
        with a NaN model and exit 0."""
        from torch.distributed.tensor import DTensor

        params = [p for p in self.train_dlm.model.parameters() if p.requires_grad]
        local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
        finite = torch.stack([t.detach().isfinite().all() for t in local]).all().float().reshape(1)
        if self.acc.num_processes > 1:
            finite = self.acc.gather(finite.to(self.acc.device)).min()
        return bool(finite)

    def _export_dtype(self) -> torch.dtype:
        """The final model's dtype: bf16 when training computed in bf16 (what evaluation runs in), else the
        weights' own. Master weights and optimizer state stay in the checkpoints."""
        return torch.bfloat16 if self.cfg.bf16 else TRAIN_DTYPES[self.cfg.dtype]

    # ------------------------------------------------------------------ checkpointing
    def _state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "nfe_total": self.nfe_total,
            "prompts": self.prompts.state_dict(),
            "budget_hash": self.budget.hash(),
            "world_size": self.acc.num_processes,
            "config": to_dict(self.cfg),
            "validation": self.validation,
        }

    def _save(self) -> Path:
        # the random streams are keyed by rollout phase (keyed_generator): the step is all a resume needs of them
        return save_checkpoint(
            self.acc,
            self.output_dir,
            self.step,
            self._state(),
            keep_last=self.cfg.keep_checkpoints,
            frozen=self._moving(),
        )

    def _moving(self) -> dict[str, torch.nn.Module]:
        """The frozen modules a checkpoint must hold because training changes them: a synced reference (it depends
        on the policy at every sync, so it cannot be re-derived from the latest weights)."""
        return {"reference": self.ref_dlm.model} if self.syncs_reference and self.ref_dlm is not None else {}

    def _resume(self) -> None:
        path = latest_checkpoint(self.output_dir)
        if path is None:
            raise UserError(f"--resume: no checkpoint in {self.output_dir}")
        state = read_checkpoint_state(path)
        if state["budget_hash"] != self.budget.hash():
            raise UserError(
                f"--resume: checkpoint {path} was trained under budget {state['budget_hash']}, "
                f"this config has {self.budget.hash()}"
            )
        if state.get("world_size") != self.acc.num_processes:
            raise UserError(
                f"--resume: checkpoint {path} was written by {state.get('world_size')} process(es), now "
                f"{self.acc.num_processes} (its optimizer state is laid out per process)"
            )
        load_checkpoint(self.acc, path, frozen=self._moving())
        self.prompts.load_state_dict(state["prompts"])
        self.step = state["step"]
        self.phase = self.step // self.budget.num_iterations
        self.nfe_total = state["nfe_total"]
        self.validation = state.get("validation", {"history": [], "best": None})
        if self.acc.is_main_process:
            total = self.budget.max_steps
            print(f"{self.cfg.baseline} on {self.cfg.task}: resuming from step {self.step} of {total} ({path})")


# ---------------------------------------------------------------------- helpers
def sampled_rows(sampled: list[SampledBatch]) -> list[dict[str, Any]]:
    """One plain record per completion of a rollout (what its metrics are computed from, on any process)."""
    return [
        {
            "reward": float(s.rewards[i]),
            "correct": float(s.correct[i]),
            "components": {name: values[i] for name, values in s.components.items()},
        }
        for s in sampled
        for i in range(len(s.rewards))
    ]


def _merge_metrics(per_mb: list[dict[str, float]]) -> dict[str, float]:
    """Average micro-batch metrics; maxima stay maxima."""
    merged: dict[str, float] = {}
    keys = {k for m in per_mb for k in m}
    for key in keys:
        values = [m[key] for m in per_mb if key in m]
        merged[key] = max(values) if key.endswith("_max") else sum(values) / len(values)
    return merged


def _warn_if_nothing_to_learn(records: list[dict[str, Any]], cfg: TrainConfig) -> None:
    """Warn when no rollout of the run had a group with different rewards.

    Group-relative advantages are then zero everywhere, so every loss is a clean 0 and the run "succeeds" without
    changing the model: easy to miss, and usually a reward problem (e.g. completions in the wrong format).
    """
    fractions = [r["informative_groups"] for r in records if "informative_groups" in r]
    if fractions and max(fractions) == 0:
        rewards = sorted({round(r["reward_mean"], 6) for r in records if "reward_mean" in r})
        warnings.warn(
            f"{cfg.baseline} on {cfg.task}: in all {len(fractions)} rollouts every group's completions got the same "
            f"reward (mean rewards seen: {rewards[:5]}), so nothing was learned; check the reward and the "
            f"completions' format (log: {Path(cfg.output_dir) / 'log.jsonl'})",
            stacklevel=2,
        )


def _dumps(obj) -> str:
    return json.dumps(obj, indent=2, default=str)


def _tracker_config(info: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The run's settings flattened to ``a/b: value`` scalars (what TensorBoard's hparams accept)."""
    flat: dict[str, Any] = {}
    for key, value in info.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_tracker_config(value, prefix=f"{name}/"))
        elif isinstance(value, bool | int | float | str):
            flat[name] = value
        elif value is not None:
            flat[name] = str(value)
    return flat
