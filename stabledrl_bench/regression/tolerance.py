"""``regress --measure-tolerance``: the cross-platform tolerance of each comparison class, measured.

A CPU of another kind rounds differently because other kernels run: other vector widths in torch's own kernels, other
code paths in the BLAS library. Both can be forced on one machine, so the spread they cause is measured here instead
of guessed: every case is re-run in a subprocess under each emulated platform (``ATEN_CPU_CAPABILITY`` selects
torch's kernels, ``MKL_ENABLE_INSTRUCTIONS`` / ``ONEDNN_MAX_CPU_ISA`` the libraries' code paths), and compared value
by value with the references pinned here. A class's tolerance is the largest relative deviation seen, times 10,
rounded up to a power of ten; sampled trajectories are compared only up to their first different token (counted).
The result is written to ``tolerances.json`` beside the references, with what was measured.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.errors import UserError
from stabledrl_bench.regression.cases import Case
from stabledrl_bench.regression.golden import (
    FLOAT_HASH_SUFFIX,
    GROUP_CLASSES,
    TOLERANCES_FILE,
    TRAJECTORY_FIELD,
    platform_info,
    read_reference,
    same_platform,
)
from stabledrl_bench.reporting.provenance import forced_environment, git_state

# Emulated platforms: environment variables that switch the kernels a run uses (unknown values are ignored by the
# libraries, so a variant that changes nothing on some machine simply measures 0 there).
VARIANTS: dict[str, dict[str, str]] = {
    "torch kernels without vectorisation": {"ATEN_CPU_CAPABILITY": "default"},
    "torch kernels at AVX2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "BLAS at SSE4.2": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "all of the above at once": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
}
SAFETY = 10.0


def measure_tolerances(references: Path, cases: Sequence[Case], *, jobs: int) -> int:
    """Run ``cases`` under every variant, compare with ``references`` (pinned on this platform), write the result."""
    here = platform_info()
    pinned = {case.key: read_reference(references, case.key) for case in cases}
    missing = [key for key, ref in pinned.items() if ref is None]
    if missing:
        raise UserError(f"--measure-tolerance: no reference for {missing[0]} (pin them first: regress --update)")
    foreign = [key for key, ref in pinned.items() if ref is not None and not same_platform(ref["platform"], here)]
    if foreign:
        raise UserError(
            f"--measure-tolerance: {foreign[0]} was pinned on another platform; measure where it was pinned"
        )
    deviations: dict[str, dict[str, Any]] = {}
    for label, env in VARIANTS.items():
        print(f"measure-tolerance: {label} ({' '.join(f'{k}={v}' for k, v in env.items())})", flush=True)
        with tempfile.TemporaryDirectory(prefix="regress-variant-") as tmp:
            _run_variant(Path(tmp), env, cases, jobs)
            for case in cases:
                variant = read_reference(Path(tmp), case.key)
                reference = pinned[case.key]
                assert variant is not None and reference is not None
                _accumulate(deviations, case, reference["values"], variant["values"], label)
    classes = {name: _tolerance(found) for name, found in deviations.items()}
    git = git_state()
    document = {
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": git["commit"],
        "platform": here,
        "variants": VARIANTS,
        "rule": f"rtol = {SAFETY:g} x the largest relative deviation, rounded up to a power of ten",
        "classes": classes,
    }
    atomic_write_text(references / TOLERANCES_FILE, json.dumps(document, indent=1) + "\n")
    for name, entry in classes.items():
        print(f"measure-tolerance: {name}: largest deviation {entry['max_deviation']:.3g} -> rtol {entry['rtol']:g}")
    return 0


def _run_variant(folder: Path, env: dict[str, str], cases: Sequence[Case], jobs: int) -> None:
    groups = sorted({case.group for case in cases})
    command = [
        sys.executable,
        "-m",
        "stabledrl_bench",
        "regress",
        "--update",
        "--reason",
        "tolerance measurement",
        "--references",
        str(folder),
        "--groups",
        ",".join(groups),
        "--jobs",
        str(jobs),
    ]
    done = subprocess.run(command, env=forced_environment(env), capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"--measure-tolerance: the run under {env} failed: {done.stderr.strip().splitlines()[-1:]}")


def _relative(a: Any, b: Any) -> float | None:
    numbers = all(isinstance(x, float | int) and not isinstance(x, bool) for x in (a, b))
    if not numbers or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return abs(a - b) / max(1.0, abs(a), abs(b))


def _accumulate(
    found: dict[str, dict[str, Any]], case: Case, reference: dict[str, Any], variant: dict[str, Any], label: str
) -> None:
    kind = GROUP_CLASSES.get(case.group, "exact")
    entry = found.setdefault(kind, {"max_deviation": 0.0, "worst": None, "compared": 0, "diverged": []})
    for where, fields in reference.items():
        other = variant.get(where, {})
        if kind == "sampled" and fields.get(TRAJECTORY_FIELD) != other.get(TRAJECTORY_FIELD):
            entry["diverged"].append(f"{case.key} from {where} ({label})")
            return
        for name, value in fields.items():
            if name.endswith(FLOAT_HASH_SUFFIX):
                continue
            deviation = _relative(value, other.get(name))
            if deviation is None:
                if kind == "exact" and value != other.get(name):
                    entry.setdefault("exact_differences", []).append(f"{case.key} {where} {name} ({label})")
                continue
            entry["compared"] += 1
            if deviation > entry["max_deviation"]:
                entry.update(max_deviation=deviation, worst=f"{case.key} {where} {name} ({label})")


def _tolerance(entry: dict[str, Any]) -> dict[str, Any]:
    """The class's rtol from its largest deviation (float32's epsilon when no deviation was seen: the smallest
    difference the values can show, so a change of one rounding step still passes on another platform)."""
    observed = entry["max_deviation"]
    floor = float(torch.finfo(torch.float32).eps)
    rtol = 10 ** math.ceil(math.log10(max(observed * SAFETY, floor)))
    return {**entry, "rtol": rtol}
