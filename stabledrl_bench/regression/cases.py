"""What ``regress`` pins: every golden case, each a small seeded computation on the committed fixtures.

==========  =====================================================================================================
group       a case and what it records
==========  =====================================================================================================
``rl``      ``<baseline>@<model>``: the golden budget's 4 optimizer steps (2 rollout phases) of a registered method
            on a golden model (the native tiny model of each attention, and each family's emulated convention).
            Per step: the trainer's log record (loss, gradient norm, rewards, ratio and clip statistics, ...),
            the rollout's token hash, and per micro-batch digests of what the loss saw (current, rollout and
            reference estimates, advantages). At the end: the weights' hash and sums.
``forced``  ``<baseline>@<attention>``: teacher-forced, no sampling: the committed rollouts through the method's
            advantage rule, estimator (masks from a keyed generator) and loss against fixed, deterministic shifts
            of the rollout and reference estimates; loss, metrics, gradient. ``estimator:<name>@<attention>``: each
            registered estimator's values on the same rollouts. A method whose rollout records more (EGSPO's chosen
            steps and prediction rewards, IGPO's hint positions) gets fixed stand-ins for those records
            (``stand_in_records``).
``sft``     ``<attention>``: 3 SFT steps (loss, gradient norm, learning rate) and the weights after them.
            ``warm-start:<table>-<task>``: the first 3 steps of the tiny preset's own warm start of a task (every
            task of table 1's, Sudoku of table 2's with the block model; the built-in tiny model drawn from seed
            0, the preset's data, canvas, batch and optimizer; its warmup schedule does not depend on the run's
            length, so these are the real first steps), which the committed golden models do not exercise: the
            initial weights and the steps' values and weights.
``samplers`` ``<mode>@<attention>``: the exact and fast samplers on four prompts: tokens, unmasking order, NFE.
``eval``    ``<protocol>@<task>``: a small native evaluation per protocol family: the rendered prompts' hash, the
            completions' hash, the verdicts and the metrics.
``graders`` ``<task>``: each task's grader and reward profiles on fixed texts (gold, wrong, untagged, empty).
==========  =====================================================================================================

A method installed through the ``stabledrl_bench.baselines`` entry point gets ``rl`` and ``forced`` cases like the
built-ins (``regress --baselines NAME``). The ``rl`` cases train on Sudoku, except a method whose rollout needs
worked solutions (IGPO's hints), which trains on GSM8K (:data:`RL_TASKS`). A method or estimator that refuses a kind
of model records that refusal as its value (``unsupported``), so a change in what it supports is caught too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from stabledrl_bench.core.baseline import BASELINES, LossInputs, build_baseline, training_estimator
from stabledrl_bench.core.estimators import ESTIMATORS, Estimate, SequenceBatch, build_estimator
from stabledrl_bench.core.rollouts import (
    EntropySteps,
    HintInjection,
    RolloutScheme,
    StepPredictions,
    TokenEntropies,
    TreeBranches,
    tree_bounds,
)
from stabledrl_bench.errors import UserError
from stabledrl_bench.processes import keyed_generator
from stabledrl_bench.regression import fixtures
from stabledrl_bench.regression.fixtures import CANVAS, GOLDEN_BUDGET, GOLDEN_OPTIM, MODELS, PROTOCOL, SPLIT, TASK
from stabledrl_bench.regression.golden import FLOAT_HASH_SUFFIX, TRAJECTORY_FIELD, Observation, Value

if TYPE_CHECKING:
    from stabledrl_bench.training.sft import SFTConfig


@dataclass(frozen=True)
class Case:
    """One golden case: ``group/name``, run by ``RUNNERS[group](workdir, **params)``."""

    group: str
    name: str
    params: dict[str, Any] = field(default_factory=dict, hash=False)
    description: str = ""
    cost: float = 1.0  # relative run time, so that parallel workers start the long cases first

    @property
    def key(self) -> str:
        return f"{self.group}/{self.name}"


# --------------------------------------------------------------------------------------------------- digests
def _bytes_hash(tensor: torch.Tensor) -> str:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    digest = hashlib.sha256(f"{flat.dtype}|{tuple(tensor.shape)}|".encode())
    digest.update(memoryview((flat.to(torch.uint8) if flat.dtype == torch.bool else flat).view(torch.uint8).numpy()))
    return digest.hexdigest()[:16]


def digest(name: str, tensor: torch.Tensor | None) -> dict[str, Value]:
    """A tensor as regress values: float tensors by their float64 sum (compared across platforms) and a hash of
    their bytes (``.sha``: bitwise only); integer and boolean tensors by a hash (exact everywhere)."""
    if tensor is None:
        return {}
    if tensor.is_floating_point():
        return {f"{name}.sum": float(tensor.detach().double().sum()), f"{name}{FLOAT_HASH_SUFFIX}": _bytes_hash(tensor)}
    return {name: _bytes_hash(tensor)}


def text_hash(texts: list[str]) -> str:
    return hashlib.sha256("\x1e".join(texts).encode()).hexdigest()[:16]


def weights_values(model: torch.nn.Module) -> dict[str, Value]:
    """The weights' hash (bitwise) and their float64 sum and sum of squares (compared across platforms)."""
    from stabledrl_bench.evaluation.native import weights_sha256

    params = [p.detach().double().reshape(-1) for _, p in sorted(model.state_dict().items())]
    flat = torch.cat(params)
    return {
        f"weights{FLOAT_HASH_SUFFIX}": weights_sha256(model)[:16],
        "weights.sum": float(flat.sum()),
        "weights.sumsq": float((flat * flat).sum()),
    }


def _scalar(value: Any) -> Value:
    if isinstance(value, bool | int | str) or value is None:
        return value
    return float(value)


def estimate_values(prefix: str, estimate: Estimate | None) -> dict[str, Value]:
    if estimate is None:
        return {}
    values: dict[str, Value] = {}
    names = ("token_logp", "token_mask", "token_weight", "row_weight", "row_to_seq", "row_column", "row_group")
    for name in (*names, "token_ids", "elbo", "eubo"):
        values.update(digest(f"{prefix}.{name}", getattr(estimate, name)))
    return values


def loss_input_values(inputs: LossInputs) -> dict[str, Value]:
    """What a loss saw: every estimate, the advantages and the groups."""
    return {
        **estimate_values("new", inputs.new),
        **estimate_values("old", inputs.old),
        **estimate_values("ref", inputs.ref),
        **digest("advantages", inputs.advantages),
        **digest("groups", inputs.group_ids),
    }


# --------------------------------------------------------------------------------------------------- rl
VOLATILE = frozenset({"seconds", "step"})  # wall time; the step is the row's name


# The golden task of a method whose rollout needs worked solutions (Sudoku has none): GSM8K's training answers.
RL_TASKS = {"igpo": "gsm8k"}


def rl_config(workdir: Path, baseline: str, model: str, **overrides: Any):
    """The golden RL run's TrainConfig (``overrides``: other values of its fields, for the invariance classes)."""
    from stabledrl_bench.training.config import TrainConfig

    fields: dict[str, Any] = dict(
        baseline=baseline,
        baseline_options=GOLDEN_OPTIONS.get(baseline, {}),
        task=RL_TASKS.get(baseline, TASK),
        model=str(fixtures.materialise(model, workdir)),
        protocol=PROTOCOL,
        train_split=SPLIT,
        budget=GOLDEN_BUDGET,
        optim=GOLDEN_OPTIM,
        output_dir=str(workdir / "rl" / f"{baseline}@{model}"),
        check_model=False,  # the probes are pinned by their own tests; here only the training numbers count
        progress=False,
    )
    return TrainConfig(**{**fields, **overrides})


def run_rl(workdir: Path, baseline: str, model: str, **overrides: Any) -> Observation:
    """The golden budget's steps of ``baseline`` on golden model ``model`` (see the module docstring)."""
    from stabledrl_bench.training.trainer import RLTrainer

    try:
        trainer = RLTrainer(rl_config(workdir, baseline, model, **overrides))
    except UserError as exc:
        return {"unsupported": {"reason": str(exc)}}
    seen: list[dict[str, Value]] = []
    tokens: list[str] = []
    loss, sample = trainer.baseline.loss, trainer.sample_rollout

    def observed_loss(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        seen.append(loss_input_values(inputs))
        return loss(inputs)

    def observed_sample():
        sampled = sample()
        ids = torch.cat([s.batch.completion_ids for s in sampled])
        order = torch.cat([s.batch.unmask_step for s in sampled])
        tokens.append(_bytes_hash(torch.cat((ids, order), dim=1)))
        return sampled

    trainer.baseline.loss = observed_loss  # type: ignore[method-assign]
    trainer.sample_rollout = observed_sample  # type: ignore[method-assign]
    values: Observation = {}
    while trainer.step < GOLDEN_BUDGET.max_steps:
        for record in trainer.run_phase():
            row: dict[str, Value] = {TRAJECTORY_FIELD: tokens[-1]}
            row.update({k: _scalar(v) for k, v in record.items() if k not in VOLATILE})
            for i, micro in enumerate(seen):
                row.update({f"mb{i}.{k}": v for k, v in micro.items()})
            seen.clear()
            values[f"step {record['step']}"] = row
    values["final"] = weights_values(trainer.dlm.model)
    return values


# --------------------------------------------------------------------------------------------------- forced
def _shifted(estimate: Estimate, salt: int) -> Estimate:
    """``estimate`` detached and moved by a fixed pattern of offsets in [-2, 2] (exact in any float format): a
    stand-in rollout or reference policy whose log-ratios reach both sides of every method's clip."""
    fields: dict[str, Any] = {}
    for name, value in estimate.__dict__.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            index = torch.arange(value.numel()).reshape(value.shape)
            offset = ((index * 7 + salt * 3) % 11 - 5).to(value.dtype) * 0.4
            value = value.detach() - offset
        fields[name] = value
    return Estimate(**fields)


def stand_in_records(scheme: RolloutScheme, batch: SequenceBatch, rewards: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a recording rollout scheme would have kept of the committed rollouts, as fixed stand-ins (none for the
    default scheme). ``entropy_steps`` (EGSPO): its ``num_steps`` steps by the ``uniform`` rule over the rollouts'
    steps (entropies are not committed), and prediction rewards moved from each completion's reward by a fixed
    pattern of offsets in [-0.5, 0.5] (so the stepwise advantages differ from step to step). ``step_predictions``
    (MDPO): see :func:`step_prediction_stand_ins`. ``tree_branches`` (d-TreeRPO): :func:`tree_stand_ins`.
    ``hint_injection`` (IGPO): :func:`hint_stand_ins`."""
    if isinstance(scheme, StepPredictions):
        return step_prediction_stand_ins(batch, rewards)
    if isinstance(scheme, TreeBranches):
        return tree_stand_ins(scheme, batch)
    if isinstance(scheme, HintInjection):
        return hint_stand_ins(batch)
    if isinstance(scheme, TokenEntropies):  # AGRPO's entropy rule: a fixed pattern of entropies in [1/8, 1]
        index = torch.arange(batch.completion_ids.numel()).reshape(batch.completion_ids.shape)
        return {"token_entropy": ((index * 3 + 1) % 8 + 1).to(torch.float64) / 8}
    if not isinstance(scheme, EntropySteps):
        return {}
    assert batch.unmask_step is not None
    rows, total = batch.unmask_step.shape[0], int(batch.unmask_step.max()) + 1
    k = scheme.num_steps
    steps = dataclasses.replace(scheme, selection="uniform").choose(torch.zeros(rows, total), torch.Generator())
    return {"steps": steps, "prediction_rewards": rewards[:, None] - _offsets(rows, k, rewards.dtype)}


def hint_stand_ins(batch: SequenceBatch) -> dict[str, torch.Tensor]:
    """IGPO's records as fixed stand-ins for the committed rollouts (decoded without hints): every other row a
    hinted completion, its hints at the positions of a fixed pattern (two of every five)."""
    rows, length = batch.completion_ids.shape
    index = torch.arange(rows)[:, None] * 3 + torch.arange(length)[None, :]
    hint_mask = (index % 5 < 2) & (torch.arange(rows)[:, None] % 2 == 0)
    return {"hint_mask": hint_mask, "hinted": hint_mask.any(dim=1)}


def _offsets(rows: int, columns: int, dtype: torch.dtype) -> torch.Tensor:
    """A fixed pattern [rows, columns] of offsets in {-0.5, -0.25, 0, 0.25, 0.5}."""
    index = torch.arange(rows * columns).reshape(rows, columns)
    return ((index * 7 + 3) % 5 - 2).to(dtype) * 0.25


def step_prediction_stand_ins(batch: SequenceBatch, rewards: torch.Tensor) -> dict[str, torch.Tensor]:
    """MDPO's records as fixed stand-ins for the committed rollouts (their predictions and probabilities are not
    committed), over the T steps of the rollouts: every step's prediction is the completion; each position masked
    before a step gets a probability from a fixed pattern in [1/8, 1] (0 elsewhere); the step rewards are the
    completion's moved by EGSPO's pattern of offsets."""
    assert batch.unmask_step is not None
    rows, length = batch.unmask_step.shape
    total = int(batch.unmask_step.max()) + 1
    masked = batch.unmask_step[:, None, :] >= torch.arange(total)[None, :, None]
    index = torch.arange(rows * total * length).reshape(rows, total, length)
    confidence = torch.where(masked, ((index * 5 + 1) % 8 + 1).to(torch.float64) / 8, 0.0)
    predictions = batch.completion_ids[:, None, :].expand(rows, total, length).clone()
    step_rewards = rewards[:, None] - _offsets(rows, total, rewards.dtype)
    return {"predictions": predictions, "confidence": confidence, "prediction_rewards": step_rewards}


def tree_stand_ins(scheme: TreeBranches, batch: SequenceBatch) -> dict[str, torch.Tensor]:
    """d-TreeRPO's records as fixed stand-ins for the committed rollouts (which are not trees): each group's rows
    taken as the leaves of ``scheme``'s tree in order, over the T steps of the rollouts, the parents trained in
    reverse order. Each transition is scored on its owner's own partial state, so the siblings' states differ here
    (no number depends on their being equal)."""
    assert batch.unmask_step is not None
    steps = int(batch.unmask_step.max()) + 1
    bounds = tree_bounds(steps, scheme.contraction_factor)
    parents = sum(scheme.widths(len(bounds) - 1)[:-1])
    return scheme.records(batch.unmask_step.shape[0], bounds, torch.arange(parents - 1, -1, -1))


def run_forced(workdir: Path, baseline: str, attention: str, options: dict[str, Any] | None = None) -> Observation:
    """The committed rollouts through ``baseline``'s advantage rule, estimator and loss (see the module docstring),
    under its default options (with :data:`GOLDEN_OPTIONS`) or ``options`` (:data:`OPTION_VARIANTS`)."""
    from stabledrl_bench.core.models import load_diffusion_lm

    del workdir
    dlm = load_diffusion_lm(fixtures.model_dir(attention))
    fixed = fixtures.fixed_rollouts(attention)
    method = build_baseline(baseline, **{**GOLDEN_OPTIONS.get(baseline, {}), **(options or {})})
    try:
        estimator = training_estimator(method, dlm, block_length=GOLDEN_BUDGET.block_length)
    except UserError as exc:
        return {"unsupported": {"reason": str(exc)}}
    scheme = method.rollout()
    try:
        scheme.check(GOLDEN_BUDGET.decode_settings(dlm))  # a rollout that refuses the model (EGSPO's on blocks)
    except UserError as exc:
        return {"unsupported": {"reason": str(exc)}}
    batch = dataclasses.replace(fixed.batch, records=stand_in_records(scheme, fixed.batch, fixed.rewards))
    correct = method.correctness(fixed.correct, dlm.response_lengths(batch.completion_ids), canvas=CANVAS)
    advantages, keep = method.advantages(fixed.rewards, fixed.group_ids, correct, records=batch.records)
    values: dict[str, Value] = {**digest("advantages", advantages), **digest("keep", keep)}
    if not bool(keep.any()):
        return {"loss": {**values, "dropped": True}}
    batch = dataclasses.replace(batch, records=method.estimator_records(batch.records, advantages))
    batch, advantages, groups = batch.select(keep), advantages[keep], fixed.group_ids[keep]
    noise = estimator.draw(batch, keyed_generator(0, "regress", "forced", baseline, attention))
    dlm.model.train()
    new = estimator.evaluate(dlm, batch, noise)
    old = _shifted(new, 1) if method.needs_old else None
    ref = _shifted(new, 2) if method.needs_ref else None
    loss, metrics = method.loss(LossInputs(new, old, ref, advantages, batch.completion_mask, groups))
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in dlm.model.parameters() if p.grad is not None])
    values.update({"loss": loss.item(), **{f"metric.{k}": _scalar(v) for k, v in metrics.items()}})
    values.update({"grad_norm": float(torch.linalg.vector_norm(grads)), **digest("grad", grads)})
    values.update(estimate_values("new", new))
    return {"loss": values}


def run_estimator(workdir: Path, estimator: str, attention: str) -> Observation:
    """Registered estimator ``estimator`` (default settings) on the committed rollouts, no gradient."""
    from stabledrl_bench.core.models import load_diffusion_lm

    del workdir
    dlm = load_diffusion_lm(fixtures.model_dir(attention))
    fixed = fixtures.fixed_rollouts(attention)
    records = stand_in_records(EntropySteps(), fixed.batch, fixed.rewards)
    if estimator == "advantage_steps":  # MDPO's: every step's prediction, and advantages [B, T] to rank the steps
        records = step_prediction_stand_ins(fixed.batch, fixed.rewards)
        records["advantages"] = records["prediction_rewards"]
    if estimator == "tree_transitions":  # d-TreeRPO's: its golden tree over the committed rollouts
        records = tree_stand_ins(build_baseline("dtreerpo", **GOLDEN_OPTIONS["dtreerpo"]).rollout(), fixed.batch)
    if estimator == "igpo_one_step":  # IGPO's: the positions of injected hints, whose entropies it ranks
        records = hint_stand_ins(fixed.batch)
    batch = dataclasses.replace(fixed.batch, records=records)
    try:
        bound = build_estimator(estimator).for_attention(attention).bind(dlm, block_length=GOLDEN_BUDGET.block_length)
        noise = bound.draw(batch, keyed_generator(0, "regress", "estimator", estimator, attention))
        with torch.no_grad():
            estimate = bound.evaluate(dlm, batch, noise)
    except UserError as exc:
        return {"unsupported": {"reason": str(exc)}}
    return {"estimate": {"estimator": type(bound).name, **estimate_values("estimate", estimate)}}


# --------------------------------------------------------------------------------------------------- sft
def run_sft_case(workdir: Path, attention: str) -> Observation:
    """Three SFT steps on the golden model (canvas drawn in [34, 40]): per step loss, gradient norm, rate."""
    from stabledrl_bench.training.sft import SFTConfig

    out = workdir / "sft" / attention
    config = SFTConfig(
        task=TASK,
        model=str(fixtures.model_dir(attention)),
        protocol=PROTOCOL,
        train_split=SPLIT,
        max_steps=3,
        batch_size=8,
        max_completion_length=CANVAS,
        min_completion_length=34,
        output_dir=str(out),
        save_every=0,
        progress=False,
    )
    return sft_values(config)


def sft_values(config: SFTConfig, before: Observation | None = None) -> Observation:
    """Run ``config`` and observe it: ``before`` (values taken first), each step's log record, the final weights."""
    from stabledrl_bench.core.models import load_diffusion_lm
    from stabledrl_bench.training.runlog import read_log
    from stabledrl_bench.training.sft import run_sft

    final = run_sft(config)
    values: Observation = dict(before or {})
    for record in read_log(Path(config.output_dir) / "log.jsonl"):
        values[f"step {record['step']}"] = {k: _scalar(v) for k, v in record.items() if k not in VOLATILE}
    values["final"] = weights_values(load_diffusion_lm(final).model)
    return values


def run_warm_start_case(workdir: Path, table: str, task: str) -> Observation:
    """The first 3 steps of ``table``'s tiny warm start of ``task`` on seed 0, as ``reproduce`` builds it."""
    from stabledrl_bench.core.models.backends import load_model_spec
    from stabledrl_bench.experiments.presets import presets, warm_start_spec

    preset = presets(table)["tiny"]
    spec = warm_start_spec(preset, task, str(preset.model), seed=0).sft
    out = workdir / "warm-start" / f"{table}-{task}"
    config = dataclasses.replace(spec, max_steps=3, save_every=0, progress=False, output_dir=str(out))
    return sft_values(config, {"init": weights_values(load_model_spec(config.model, seed=config.seed).model)})


# --------------------------------------------------------------------------------------------------- samplers
SAMPLERS: dict[str, dict[str, dict[str, Any]]] = {
    "full": {
        "exact-greedy": {},
        "exact-sampled": {"temperature": 0.9},
        "random-remasking": {"temperature": 0.9, "remasking": "random"},
        "fast": {"cache": "dual", "strategy": "dynamic", "threshold": 0.9, "stop_at_eos": True},
        "fast-prefix": {"cache": "prefix", "strategy": "dynamic", "threshold": 0.9, "stop_at_eos": True},
        "parallel": {"strategy": "dynamic", "threshold": 0.9, "stop_at_eos": True},
        # CJ-GRPO's rules: EOS early rejection on the even split, and with the ascending schedule (one block of
        # the canvas in floor(log2 40) = 5 steps), at train.yaml's factor 0.01
        "eoser": {"temperature": 0.9, "eos_min_gamma": 0.01},
        "eoser-ass": {
            "temperature": 0.9,
            "schedule": "ascending",
            "block_length": CANVAS,
            "steps": 5,
            "eos_min_gamma": 0.01,
        },
    },
    "block": {
        "cached-greedy": {},
        "uncached-greedy": {"use_cache": False},
        "cached-sampled": {"temperature": 0.9, "top_k": 3, "top_p": 0.9},
        "dynamic": {"strategy": "dynamic", "threshold": 0.9, "stop_at_eos": True},
    },
}
SAMPLER_PROMPTS = 4


def run_sampler(workdir: Path, mode: str, attention: str) -> Observation:
    """Four training prompts decoded on the 40-token canvas under sampler ``mode``."""
    from stabledrl_bench.core.models import load_diffusion_lm
    from stabledrl_bench.core.sampling import BlockDecode, FullDecode, generate
    from stabledrl_bench.tasks import get_task

    del workdir
    dlm = load_diffusion_lm(fixtures.model_dir(attention))
    task = get_task(TASK)
    specs = [task.prompt(doc, PROTOCOL) for doc in task.load(SPLIT, limit=SAMPLER_PROMPTS)]
    ids, mask = dlm.encode_prompts([s.messages for s in specs], chat_template=True, prefill="")
    extra = SAMPLERS[attention][mode]
    if attention == "full":
        settings = FullDecode(**{"max_completion_length": CANVAS, "block_length": 8, "steps": 20, **extra})
    else:
        settings = BlockDecode(max_completion_length=CANVAS, block_length=dlm.block_size, steps=20, **extra)
    out = generate(dlm, ids, mask, settings, generator=keyed_generator(0, "regress", "sampler", mode, attention))
    return {
        "decode": {
            TRAJECTORY_FIELD: _bytes_hash(out.completion_ids),
            "unmask_order": _bytes_hash(out.unmask_step),
            "nfe": out.nfe,
            "text[0]": dlm.decode(out.completion_ids[:1])[0],
        }
    }


# --------------------------------------------------------------------------------------------------- eval
# protocol@task -> (attention, protocol, task, canvas, problems)
EVALS: dict[str, tuple[str, str, str, int, int]] = {
    "tiny@sudoku": ("full", "tiny", "sudoku", CANVAS, 4),
    "tiny@countdown": ("full", "tiny", "countdown", CANVAS, 4),
    "tiny-fast@sudoku": ("full", "tiny-fast", "sudoku", CANVAS, 4),
    "tiny-n4-t0.9@sudoku": ("full", "tiny-n4-t0.9", "sudoku", CANVAS, 3),
    "d1@sudoku": ("full", "d1", "sudoku", 32, 2),
    "stabledrl-code@sudoku": ("full", "stabledrl-code", "sudoku", 16, 2),
    "tiny-static@sudoku": ("block", "tiny-static", "sudoku", CANVAS, 4),
    "tiny-dynamic@sudoku": ("block", "tiny-dynamic", "sudoku", CANVAS, 4),
    "tracerl-static@sudoku": ("block", "tracerl-static", "sudoku", 32, 2),
    "tracerl-dynamic@sudoku": ("block", "tracerl-dynamic", "sudoku", 32, 2),
}
EVAL_VOLATILE = frozenset({"wall_time_s", "tokens_per_s"})


def run_eval(workdir: Path, name: str) -> Observation:
    """Native evaluation ``name`` (a key of :data:`EVALS`), two problems per batch."""
    from stabledrl_bench.core.models import load_diffusion_lm
    from stabledrl_bench.evaluation.native import evaluate

    del workdir
    attention, protocol, task, canvas, limit = EVALS[name]
    dlm = load_diffusion_lm(fixtures.model_dir(attention))
    outcome = evaluate(
        dlm, task, protocol=protocol, max_completion_length=canvas, limit=limit, batch_size=2, progress=False
    )
    completions = [row["completion"] for row in outcome.samples]
    metrics = {k: _scalar(v) for k, v in outcome.metrics.items() if k not in EVAL_VOLATILE}
    verdicts = "".join("1" if row["correct"] else "0" for row in outcome.samples)
    prompts = text_hash([row["prompt"] for row in outcome.samples])  # the protocol's rendering, pinned exactly
    return {"eval": {"prompts": prompts, TRAJECTORY_FIELD: text_hash(completions), "verdicts": verdicts, **metrics}}


# --------------------------------------------------------------------------------------------------- graders
GRADER_DOCS = 3
_TAG = re.compile(r"</?answer>|```(?:python\n)?")  # answer tags, and the code tasks' fences


def _wrong(text: str) -> str:
    """The same text with every digit moved one up: the gold answer made wrong in place."""
    return re.sub(r"[0-9]", lambda m: str((int(m.group()) + 1) % 10), text)


def grader_texts(task, doc: dict) -> dict[str, str]:
    """Fixed completions of ``doc``: the gold answer in each prompt format, made wrong, untagged, and empty (the
    gold in d1's format, or in the task's first protocol's where it has no d1 prompt: HumanEval, MBPP)."""
    protocol = "d1" if "d1" in task.protocols else task.protocols[0]
    gold = task.target_completion(doc, protocol)
    texts = {f"gold-{protocol}": gold, "wrong": _wrong(gold), "untagged": _TAG.sub("", gold), "empty": ""}
    if "tiny" in task.protocols:
        texts["gold-tiny"] = task.target_completion(doc, "tiny")
    return texts


def run_graders(workdir: Path, task: str) -> Observation:
    """The task's grader and both reward profiles on :func:`grader_texts` of its first evaluation problems."""
    from stabledrl_bench.tasks import get_task

    del workdir
    spec = get_task(task)
    docs = spec.eval_docs(limit=GRADER_DOCS)
    pairs = [
        (f"doc {i}", label, text, doc) for i, doc in enumerate(docs) for label, text in grader_texts(spec, doc).items()
    ]
    texts, rows = [p[2] for p in pairs], [p[3] for p in pairs]
    grades = spec.grade_many(texts, rows)
    rewards = {profile: spec.reward_many(texts, rows, profile) for profile in ("d1", "stabledrl")}
    values: Observation = {}
    for i, (where, label, _, _) in enumerate(pairs):
        grade = grades[i]
        row = values.setdefault(where, {})
        row[f"{label}.correct"] = bool(grade.correct)
        row[f"{label}.score"] = float(grade.score)
        row[f"{label}.extracted"] = None if grade.extracted is None else str(grade.extracted)
        for profile, results in rewards.items():
            row[f"{label}.reward.{profile}"] = float(results[i].total)
    return values


# --------------------------------------------------------------------------------------------------- the list
RUNNERS: dict[str, Callable[..., Observation]] = {
    "rl": run_rl,
    "forced": run_forced,
    "estimator": run_estimator,
    "sft": run_sft_case,
    "warm-start": run_warm_start_case,
    "samplers": run_sampler,
    "eval": run_eval,
    "graders": run_graders,
}
BASELINE_GROUPS = ("rl", "forced")
# Options of a built-in method that change what it computes but are not its default, each pinned as a forced case
# of its own, ``<baseline>+<variant>@<attention>``: AGRPO's entropy rule (its recipe's; the default is uniform).
OPTION_VARIANTS: dict[str, dict[str, dict[str, Any]]] = {"agrpo": {"entropy": {"importance_sampling": "entropy"}}}
# Method options whose rollout decodes with settings of its own: rl cases <method>+<variant>@<model> on the native
# tiny models, each the golden run with these TrainConfig fields. CJ-GRPO's EOSER-ASS decodes the 40-token canvas as
# one block in floor(log2 40) = 5 steps (the block model refuses it, recorded as unsupported).
RL_VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "cj_grpo": {
        "eoser-ass": {
            "baseline_options": {"decoding": "eoser-ass"},
            "budget": dataclasses.replace(GOLDEN_BUDGET, block_length=CANVAS, diffusion_steps=5),
        }
    }
}

# Options a built-in method needs to run under the golden budget at all, given to every case of it: d-TreeRPO's
# completions are the leaves of one tree per prompt, so its tree gets the budget's 4 (2 x 2, branching at step 10).
GOLDEN_OPTIONS: dict[str, dict[str, Any]] = {
    "dtreerpo": {"num_tree_samples": 2, "tree_branch_factor": 2, "tree_contraction_factor": 2}
}
GROUPS = ("rl", "forced", "sft", "samplers", "eval", "graders")


def run_case(case: Case, workdir: Path) -> Observation:
    """``case``'s observation; an exception becomes an ``error`` value (a failed row, not a crashed table)."""
    prefix = case.name.partition(":")[0]  # estimator:<name>@..., warm-start:<table>-<task>
    runner = RUNNERS[prefix if prefix in ("estimator", "warm-start") else case.group]
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return runner(workdir, **case.params)
    except Exception as exc:  # every failure of a case is reported in its row, with the type that raised
        return {"error": {"message": f"{type(exc).__name__}: {exc}"}}


def all_cases(baselines: list[str] | None = None, groups: list[str] | None = None) -> list[Case]:
    """The golden cases: every registered baseline (or ``baselines``) in the baseline groups, and the rest of the
    groups unless ``baselines`` narrows the run to methods; ``groups`` narrows it to those groups."""
    chosen_groups = list(groups or (BASELINE_GROUPS if baselines else GROUPS))
    unknown = sorted(set(chosen_groups) - set(GROUPS))
    if unknown:
        raise UserError(f"unknown regress group(s) {', '.join(unknown)}; groups: {', '.join(GROUPS)}")
    methods = baselines if baselines is not None else list(BASELINES)
    for name in methods:
        BASELINES.get(name)  # an unknown name is one line listing the known ones
    cases: list[Case] = []
    if "rl" in chosen_groups:
        for name in methods:
            for model in MODELS:
                cost = 4.0 if model.startswith(("tiny-block", "sdar")) else 3.0
                cases.append(
                    Case("rl", f"{name}@{model}", {"baseline": name, "model": model}, f"{name} RL steps", cost)
                )
            for variant, changes in RL_VARIANTS.get(name, {}).items():
                for model in ("tiny-full", "tiny-block"):
                    params = {"baseline": name, "model": model, **changes}
                    cases.append(Case("rl", f"{name}+{variant}@{model}", params, f"{name} ({variant}) RL steps", 3.0))
    if "forced" in chosen_groups:
        for name in methods:
            for attention in ("full", "block"):
                cases.append(Case("forced", f"{name}@{attention}", {"baseline": name, "attention": attention}))
                for variant, options in OPTION_VARIANTS.get(name, {}).items():
                    params = {"baseline": name, "attention": attention, "options": options}
                    cases.append(Case("forced", f"{name}+{variant}@{attention}", params))
        if baselines is None:
            for estimator in ESTIMATORS:
                for attention in ("full", "block"):
                    params = {"estimator": estimator, "attention": attention}
                    cases.append(Case("forced", f"estimator:{estimator}@{attention}", params, cost=0.5))
    if "sft" in chosen_groups:
        cases += [Case("sft", attention, {"attention": attention}, cost=2.0) for attention in ("full", "block")]
        from stabledrl_bench.experiments.presets import presets

        # every task's recipe on the full-attention model; the block model (table 2: same recipes) on one of them
        for table, tasks in (("table1", list(presets("table1")["tiny"].tasks)), ("table2", ["sudoku"])):
            for task in tasks:
                params = {"table": table, "task": task}
                cases.append(Case("sft", f"warm-start:{table}-{task}", params, "the tiny preset's warm start", 1.5))
    if "samplers" in chosen_groups:
        for attention, modes in SAMPLERS.items():
            for mode in modes:
                cases.append(Case("samplers", f"{mode}@{attention}", {"mode": mode, "attention": attention}, cost=0.3))
    if "eval" in chosen_groups:
        cases += [Case("eval", name, {"name": name}) for name in EVALS]
    if "graders" in chosen_groups:
        from stabledrl_bench.tasks import evaluation_tasks

        cases += [Case("graders", task, {"task": task}, cost=1.5) for task in evaluation_tasks()]
    return cases
