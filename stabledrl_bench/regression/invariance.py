"""``regress --invariance``: settings that must not change the numbers, each checked by running both ways.

Every class runs one computation two (or more) ways that should agree, on the golden fixtures, and reports the
largest relative deviation against the class's tolerance, measured when the class was written (0 = bitwise):

=========================  ==========================================================================================
class                      what must not change the numbers
=========================  ==========================================================================================
``gradient-checkpointing`` recomputing each decoder block in backward (on/off): an RL run's every logged value
``estimator-chunking``     ``estimator_micro_batch`` (rows per forward inside an estimator, a memory knob)
``padding``                left padding: each prompt decoded and estimated alone (unpadded) or in a padded batch
``pad-free``               the pad-free path (a backend whose model ignores masks runs each padding group alone)
``resume``                 a run stopped after its first rollout phase and resumed ends as the uninterrupted run
``exact-cache``            the block sampler's exact KV cache of committed blocks (on/off), greedy and sampled
``conventions``            each published family's calling convention (emulated) against the native backend
``eval-batching``          the evaluation batch size (greedy completions and verdicts)
``processes:<config>``     1 process accumulating 2 micro-batches vs 2 processes with 1 each, under each shipped
                           accelerate config (DDP, FSDP2, DeepSpeed ZeRO-2), launched with ``accelerate launch``
=========================  ==========================================================================================

What is *not* invariant, by design: ``per_device_prompts`` keys each micro-batch's random streams (its rollouts
are sampled from its own generator) and token-mean losses average within a micro-batch as their official code does,
so changing it changes the numbers like a different seed would; the number of processes is the invariant way to
spread a step (the ``processes`` classes).
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from stabledrl_bench.errors import UserError
from stabledrl_bench.processes import keyed_generator, launch_command
from stabledrl_bench.regression import fixtures
from stabledrl_bench.regression.cases import run_rl
from stabledrl_bench.regression.fixtures import CANVAS, GOLDEN_BUDGET, TASK
from stabledrl_bench.regression.golden import FLOAT_HASH_SUFFIX, THREADS, Observation, Row, format_table

Deviation = tuple[float, str]  # (largest relative deviation, where it was)


@dataclass(frozen=True)
class InvarianceClass:
    name: str
    compares: str
    tolerance: float  # relative; 0 = bitwise
    run: Callable[[Path], Deviation]


def _relative(a: Any, b: Any) -> float:
    """Relative deviation of two values (0 identical, inf for a difference that is not a number)."""
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool | str):
        if not (math.isfinite(a) and math.isfinite(b)):
            return 0.0 if repr(float(a)) == repr(float(b)) else math.inf
        return abs(a - b) / max(1.0, abs(a), abs(b))
    return 0.0 if a == b else math.inf


def observation_deviation(a: Observation, b: Observation, *, skip: tuple[str, ...] = ()) -> Deviation:
    """The largest relative deviation between two observations of the same computation (hashes of float bytes are
    skipped when ``skip`` names their suffix; a missing value counts as infinitely far)."""
    worst: Deviation = (0.0, "-")
    for where in set(a) | set(b):
        fields_a, fields_b = a.get(where, {}), b.get(where, {})
        for name in set(fields_a) | set(fields_b):
            if any(name.endswith(suffix) for suffix in skip):
                continue
            deviation = _relative(fields_a.get(name), fields_b.get(name))
            if deviation > worst[0]:
                worst = (deviation, f"{where} {name}")
    return worst


def _worst(*found: Deviation) -> Deviation:
    return max(found, key=lambda item: item[0])


# ------------------------------------------------------------------------------------------------ training
def _rl_pair(work: Path, baseline: str, model: str, **changed: Any) -> Deviation:
    """A golden RL run as it is and with ``changed`` settings (float hashes skipped: sums and values compared)."""
    plain = run_rl(work / "plain", baseline, model)
    other = run_rl(work / "changed", baseline, model, **changed)
    found = observation_deviation(plain, other, skip=_HASHES if any(changed.values()) else ())
    return found[0], f"{baseline}@{model}: {found[1]}"


_HASHES = (FLOAT_HASH_SUFFIX,)


def gradient_checkpointing(work: Path) -> Deviation:
    return _worst(
        *(_rl_pair(work / m, "stabledrl", m, gradient_checkpointing=True) for m in ("tiny-full", "tiny-block"))
    )


def estimator_chunking(work: Path) -> Deviation:
    return _worst(*(_rl_pair(work / b, b, "tiny-full", estimator_micro_batch=3) for b in ("spg", "grpo", "trado")))


def resume(work: Path) -> Deviation:
    """Stop after the first rollout phase (a checkpoint), resume in a new trainer, compare with one run."""
    from safetensors.torch import load_file

    from stabledrl_bench.regression.cases import rl_config
    from stabledrl_bench.training.runlog import read_log
    from stabledrl_bench.training.trainer import RLTrainer

    finals, logs = [], []
    for label in ("uninterrupted", "resumed"):
        config = rl_config(work / label, "grpo", "tiny-full")
        if label == "resumed":
            RLTrainer(config).train(stop_after=GOLDEN_BUDGET.num_iterations)
        final = RLTrainer(config).train(resume=label == "resumed")
        finals.append(load_file(str(final / "model.safetensors")))
        logs.append(
            {
                f"step {r['step']}": {k: v for k, v in r.items() if k != "seconds"}
                for r in read_log(final.parent / "log.jsonl")
            }
        )
    return _worst(observation_deviation(logs[0], logs[1]), _weights_deviation(*finals))


def _weights_deviation(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> Deviation:
    """The largest relative deviation between two state dicts' tensors (inf for different names or shapes)."""
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return math.inf, "weights: other names or shapes"
    return _worst((0.0, "-"), *((_tensor_deviation(a[k], b[k]), f"weights {k}") for k in sorted(a)))


# ------------------------------------------------------------------------------------------------ models
def conventions(work: Path) -> Deviation:
    """Each emulated family against the native model of its attention: an RL run of two methods."""
    found = []
    for model, (attention, convention) in fixtures.MODELS.items():
        if convention == "native":
            continue
        for baseline in ("stabledrl", "grpo"):
            native = run_rl(work / f"native-{attention}", baseline, f"tiny-{attention}")
            emulated = run_rl(work / model, baseline, model)
            deviation, where = observation_deviation(native, emulated, skip=_HASHES)
            found.append((deviation, f"{baseline}@{model}: {where}"))
    return _worst(*found)


def pad_free(work: Path) -> Deviation:
    """LLaDA's Hub file ignores masks, so its backend runs each padding group alone; the native backend pads."""
    del work
    from stabledrl_bench.core.models import load_diffusion_lm

    with tempfile.TemporaryDirectory() as tmp:
        padded = load_diffusion_lm(fixtures.model_dir("full"))
        alone = load_diffusion_lm(fixtures.materialise("llada-hub", Path(tmp)))
        assert alone.pad_free and not padded.pad_free
        return _worst(_decode_deviation(padded, alone), _estimates_deviation(padded, alone))


def padding(work: Path) -> Deviation:
    """Prompts of different lengths decoded and estimated in one left-padded batch, and each alone."""
    del work
    from stabledrl_bench.core.models import load_diffusion_lm

    found = []
    for attention in ("full", "block"):
        dlm = load_diffusion_lm(fixtures.model_dir(attention))
        found.append(_decode_deviation(dlm, dlm, alone=True))
        found.append(_estimates_deviation(dlm, dlm, alone=True))
    return _worst(*found)


PADDING_PROMPTS = ("0321003004002100", "12", "3 4 1 0 0 2 0 0", "1")


def _decode(dlm, prompts, temperature: float) -> torch.Tensor:
    from stabledrl_bench.core.sampling import generate

    ids, mask = dlm.encode_prompts(list(prompts), chat_template=True, prefill="")
    settings = GOLDEN_BUDGET.decode_settings(dlm)
    settings = dataclasses.replace(settings, temperature=temperature)
    with torch.no_grad():
        return generate(
            dlm, ids, mask, settings, generator=keyed_generator(0, "invariance", len(prompts))
        ).completion_ids


def _decode_deviation(a, b, *, alone: bool = False) -> Deviation:
    """Greedy completions of :data:`PADDING_PROMPTS` by ``a`` in one batch vs by ``b`` (batched, or one at a time)."""
    together = _decode(a, PADDING_PROMPTS, 0.0)
    other = (
        torch.cat([_decode(b, (prompt,), 0.0) for prompt in PADDING_PROMPTS])
        if alone
        else _decode(b, PADDING_PROMPTS, 0.0)
    )
    differing = int((together != other).sum())
    return (math.inf if differing else 0.0, f"{differing} greedy tokens differ" if differing else "greedy tokens")


def _estimates_deviation(a, b, *, alone: bool = False) -> Deviation:
    """Every estimator's values on the fixed rollouts with prompts of three lengths, by ``a`` in one left-padded batch
    vs by ``b`` in the same batch or (``alone``) row by row, unpadded."""
    from stabledrl_bench.core.estimators import ESTIMATORS, build_estimator

    batch = _ragged(fixtures.fixed_rollouts(a.attention).batch, a.pad_id)
    worst: Deviation = (0.0, "-")
    for name in ESTIMATORS:
        try:
            estimator = (
                build_estimator(name).for_attention(a.attention).bind(a, block_length=GOLDEN_BUDGET.block_length)
            )
            noise = estimator.draw(batch, keyed_generator(0, "invariance", name))
        except UserError:
            continue  # not for this attention, or needs what only its own rollout records (chosen_steps)
        with torch.no_grad():
            full = estimator.evaluate(a, batch, noise)
            if not alone:
                other = estimator.evaluate(b, batch, noise)
                for key in ("elbo", "eubo", "token_logp"):
                    x, y = getattr(full, key), getattr(other, key)
                    if x is not None:
                        worst = _worst(worst, (_tensor_deviation(x, y), f"{name}.{key}"))
                continue
            for row in range(batch.completion_ids.shape[0]):
                one = _row(batch, row)
                single = estimator.evaluate(b, one, _noise_row(noise, row, batch.prompt_mask[row]))
                for key in ("elbo", "eubo"):
                    x = getattr(full, key)
                    if x is not None:
                        worst = _worst(
                            worst,
                            (_tensor_deviation(x[row : row + 1], getattr(single, key)), f"{name}.{key} row {row}"),
                        )
    return worst


def _ragged(batch, pad_id: int):
    """``batch`` with prompts of three lengths: row i loses its first ``i % 3`` prompt tokens to left padding."""
    from stabledrl_bench.core.estimators import SequenceBatch

    drop = torch.arange(batch.prompt_ids.shape[0])[:, None] % 3
    padded = torch.arange(batch.prompt_ids.shape[1])[None, :] < drop
    return SequenceBatch(
        prompt_ids=batch.prompt_ids.masked_fill(padded, pad_id),
        prompt_mask=batch.prompt_mask & ~padded,
        completion_ids=batch.completion_ids,
        completion_mask=batch.completion_mask,
        unmask_step=batch.unmask_step,
    )


def _tensor_deviation(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float(((x - y).abs() / x.abs().clamp(min=1.0)).max())


def _row(batch, i: int):
    """Row ``i`` of a batch as a batch of one, its left padding removed."""
    from stabledrl_bench.core.estimators import SequenceBatch

    keep = batch.prompt_mask[i]
    return SequenceBatch(
        batch.prompt_ids[i : i + 1, keep],
        batch.prompt_mask[i : i + 1, keep],
        batch.completion_ids[i : i + 1],
        batch.completion_mask[i : i + 1],
        None if batch.unmask_step is None else batch.unmask_step[i : i + 1],
    )


# Noise fields shared by every row of a batch (everything else has the batch as its first dimension).
SHARED_NOISE_FIELDS = ("kappa", "coefficient")


def _noise_row(noise, i: int, prompt_keep: torch.Tensor):
    """The part of a batch's noise that belongs to row ``i`` (prompt-shaped fields unpadded)."""
    fields = {}
    for key, value in noise.__dict__.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and key not in SHARED_NOISE_FIELDS:
            value = value[i : i + 1]
            if key == "prompt_masked":
                value = value[..., prompt_keep]
        fields[key] = value
    return type(noise)(**fields)


# ------------------------------------------------------------------------------------------------ decoding
def exact_cache(work: Path) -> Deviation:
    """The block model decodes the same tokens with the exact KV cache of committed blocks as without it."""
    del work
    from stabledrl_bench.core.models import load_diffusion_lm
    from stabledrl_bench.core.sampling import BlockDecode, generate

    dlm = load_diffusion_lm(fixtures.model_dir("block"))
    ids, mask = dlm.encode_prompts(list(PADDING_PROMPTS), chat_template=True, prefill="")
    worst: Deviation = (0.0, "-")
    for temperature in (0.0, 0.9):
        outputs = []
        for use_cache in (True, False):
            settings = BlockDecode(
                max_completion_length=CANVAS,
                block_length=dlm.block_size,
                steps=20,
                temperature=temperature,
                use_cache=use_cache,
            )
            with torch.no_grad():
                outputs.append(
                    generate(
                        dlm, ids, mask, settings, generator=keyed_generator(0, "cache", temperature)
                    ).completion_ids
                )
        differing = int((outputs[0] != outputs[1]).sum())
        if differing:
            worst = (math.inf, f"{differing} tokens differ at temperature {temperature}")
    return worst


def eval_batching(work: Path) -> Deviation:
    """Native evaluation with 1 and with 4 problems per batch: the same completions and verdicts."""
    del work
    from stabledrl_bench.core.models import load_diffusion_lm
    from stabledrl_bench.evaluation.native import evaluate

    worst: Deviation = (0.0, "-")
    for attention, protocol in (("full", "tiny"), ("block", "tiny-static")):
        dlm = load_diffusion_lm(fixtures.model_dir(attention))
        rows = [
            evaluate(
                dlm, TASK, protocol=protocol, max_completion_length=CANVAS, limit=4, batch_size=size, progress=False
            ).samples
            for size in (1, 4)
        ]
        for a, b in zip(*rows, strict=True):
            if (a["completion"], a["correct"]) != (b["completion"], b["correct"]):
                worst = (math.inf, f"{protocol}: {a['doc_id']} differs")
    return worst


# ------------------------------------------------------------------------------------------------ processes
def processes(config_name: str) -> Callable[[Path], Deviation]:
    """1 process accumulating 2 micro-batches vs ``accelerate launch`` of 2 processes with one each."""

    def run(work: Path) -> Deviation:
        from safetensors.torch import load_file

        from stabledrl_bench.config import to_dict

        logs, weights = [], []
        for label in ("one", "two"):
            config = to_dict(rl_config_for_launch(work / label))
            path = work / f"{label}.yaml"
            work.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(config))
            module = ["-m", "stabledrl_bench", "train", "--config", str(path), "--skip-model-check"]
            command = [sys.executable, *module] if label == "one" else [*launch_command(config_name), *module]
            done = subprocess.run(
                command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(THREADS)}
            )
            if done.returncode != 0:
                tail = done.stderr.strip().splitlines()[-3:]
                raise UserError(f"invariance processes:{config_name}: the {label}-process run failed: {tail}")
            out = Path(config["output_dir"])
            logs.append(
                {f"step {r['step']}": {k: v for k, v in r.items() if k in _LAUNCH_FIELDS} for r in _read_log(out)}
            )
            weights.append(load_file(str(out / "final" / "model.safetensors")))
        return _worst(observation_deviation(logs[0], logs[1]), _weights_deviation(*weights))

    return run


_LAUNCH_FIELDS = ("loss", "grad_norm", "reward_mean", "reward_std", "accuracy", "kept_fraction", "nfe_total")


def _read_log(out: Path) -> list[dict[str, Any]]:
    from stabledrl_bench.training.runlog import read_log

    return read_log(out / "log.jsonl")


def rl_config_for_launch(work: Path):
    from stabledrl_bench.regression.cases import rl_config

    return rl_config(work, "grpo", "tiny-full")


# ------------------------------------------------------------------------------------------------ the classes
PROCESS_CONFIGS = ("ddp", "fsdp", "deepspeed_zero2")
CLASSES: dict[str, InvarianceClass] = {
    c.name: c
    for c in (
        InvarianceClass(
            "gradient-checkpointing", "an RL run with and without activation checkpointing", 0.0, gradient_checkpointing
        ),
        InvarianceClass(
            "estimator-chunking", "an RL run with estimator_micro_batch unset and 3", 1e-4, estimator_chunking
        ),
        InvarianceClass("padding", "decoding and every estimator: one padded batch vs each row alone", 1e-5, padding),
        InvarianceClass(
            "pad-free", "the mask-ignoring family's pad-free path vs the padded native path", 1e-4, pad_free
        ),
        InvarianceClass("resume", "a run stopped after one phase and resumed vs uninterrupted", 0.0, resume),
        InvarianceClass("exact-cache", "block decoding with and without the exact KV cache", 0.0, exact_cache),
        InvarianceClass("conventions", "RL runs on each emulated family vs the native backend", 0.0, conventions),
        InvarianceClass("eval-batching", "evaluation with 1 and 4 problems per batch", 0.0, eval_batching),
        *(
            InvarianceClass(
                f"processes:{name}", f"1 process x 2 micro-batches vs 2 processes ({name})", 1e-5, processes(name)
            )
            for name in PROCESS_CONFIGS
        ),
    )
}


def run_invariance(names: str, *, jobs: int = 1) -> int:
    """Run the named classes (``all``, ``list``, or comma-separated names); print one row each."""
    del jobs  # each class is one comparison of a few runs; they run one after the other
    if names == "list":
        for c in CLASSES.values():
            print(f"{c.name:24s} tolerance {c.tolerance:g}  {c.compares}")
        return 0
    chosen = list(CLASSES) if names == "all" else [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in CLASSES]
    if unknown:
        raise UserError(f"unknown invariance class(es) {', '.join(unknown)}; classes: {', '.join(CLASSES)}")
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="invariance-") as tmp:
            for name in chosen:
                c = CLASSES[name]
                deviation, where = c.run(Path(tmp) / name.replace(":", "-"))
                verdict = "ok" if deviation <= c.tolerance else "FAIL"
                shown = "bitwise" if c.tolerance == 0 else f"rtol {c.tolerance:g}"
                rows.append(Row(name, where, c.compares, "", f"{deviation:.3g}", shown, verdict))
                print(f"invariance {name}: {verdict} (largest deviation {deviation:.3g} at {where})", flush=True)
    finally:
        torch.set_num_threads(threads)
    print(format_table(rows))
    failed = [row.what for row in rows if row.verdict != "ok"]
    print(
        f"invariance: {len(rows) - len(failed)} of {len(rows)} classes hold"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0
