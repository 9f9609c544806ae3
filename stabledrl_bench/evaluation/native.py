"""Native evaluator: decode a task's test set under a named protocol, grade it, write a result record.

The lm-eval adapter (:mod:`stabledrl_bench.evaluation.lmeval_adapter`) runs the same decoder and graders inside lm-eval;
this path exists because ``reproduce`` evaluates many checkpoints at several lengths and needs per-sample
records, resumability and no per-call framework overhead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from tqdm.auto import tqdm

from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.core.sampling import DecodeSettings, FullDecode, generate
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.protocols import EvalProtocol, get_protocol
from stabledrl_bench.migrations import upgraded_settings
from stabledrl_bench.processes import barrier, gather_lists, is_main_process, keyed_generator, my_share
from stabledrl_bench.reporting.naming import result_path
from stabledrl_bench.reporting.passk import sampled_metrics, votes_by_problem
from stabledrl_bench.reporting.results import read_result, result_exists, write_result
from stabledrl_bench.tasks import get_task


@dataclass
class EvalOutcome:
    metrics: dict[str, Any]
    samples: list[dict[str, Any]]
    settings: dict[str, Any]


def evaluate(
    dlm: DiffusionLM,
    task_name: str,
    *,
    protocol: str | EvalProtocol = "d1",
    max_completion_length: int = 256,
    limit: int | None = None,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = True,
    docs: list[dict[str, Any]] | None = None,
    decode_overrides: Mapping[str, Any] | None = None,
) -> EvalOutcome:
    """Decode every evaluation doc of ``task_name`` (the protocol's subset; ``docs`` instead when given, e.g. a
    run's validation docs) on a ``max_completion_length`` canvas and grade it.

    Accuracy is the mean of the task grader's ``correct`` verdicts; for Sudoku the d1 cell accuracy goes into
    ``d1_accuracy``, for math tasks the d1-parser verdict does (so both graders are reported side by side). A
    protocol that decodes every problem several times also reports ``pass@k`` and ``maj@k``
    (:mod:`stabledrl_bench.reporting.passk`).

    Under a launch of N processes each decodes every N-th batch and all of them return the whole outcome, equal to
    one process's: the batches are the same (prompts sorted by length), and a protocol that samples draws each
    batch's noise from a generator keyed by the seed and the batch's index (``seeding`` in the settings).

    ``decode_overrides`` replace fields of the decode settings that a protocol does not carry (the remasking rule,
    the EOS confidence rule: the ``sensitivity`` command's variants); the outcome's settings record them.
    """
    proto = get_protocol(protocol) if isinstance(protocol, str) else protocol
    task = get_task(task_name)
    docs = task.eval_docs(limit=limit) if docs is None else docs
    settings = proto.settings(max_completion_length, dlm)
    if decode_overrides:
        settings = dataclasses.replace(settings, **decode_overrides)
    dlm.model.eval()
    specs = [task.prompt(doc, proto.prompt_protocol) for doc in docs]
    chat = proto.chat_template
    rendered = [dlm.render_prompt(s.messages, chat_template=chat, prefill=s.prefill) for s in specs]
    # Sort by prompt length in tokens so each batch pads little (equal lengths share a batch); results are
    # restored to document order. Padding never changes a result (see DiffusionLM), only the work.
    tokens = [len(dlm.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in rendered]
    order = sorted(range(len(docs)), key=lambda i: tokens[i])
    batches = [order[lo : lo + batch_size] for lo in range(0, len(order), batch_size)]
    rows_by_doc: dict[int, list[dict[str, Any]]] = {}
    nfe = 0
    generated_tokens = 0
    start = time.perf_counter()
    mine = my_share(len(batches))
    share = sum(len(batches[b]) for b in mine) * proto.repeats
    bar = tqdm(
        total=share, desc=f"eval {task_name}@{max_completion_length}", disable=not (progress and is_main_process())
    )
    with torch.no_grad():
        for b in mine:
            idx = batches[b]
            generator = keyed_generator(seed, "eval", b, device=dlm.device)
            prompts = [specs[i].messages for i in idx]
            prompt_ids, prompt_mask = dlm.encode_prompts(prompts, chat_template=chat, prefill=specs[idx[0]].prefill)
            for repeat in range(proto.repeats):
                out = generate(dlm, prompt_ids, prompt_mask, settings, generator=generator)
                nfe += out.nfe * len(idx)
                generated_tokens += int(dlm.completion_mask(out.completion_ids).sum())
                texts = dlm.decode(out.completion_ids)
                # the whole batch at once: math tasks check it concurrently on every math-verify worker
                grades = task.grade_many(texts, [docs[i] for i in idx])
                for i, text, grade in zip(idx, texts, grades, strict=True):
                    doc_id = docs[i]["doc_id"]
                    rows_by_doc.setdefault(i, []).append(
                        {
                            # Sampling protocols decode each problem several times; every decode is one row, so
                            # accuracy is the average over repeats (TraceRL's definition).
                            "doc_id": f"{doc_id}#r{repeat}" if proto.repeats > 1 else doc_id,
                            "prompt": rendered[i],
                            "completion": text,
                            "correct": bool(grade.correct),
                            "score": float(grade.score),
                            "extracted": grade.extracted,
                            "details": dict(grade.details),
                        }
                    )
                bar.update(len(idx))
    bar.close()
    shares = gather_lists([(rows_by_doc, nfe, generated_tokens, time.perf_counter() - start)])
    rows_by_doc = {i: rows for share_rows, *_ in shares for i, rows in share_rows.items()}
    nfe = sum(share[1] for share in shares)
    generated_tokens = sum(share[2] for share in shares)
    wall = max(share[3] for share in shares)
    rows = [row for i in range(len(docs)) for row in rows_by_doc[i]]
    metrics: dict[str, Any] = {
        "accuracy": sum(s["correct"] for s in rows) / len(rows),
        "n": len(rows),
        "score_mean": sum(s["score"] for s in rows) / len(rows),
        "nfe_per_sample": nfe / len(rows),
        "wall_time_s": wall,
        "tokens_per_s": generated_tokens / wall if wall > 0 else None,
    }
    d1_flags = [s["details"]["d1"] for s in rows if isinstance(s["details"].get("d1"), bool)]
    if len(d1_flags) == len(rows):
        metrics["d1_accuracy"] = sum(d1_flags) / len(rows)
    if task.headline_field == "score":
        metrics["d1_accuracy"] = metrics["score_mean"]  # d1 reports Sudoku as cell accuracy, the grade's score
    if proto.repeats > 1:  # pass@k and maj@k of the problems' repeated decodes (for every task: `correct` flags)
        metrics |= sampled_metrics(list(votes_by_problem(rows).values()))
    return EvalOutcome(metrics=metrics, samples=rows, settings=recorded_settings(proto, settings))


def recorded_settings(proto: EvalProtocol, settings: DecodeSettings) -> dict[str, Any]:
    """What a result records of how it was decoded (and what a stored result must match to be reused)."""
    recorded = {**settings.to_dict(), "protocol": proto.to_dict()}
    if settings.draws_noise:
        recorded["seeding"] = "per-batch"  # a record of the single stream this replaced is decoded again
    return recorded


def weights_sha256(model: nn.Module) -> str:
    """sha256 of a model's weights: every state-dict entry's name, dtype, shape and bytes, in name order.

    Why: a result is only reusable for the weights it measured. Paths are not identities (a fresh clone retrains
    ``runs/.../final`` with different weights; a checkpoint can be swapped), bytes are.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1).contiguous().cpu()
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(memoryview(flat.view(torch.uint8).numpy()))
    return digest.hexdigest()


def model_record(dlm: DiffusionLM, checkpoint: str) -> dict[str, Any]:
    """The ``model`` field of a result record (the rest of the model's summary goes into ``settings``).

    A model with NaN or infinite weights is refused: it would decode garbage and be recorded as a measured 0%.
    """
    broken = [name for name, t in dlm.model.state_dict().items() if t.is_floating_point() and not t.isfinite().all()]
    if broken:
        raise UserError(
            f"model {checkpoint} has non-finite weights in {len(broken)} tensor(s) (first: {broken[0]}); "
            "refusing to evaluate it"
        )
    summary = dlm.config_summary()
    return {
        "family": summary["family"],
        "name": summary["name"],
        "checkpoint": checkpoint,
        "parameters": summary["parameters"],
        "weights_sha256": weights_sha256(dlm.model),
        "dtype": str(next(dlm.model.parameters()).dtype).replace("torch.", ""),
    }


class Recorded(NamedTuple):
    """Where a result is, and whether it was reused instead of measured (with the reason it was not)."""

    path: Path
    reused: bool
    note: str


def stored_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Recorded settings with the fields added since they were written, at their defaults (exact decoding), and
    the names of renamed fields brought up to date.

    A result recorded before the decoding modes existed was decoded exactly, which is what those defaults mean,
    so it stays reusable.
    """
    protocol = {f.name: f.default for f in fields(EvalProtocol) if f.default is not MISSING}
    renamed = upgraded_settings(settings)  # e.g. gen_length
    return {**FullDecode().to_dict(), **renamed, "protocol": {**protocol, **settings.get("protocol", {})}}


def _why_not_reusable(
    results_dir, key: dict[str, Any], settings: dict[str, Any], max_completion_length: int, n: int
) -> str | None:
    """None when the stored result for ``key`` measured these weights with these settings, else the reason."""
    if not result_exists(results_dir, key):
        return "no stored result"
    stored = read_result(result_path(results_dir, key))
    weights = stored["model"].get("weights_sha256")
    if weights is None or weights != key["model"].get("weights_sha256"):
        return "the stored result measured other weights" if weights else "the stored result records no weights hash"
    if stored["max_completion_length"] != max_completion_length:
        return f"the stored result decoded {stored['max_completion_length']} tokens, not {max_completion_length}"
    if stored_settings({k: v for k, v in stored["settings"].items() if k != "model"}) != settings:
        return "the stored result used other decode settings"
    if stored["metrics"]["n"] != n:
        return f"the stored result has {stored['metrics']['n']} samples, not {n}"
    return None


def evaluate_and_record(
    dlm: DiffusionLM,
    *,
    results_dir,
    key: dict[str, Any],
    max_completion_length: int,
    budget: dict[str, Any] | None,
    advantage: dict[str, Any] | None = None,
    limit: int | None = None,
    batch_size: int = 16,
    skip_existing: bool = True,
    progress: bool = True,
    selection: str = "final",
    validation: dict[str, Any] | None = None,
) -> Recorded:
    """Evaluate and write one result, or reuse the stored one when it measured the same weights (resumable).

    ``budget`` and ``advantage`` (:meth:`~stabledrl_bench.core.baseline.Baseline.advantage_record`) describe how an RL
    checkpoint was trained; None for the base and SFT rows. ``selection`` says which checkpoint of its run the model
    is (``final``, or ``best`` on the run's validation docs, described by ``validation``); the two are different
    folders, so different records.

    Reuse needs the same weights hash, decode settings, generated length and number of samples; anything else
    is measured again and replaces the stored result. Under a launch every process decodes its share and the
    main process writes the one record (the others return its path once it is written).
    """
    proto = get_protocol(key["protocol"])
    settings = recorded_settings(proto, proto.settings(max_completion_length, dlm))
    n = len(get_task(key["task"]).eval_docs(limit=limit)) * proto.repeats
    reason = _why_not_reusable(results_dir, key, settings, max_completion_length, n) if skip_existing else "--force"
    if reason is None:
        return Recorded(result_path(results_dir, key), True, "same weights and settings")
    outcome = evaluate(
        dlm,
        key["task"],
        protocol=proto,
        max_completion_length=max_completion_length,
        limit=limit,
        batch_size=batch_size,
        seed=key["seed"],
        progress=progress,
    )
    record = {
        **key,
        "max_completion_length": max_completion_length,
        "budget": budget,
        **({"advantage": advantage} if advantage is not None else {}),
        "settings": {**outcome.settings, "model": dlm.config_summary()},
        "metrics": outcome.metrics,
        "selection": selection,
        **({"validation": validation} if validation is not None else {}),
    }
    if is_main_process():
        write_result(results_dir, record, outcome.samples)
    barrier()
    return Recorded(result_path(results_dir, key), False, reason)
