"""Native evaluator: decode a task's test set under a named protocol, grade it, write a result record.

The lm-eval adapter (:mod:`stabledrl_bench.lmeval_adapter`) runs the same decoder and graders inside lm-eval;
this path exists because ``reproduce`` evaluates many checkpoints at several lengths and needs per-sample
records, resumability and no per-call framework overhead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from .models import DiffusionLM
from .protocols import EvalProtocol, get_protocol
from .results import result_exists, result_path, write_result
from .sampling import generate
from .tasks import get_task


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
    length: int = 256,
    limit: int | None = None,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = True,
) -> EvalOutcome:
    """Decode every evaluation doc of ``task_name`` (the protocol's subset) at canvas ``length`` and grade it.

    Accuracy is the mean of the task grader's ``correct`` verdicts; for Sudoku the d1 cell accuracy goes into
    ``d1_accuracy``, for math tasks the d1-parser verdict does (so both graders are reported side by side).
    """
    proto = get_protocol(protocol) if isinstance(protocol, str) else protocol
    task = get_task(task_name)
    docs = task.eval_docs(limit=limit)
    settings = proto.settings(length, dlm)
    generator = torch.Generator().manual_seed(seed)
    dlm.model.eval()
    specs = [task.prompt(doc, proto.prompt_protocol) for doc in docs]
    chat = proto.chat_template
    rendered = [dlm.render_prompt(s.messages, chat_template=chat, prefill=s.prefill) for s in specs]
    # Sort by prompt length in tokens so each batch pads little (equal lengths share a batch); results are
    # restored to document order. Padding never changes a result (see DiffusionLM), only the work.
    tokens = [len(dlm.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in rendered]
    order = sorted(range(len(docs)), key=lambda i: tokens[i])
    rows_by_doc: dict[int, list[dict[str, Any]]] = {}
    nfe = 0
    generated_tokens = 0
    start = time.perf_counter()
    bar = tqdm(total=len(docs) * proto.repeats, desc=f"eval {task_name}@{length}", disable=not progress)
    with torch.no_grad():
        for lo in range(0, len(order), batch_size):
            idx = order[lo : lo + batch_size]
            prompts = [specs[i].messages for i in idx]
            prompt_ids, prompt_mask = dlm.encode_prompts(prompts, chat_template=chat, prefill=specs[idx[0]].prefill)
            for repeat in range(proto.repeats):
                out = generate(dlm, prompt_ids, prompt_mask, settings, generator=generator)
                nfe += out.nfe * len(idx)
                generated_tokens += int(dlm.completion_mask(out.completion_ids).sum())
                for i, text in zip(idx, dlm.decode(out.completion_ids), strict=True):
                    grade = task.grade(text, docs[i])
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
    wall = time.perf_counter() - start
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
    if task_name == "sudoku":
        metrics["d1_accuracy"] = metrics["score_mean"]  # d1 reports cell accuracy for Sudoku
    return EvalOutcome(metrics=metrics, samples=rows, settings={**settings.to_dict(), "protocol": proto.to_dict()})


def model_record(dlm: DiffusionLM, checkpoint: str) -> dict[str, Any]:
    """The ``model`` field of a result record (the rest of the model's summary goes into ``settings``)."""
    summary = dlm.config_summary()
    return {
        "family": summary["family"],
        "name": summary["name"],
        "checkpoint": checkpoint,
        "parameters": summary["parameters"],
    }


def evaluate_and_record(
    dlm: DiffusionLM,
    *,
    results_dir,
    key: dict[str, Any],
    actual_length: int,
    budget: dict[str, Any] | None,
    limit: int | None = None,
    batch_size: int = 16,
    skip_existing: bool = True,
    progress: bool = True,
):
    """Evaluate and write one result; an existing complete result for the same key is kept (resumable)."""
    if skip_existing and result_exists(results_dir, key):
        return result_path(results_dir, key)
    outcome = evaluate(
        dlm,
        key["task"],
        protocol=key["protocol"],
        length=actual_length,
        limit=limit,
        batch_size=batch_size,
        seed=key["seed"],
        progress=progress,
    )
    record = {
        **key,
        "actual_gen_length": actual_length,
        "budget": budget,
        "settings": {**outcome.settings, "model": dlm.config_summary()},
        "metrics": outcome.metrics,
    }
    return write_result(results_dir, record, outcome.samples)
