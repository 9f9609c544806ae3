"""``python -m stabledrl_bench regress``: run the golden cases, compare them with the references, print one table.

Exit status 0 when every value agrees (rows ``n/c`` -- not comparable on this platform -- are allowed and counted),
1 when any value differs or a case has no reference, 2 for a usage error. ``--update --reason "..."`` pins what this
code produces instead (recording the reason, commit and platform). Cases run in ``--jobs`` spawned processes of one
thread each: the numbers do not depend on how many.
"""

from __future__ import annotations

import argparse
import fnmatch
import multiprocessing
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch
from tqdm.auto import tqdm

from stabledrl_bench.errors import UserError
from stabledrl_bench.regression.cases import Case, all_cases, run_case
from stabledrl_bench.regression.golden import (
    GROUP_CLASSES,
    REFERENCES,
    THREADS,
    Observation,
    Row,
    compare_case,
    format_table,
    platform_info,
    read_reference,
    read_tolerances,
    reference_path,
    same_platform,
    write_references,
)


def _names(text: str | None) -> list[str] | None:
    return [name.strip() for name in text.split(",") if name.strip()] if text else None


def command(args: argparse.Namespace) -> int:
    """The ``regress`` command (its flags: ``stabledrl_bench.cli``)."""
    args.references = Path(args.references) if args.references else REFERENCES
    if args.invariance:
        from stabledrl_bench.regression.invariance import run_invariance

        return run_invariance(args.invariance, jobs=args.jobs)
    if args.jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {args.jobs}")
    if args.reason and not args.update:
        raise UserError("--reason goes with --update (it records why the references were rewritten)")
    cases = all_cases(_names(args.baselines), _names(args.groups))
    if args.cases:
        cases = matching(cases, _names(args.cases) or [])
    if args.list:
        for case in cases:
            print(f"{case.key:44s} {case.description}")
        return 0
    if args.measure_tolerance:
        from stabledrl_bench.regression.tolerance import measure_tolerances

        return measure_tolerances(args.references, cases, jobs=args.jobs)
    if args.update and not args.reason.strip():
        raise UserError("--update needs --reason: say why the numbers may change (it is recorded with the commit)")
    observations = run_cases(cases, jobs=args.jobs)
    if args.update:
        changed = write_references(args.references, observations, {c.key: c.description for c in cases}, args.reason)
        print(f"regress: pinned {len(observations)} cases in {args.references} ({len(changed)} changed)")
        for case in changed:
            print(f"  changed: {case}")
        return 0
    rows = compare(args.references, observations, filtered=bool(args.baselines or args.groups or args.cases))
    return report(rows, verbose=args.verbose, references=args.references)


def matching(cases: Sequence[Case], patterns: Sequence[str]) -> list[Case]:
    """The cases whose ``group/name`` matches one of ``patterns`` (shell-style, ``fnmatch``), in case order; a
    pattern that matches none is a usage error (a typo would otherwise pass as "0 cases, nothing differs")."""
    unmatched = [pattern for pattern in patterns if not any(fnmatch.fnmatchcase(c.key, pattern) for c in cases)]
    if unmatched or not patterns:
        raise UserError(f"--cases: no case matches {', '.join(unmatched) or 'an empty list'} (`regress --list`)")
    return [case for case in cases if any(fnmatch.fnmatchcase(case.key, pattern) for pattern in patterns)]


def run_cases(cases: Sequence[Case], jobs: int = 1, progress: bool = True) -> dict[str, Observation]:
    """Every case's observation, keyed ``group/name``, in case order (one thread per worker process)."""
    with tempfile.TemporaryDirectory(prefix="regress-") as tmp:
        work = Path(tmp)
        ordered = sorted(cases, key=lambda case: -case.cost)  # long ones first: the workers finish together
        bar = tqdm(total=len(cases), desc="regress", disable=not progress, dynamic_ncols=True)
        done: dict[str, Observation] = {}
        if jobs <= 1:
            threads = torch.get_num_threads()
            torch.set_num_threads(THREADS)
            try:
                for case in ordered:
                    done[case.key] = run_case(case, _workdir(work, case))
                    bar.update(1)
            finally:
                torch.set_num_threads(threads)
        else:
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_worker_init) as pool:
                futures = {pool.submit(run_case, case, _workdir(work, case)): case for case in ordered}
                for future in as_completed(futures):
                    done[futures[future].key] = future.result()
                    bar.update(1)
        bar.close()
    return {case.key: done[case.key] for case in cases}


def _workdir(root: Path, case: Case) -> Path:
    return root / case.key.replace("/", "__")


def _worker_init() -> None:
    torch.set_num_threads(THREADS)


def compare(references: Path, observations: dict[str, Observation], *, filtered: bool) -> list[Row]:
    """Rows for every case (and, for a complete run, a failing row for each reference no case produced)."""
    tolerances = read_tolerances(references)
    here = platform_info()
    rows: list[Row] = []
    for case, values in observations.items():
        reference = read_reference(references, case)
        bitwise = reference is not None and same_platform(reference["platform"], here)
        group = case.split("/", 1)[0]
        rtol = tolerances.get(_tolerance_class(group))
        rows += compare_case(case, reference, values, bitwise=bitwise, rtol=rtol)
    if not filtered and references.is_dir():
        produced = {reference_path(references, case) for case in observations}
        for path in sorted(references.glob("*/*.json")):
            if path not in produced:
                case = f"{path.parent.name}/{path.stem}"
                rows.append(Row(case, "-", "-", "pinned", "no such case now", "-", "FAIL"))
    return rows


def _tolerance_class(group: str) -> str:
    return GROUP_CLASSES.get(group, "exact")


PER_CASE = 12


def report(rows: list[Row], *, verbose: bool, references: Path) -> int:
    """Print the table and a summary line; the exit status (0: no difference).

    Cases that agree are folded into one row per group (``--verbose``: one per case, and every differing value
    instead of the first :data:`PER_CASE` of each case)."""
    shown: list[Row] = []
    agreeing: dict[str, list[Row]] = {}
    per_case: dict[str, int] = {}
    for row in rows:
        if row.verdict == "ok" and not verbose:
            agreeing.setdefault(row.what.split("/", 1)[0], []).append(row)
            continue
        per_case[row.what] = per_case.get(row.what, 0) + 1
        if verbose or per_case[row.what] <= PER_CASE:
            shown.append(row)
    for group, ok in agreeing.items():
        values = sum(int(row.field.split()[0]) for row in ok)
        tolerances = ", ".join(sorted({row.tolerance for row in ok}))
        shown.append(Row(f"{group} ({len(ok)} cases)", "all", f"{values} values", "", "", tolerances, "ok"))
    print(format_table(shown))
    cases = {row.what for row in rows}
    failed = sorted({row.what for row in rows if row.failed})
    not_comparable = sorted({row.what for row in rows if row.verdict == "n/c"} - set(failed))
    hidden = sum(count - PER_CASE for count in per_case.values() if count > PER_CASE) if not verbose else 0
    more = f" ({hidden} more differing values: --verbose)" if hidden else ""
    print(
        f"regress: {len(cases) - len(failed)} of {len(cases)} cases agree with {references}"
        + (f"; {len(not_comparable)} only partly comparable on this platform" if not_comparable else "")
        + more
    )
    if failed:
        print(f"regress: FAILED: {', '.join(failed[:10])}{' ...' if len(failed) > 10 else ''}")
        print(
            "regress: if the change is intended, re-pin with: python -m stabledrl_bench regress --update "
            '--reason "why the numbers moved"'
        )
        return 1
    return 0
