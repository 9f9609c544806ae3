"""``verify``: every record of a results folder, each result record (:mod:`stabledrl_bench.evaluation.verify`) and
each stability record (:func:`~stabledrl_bench.experiments.stress.recheck.recheck`)."""

from __future__ import annotations

import contextlib
import functools
import secrets
from pathlib import Path
from typing import Any

from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.verify import DEFAULT_REDECODE, REDECODED, verify_record
from stabledrl_bench.experiments.stress.recheck import recheck
from stabledrl_bench.reporting.identity import identity_problems
from stabledrl_bench.reporting.results import STABILITY_DIR, read_result, record_paths


def verify_results(
    results_dir: Path | str,
    *,
    weights: bool = True,
    redecode: int = DEFAULT_REDECODE,
    redecode_seed: int | None = None,
) -> dict[str, Any]:
    """Verify every result record under ``results_dir`` (:func:`verify_record`) and every stability record
    (:func:`~stabledrl_bench.experiments.stress.recheck.recheck`); prints as it goes.

    ``redecode_seed`` None draws a seed (printed). The summary's ``consistency_only`` lists the result records that
    were read, regraded and recomputed but not re-derived from their checkpoint (no re-decode), each with why."""
    root = Path(results_dir)
    if not root.is_dir():
        raise UserError(f"results directory {root} does not exist")
    if redecode and redecode_seed is None:
        redecode_seed = secrets.randbelow(2**31)
    if redecode:
        print(f"verify: re-decoding {redecode} random prompts per record, seed {redecode_seed} (--redecode-seed)")
    paths = record_paths(root)
    readable = []
    for path in paths:
        with contextlib.suppress(UserError):  # an unreadable record is reported below, on its own
            readable.append(read_result(path))
    identity = identity_problems(readable)
    checks = [
        (
            path,
            functools.partial(
                verify_record,
                path,
                weights=weights,
                redecode=redecode,
                redecode_seed=redecode_seed,
                identity=identity.get(str(path)),
            ),
        )
        for path in paths
    ]
    stability_paths = sorted((root / STABILITY_DIR).glob("*.json"))
    checks += [(path, functools.partial(recheck, path)) for path in stability_paths]
    failed, consistency_only = 0, []
    for path, check in checks:
        problems, notes = check()
        failed += bool(problems)
        if path not in stability_paths and not problems and not any(n.startswith(REDECODED) for n in notes):
            consistency_only.append((path.relative_to(root), _why_not_rederived(notes, redecode, weights)))
        print(f"{'FAIL' if problems else 'ok  '} {path}")
        for line in problems[:20] + [f"({len(problems) - 20} more)"] * (len(problems) > 20):
            print(f"       problem: {line}")
        for line in notes:
            print(f"       note: {line}")
    return {
        "records": len(paths),
        "stability": len(stability_paths),
        "failed": failed,
        "consistency_only": consistency_only,
    }


def _why_not_rederived(notes: list[str], redecode: int, weights: bool) -> str:
    """Why a record that adds up was not re-decoded, as the phrase after a count in the summary (its notes say it
    in full)."""
    if not (redecode and weights):
        return "(--no-weights)" if not weights else "(--redecode 0)"
    text = " ".join(notes)
    if "--trust-remote-code" in text:
        return "whose checkpoint ships its own code (--trust-remote-code lets verify load it)"
    if "is not here" in text:
        return "whose checkpoint is not here"
    if "no weights hash" in text:
        return "without a weights hash"
    if "sampled decodes" in text:
        return "of sampled decodes"
    return "evaluated on a GPU"
