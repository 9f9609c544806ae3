"""``verify``, one result record: check that it adds up, from its own files and, where present, its checkpoint.

A result record claims a lot: these completions, graded so, averaging to this accuracy, produced by these
weights at this commit. Loading a record already checks its schema, its samples' sha256, ``n`` and ``accuracy``.
This goes further, record by record:

* **re-grade** every stored completion with the task's grader and compare ``correct``, ``score`` and the d1
  verdict with what the samples say (forged flags, or samples graded by other code);
* **metrics** recomputed from the samples (``score_mean``, ``d1_accuracy``, ``pass@k`` and ``maj@k``);
* **weights**: where the checkpoint exists here (or is the built-in ``tiny`` model), load it as evaluated and
  compare its weights hash with the recorded one (a swapped checkpoint or path);
* **commit**: the recorded commit must exist in this repository;
* **identity**: the record's comparison, baseline, task, seed, length and protocol agree with its file name, its
  checkpoint path, its run's ``job.json`` where the run is here, and no other seed holds the very same completions
  (:func:`~stabledrl_bench.reporting.identity.identity_problems`): a record relabelled by editing its fields;
* **re-decode** (by default, :data:`DEFAULT_REDECODE` prompts per record; ``--redecode N``, 0 to skip): where the
  checkpoint is here and holds the evaluated weights, decode N prompts drawn at random again with the recorded
  settings and compare the completions token for token. This catches completions that were replaced and regraded
  consistently, which every check above passes. The draw's seed is random unless ``--redecode-seed`` gives it,
  and printed either way, so a forger cannot know which items will be drawn and a check can be repeated. Sampled
  decodes (they need the original batch's random stream) and records evaluated on a GPU (this check decodes on
  the CPU, whose rounding differs) are not re-decoded.

What cannot be checked after the fact: the hardware and whether the tree was dirty; they are reported as
recorded. Without the checkpoint, a record that was rewritten consistently everywhere (fields, file name, path,
completions regraded) proves its completions and grades, not which run made them: the summary
(:func:`stabledrl_bench.experiments.verify.verify_results`) names every record that was checked for consistency only,
and why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from stabledrl_bench.core.models.backends import TINY_SPECS, load_model_spec
from stabledrl_bench.core.sampling import generate, recorded_decode
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.native import stored_settings, weights_sha256
from stabledrl_bench.reporting.passk import METRIC_PATTERN, sampled_metrics, votes_by_problem
from stabledrl_bench.reporting.provenance import unknown_commit
from stabledrl_bench.reporting.results import load_samples, read_result
from stabledrl_bench.tasks import get_task

SCORE_TOLERANCE = 1e-9
DEFAULT_REDECODE = 3  # prompts re-decoded per record by default (``verify --redecode``)
REDECODED = "re-decoded"  # how a record's note starts when its completions were decoded again
NOT_REDECODED = "not re-decoded:"  # ... and when they could not be (the reason follows)


def _regrade(record: Mapping[str, Any], samples: list[dict[str, Any]]) -> list[str]:
    task = get_task(record["task"])
    docs = {str(doc["doc_id"]): doc for doc in task.eval_docs()}
    problems = []
    # repeated decodes are "<doc_id>#r<k>"
    found = [docs.get(str(sample["doc_id"]).split("#r")[0]) for sample in samples]
    known = [(sample["completion"], doc) for sample, doc in zip(samples, found, strict=True) if doc is not None]
    # one batch: math tasks check it concurrently on every math-verify worker
    grades = iter(task.grade_many([completion for completion, _ in known], [doc for _, doc in known]))
    for sample, doc in zip(samples, found, strict=True):
        if doc is None:
            problems.append(f"sample {sample['doc_id']}: no such test item in {record['task']}")
            continue
        grade = next(grades)
        if grade.correct != sample["correct"]:
            problems.append(
                f"sample {sample['doc_id']}: stored correct={sample['correct']}, grader says {grade.correct}"
            )
        elif sample["score"] is not None and not math.isclose(grade.score, sample["score"], abs_tol=SCORE_TOLERANCE):
            problems.append(f"sample {sample['doc_id']}: stored score {sample['score']}, grader gives {grade.score}")
        elif grade.details.get("d1") != sample["details"].get("d1"):
            problems.append(f"sample {sample['doc_id']}: stored d1 verdict differs from the grader's")
    return problems


def _metrics(record: Mapping[str, Any], samples: list[dict[str, Any]]) -> list[str]:
    metrics, n = record["metrics"], len(samples)
    expected = {"score_mean": sum(float(s["score"] or 0.0) for s in samples) / n}
    d1 = [s["details"].get("d1") for s in samples]
    if all(isinstance(flag, bool) for flag in d1):
        expected["d1_accuracy"] = sum(d1) / n
    if get_task(record["task"]).headline_field == "score":
        expected["d1_accuracy"] = expected["score_mean"]
    if any(METRIC_PATTERN.fullmatch(name) for name in metrics):
        try:
            expected |= sampled_metrics(list(votes_by_problem(samples).values()))
        except ValueError as exc:
            return [f"metrics report pass@k / maj@k but the samples cannot give them: {exc}"]
        unexpected = sorted(name for name in metrics if METRIC_PATTERN.fullmatch(name) and name not in expected)
        if unexpected:
            reported = ", ".join(name for name in expected if METRIC_PATTERN.fullmatch(name))
            return [f"metrics.{unexpected[0]} is not one the samples give ({reported})"]
    return [
        f"metrics.{name} = {metrics[name]} but the samples give {value}"
        for name, value in expected.items()
        if metrics.get(name) is not None and not math.isclose(metrics[name], value, abs_tol=1e-9)
    ]


def _load_as_evaluated(record: Mapping[str, Any]):
    """The recorded model, loaded as it was evaluated, or None when its checkpoint is not on this machine."""

    model = record["model"]
    checkpoint = model.get("checkpoint")
    if not checkpoint or (checkpoint not in TINY_SPECS and not Path(checkpoint).exists()):
        return None
    dtype = getattr(torch, model["dtype"]) if model.get("dtype") else None
    return load_model_spec(checkpoint, seed=record["seed"], dtype=dtype)


def _redecode(
    dlm, record: Mapping[str, Any], samples: list[dict[str, Any]], count: int, seed: int
) -> tuple[list[str], list[str]]:
    """(problems, notes): ``count`` samples drawn with ``seed`` decoded again and compared with the stored ones."""

    stored = stored_settings(record["settings"])
    settings = recorded_decode(stored, stored["protocol"].get("attention", dlm.attention))
    if settings.draws_noise:
        return [], [f"{NOT_REDECODED} sampled decodes need the original batch's random stream"]
    gpus = record.get("environment", {}).get("hardware", {}).get("gpus")
    if gpus:
        return [], [f"{NOT_REDECODED} evaluated on {gpus[0]}, whose rounding this CPU check would not reproduce"]
    drawn = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed))[:count].sort().values
    chosen = [samples[i] for i in drawn.tolist()]
    problems = []
    with torch.no_grad():
        for sample in chosen:
            ids, mask = dlm.encode_prompts([sample["prompt"]], chat_template=False)
            text = dlm.decode(generate(dlm, ids, mask, settings).completion_ids)[0]
            if text != sample["completion"]:
                problems.append(f"sample {sample['doc_id']}: re-decoding gives another completion")
    note = f"{REDECODED} {len(chosen)} samples drawn with seed {seed}: {', '.join(str(s['doc_id']) for s in chosen)}"
    return problems, [note]


def verify_record(
    path: Path, *, weights: bool = True, redecode: int = 0, redecode_seed: int = 0, identity: list[str] | None = None
) -> tuple[list[str], list[str]]:
    """``(problems, notes)`` for one result file; no problems means it adds up as far as it can be checked.
    ``identity``: the record's identity problems found among all records
    (:func:`stabledrl_bench.experiments.verify.verify_results`)."""
    try:
        record = read_result(path)
        samples = load_samples(record)
    except UserError as exc:
        return [str(exc)], []
    problems = _regrade(record, samples) + _metrics(record, samples) + unknown_commit(record) + list(identity or [])
    notes = []
    if weights or redecode:
        recorded = record["model"].get("weights_sha256")
        try:
            dlm = _load_as_evaluated(record)
        except UserError as exc:
            if "--trust-remote-code" in str(exc):  # never runs a checkpoint's code unless asked: not a failure
                notes.append(f"weights not checked: {exc}")
                return problems, notes
            return [*problems, f"checkpoint {record['model'].get('checkpoint')}: {exc}"], notes
        if dlm is None:
            notes.append(f"checkpoint {record['model'].get('checkpoint')} is not here: weights not checked")
        elif recorded is None:
            notes.append("the record has no weights hash (written before hashes were recorded)")
        elif weights_sha256(dlm.model) != recorded:
            problems.append(f"checkpoint {record['model']['checkpoint']} holds other weights than were evaluated")
        elif redecode:
            found, said = _redecode(dlm, record, samples, redecode, redecode_seed)
            problems += found
            notes += said
    return problems, notes
