"""Golden references: what a case produced when it was pinned, how two measurements are compared, and the table.

A reference is one JSON file per case (``<references>/<group>/<case>.json``) holding every value the case observed,
the platform it ran on, and why and at which commit it was last pinned; ``updates.jsonl`` beside them keeps the
history of every update. Values are compared in one of two modes:

* **bitwise**, when the reference was pinned on this platform (same torch build, CPU model and instruction set,
  thread count: :func:`platform_info`): every value must be identical. CPU kernels are deterministic at a fixed
  thread count, so any difference is a change in the code (or in a library it calls);
* **tolerant**, on any other platform, where floating-point kernels may round differently. Each group's class
  decides what is compared: ``exact`` groups (grader verdicts, pure Python) still bitwise; ``forced`` groups (no
  sampling: teacher-forced losses, SFT) within the group's measured relative tolerance, with hashes of float tensors
  skipped (their sums are compared); ``sampled`` groups (rollouts, decoding, evaluation) the same way up to the first
  point whose sampled tokens differ, and not at all beyond it: one different token sends a trajectory elsewhere, so
  later numbers say nothing about the code. Those rows are reported ``n/c`` (not comparable), never as passes.
"""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.errors import UserError
from stabledrl_bench.reporting.provenance import cpu_numerics, git_state

SCHEMA = "stabledrl-bench/regress/v1"
REFERENCES = Path(__file__).resolve().parent / "golden" / "references"
UPDATES_FILE = "updates.jsonl"
TOLERANCES_FILE = "tolerances.json"

Value = bool | int | float | str | None
Observation = dict[str, dict[str, Value]]  # "where" (a step, a row, "final") -> field -> value

# How each group compares across platforms (see the module docstring).
GROUP_CLASSES = {
    "graders": "exact",
    "forced": "forced",
    "sft": "forced",
    "samplers": "sampled",
    "eval": "sampled",
    "rl": "sampled",
}
TRAJECTORY_FIELD = "tokens"  # a sampled row's token hash: where two runs part, later rows are not comparable
FLOAT_HASH_SUFFIX = ".sha"  # a hash of float bytes: bitwise only (its ".sum" beside it is compared across platforms)
# Virtual machines often report one generic model name ("Intel(R) Xeon(R) Processor") for different CPUs; the
# signature (family, model, stepping, feature flags) tells them apart. References pinned before it was recorded
# have none, and are compared on PLATFORM_KEY alone.
SIGNATURE = "cpu_signature"
THREADS = 1  # regress fixes the intra-op thread count, so the platform key and the numbers do not depend on the host


def platform_info() -> dict[str, Any]:
    """What decides the bits a CPU run produces: torch build, CPU model and vector instruction set, threads."""
    return {
        "torch": torch.__version__,
        "machine": platform.machine(),
        **cpu_numerics(),  # cpu, its signature and instruction set; the threads are those regress fixes:
        "threads": THREADS,
        "python": platform.python_version(),
    }


PLATFORM_KEY = ("torch", "machine", "cpu", "capability", "threads")


def same_platform(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a.get(SIGNATURE) and b.get(SIGNATURE) and a[SIGNATURE] != b[SIGNATURE]:
        return False
    return all(a.get(key) == b.get(key) for key in PLATFORM_KEY)


# ------------------------------------------------------------------------------------------------ reference files
def reference_path(root: Path, case: str) -> Path:
    group, name = case.split("/", 1)
    return root / group / f"{name.replace('/', '_')}.json"


def read_reference(root: Path, case: str) -> dict[str, Any] | None:
    path = reference_path(root, case)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a regress reference ({exc})") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("values"), dict):
        raise UserError(f"{path}: not a regress reference (schema {SCHEMA} expected)")
    return data


def write_references(
    root: Path, observations: Mapping[str, Observation], descriptions: Mapping[str, str], reason: str
) -> list[str]:
    """Pin ``observations`` as the references of their cases, recording ``reason``, the commit and the platform;
    returns the cases whose values changed (appended to ``updates.jsonl`` with the reason)."""
    if not reason.strip():
        raise UserError("--update needs --reason: say why the numbers may change (it is recorded with the commit)")
    git = git_state()
    stamp = {
        "reason": reason.strip(),
        "commit": git["commit"],
        "dirty": git["dirty"],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    where = platform_info()
    changed = []
    for case, values in observations.items():
        old = read_reference(root, case)
        if old is None or old["values"] != _plain(values):
            changed.append(case)
        document = {
            "schema": SCHEMA,
            "case": case,
            "description": descriptions.get(case, ""),
            "platform": where,
            "updated": stamp,
            "values": values,
        }
        path = reference_path(root, case)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(document, indent=1, allow_nan=True) + "\n")
    entry = {**stamp, "platform": where, "cases": len(observations), "changed": changed}
    with open(root / UPDATES_FILE, "a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")
    return changed


def _plain(values: Observation) -> Any:
    """``values`` as they read back from JSON (what an unchanged reference holds)."""
    return json.loads(json.dumps(values, allow_nan=True))


def read_tolerances(root: Path) -> dict[str, float]:
    """The measured cross-platform relative tolerance of each comparison class (``regress --measure-tolerance``)."""
    path = root / TOLERANCES_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return {name: float(entry["rtol"]) for name, entry in data.get("classes", {}).items()}


# ------------------------------------------------------------------------------------------------ comparison
@dataclass
class Row:
    """One line of the table: a value (or a whole case) and its verdict."""

    what: str
    where: str
    field: str
    reference: str
    now: str
    tolerance: str
    verdict: str  # ok | FAIL | n/c | missing | error

    @property
    def failed(self) -> bool:
        return self.verdict in ("FAIL", "missing", "error")


def _show(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    text = "-" if value is None else str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def identical(a: Value, b: Value) -> bool:
    """Bitwise equality for floats (``-0.0`` vs ``0.0`` differ, NaN equals NaN), plain equality otherwise."""
    if isinstance(a, float) and isinstance(b, float):
        return repr(a) == repr(b)
    return type(a) is type(b) and a == b


def within(a: Value, b: Value, rtol: float) -> bool:
    """``|a - b| <= rtol * max(1, |a|, |b|)`` for numbers (non-finite values must be identical)."""
    if (
        isinstance(a, float | int)
        and isinstance(b, float | int)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        if not (math.isfinite(a) and math.isfinite(b)):
            return identical(float(a), float(b))
        return abs(a - b) <= rtol * max(1.0, abs(a), abs(b))
    return identical(a, b)


def compare_case(
    case: str, reference: Mapping[str, Any] | None, now: Observation, *, bitwise: bool, rtol: float | None
) -> list[Row]:
    """The rows of one case: one ``ok`` row if every value agrees, else one row per disagreeing value."""
    if reference is None:
        return [Row(case, "-", "-", "-", f"{_count(now)} values", "-", "missing")]
    if "error" in now:
        message = str(now["error"].get("message", ""))
        return [Row(case, "-", "error", "-", message, "-", "error")]
    group = case.split("/", 1)[0]
    kind = "exact" if bitwise else GROUP_CLASSES.get(group, "exact")
    if kind != "exact" and rtol is None:
        kind = "exact-only"  # no measured tolerance: only what cannot depend on rounding is compared
    shown = "bitwise" if bitwise else (f"rtol {rtol:g}" if kind in ("forced", "sampled") else kind)
    rows: list[Row] = []
    diverged: str | None = None
    for where in sorted(set(reference["values"]) | set(now), key=_order(reference["values"], now)):
        ref_fields = reference["values"].get(where)
        now_fields = now.get(where)
        if ref_fields is None or now_fields is None:
            present = (
                "present" if ref_fields is not None else "absent",
                "present" if now_fields is not None else "absent",
            )
            rows.append(Row(case, where, "-", *present, shown, "n/c" if diverged else "FAIL"))
            continue
        trajectory = (ref_fields.get(TRAJECTORY_FIELD), now_fields.get(TRAJECTORY_FIELD))
        if kind == "sampled" and diverged is None and not identical(*trajectory):
            diverged = where
        for field in _fields(ref_fields, now_fields):
            ref_value, now_value = ref_fields.get(field, _ABSENT), now_fields.get(field, _ABSENT)
            verdict = _verdict(kind, field, ref_value, now_value, rtol, diverged is not None)
            if verdict != "ok":
                rows.append(Row(case, where, field, _show(ref_value), _show(now_value), shown, verdict))
    if not rows:
        return [Row(case, "all", f"{_count(now)} values", "", "", shown, "ok")]
    if diverged is not None and all(row.verdict == "n/c" for row in rows):
        note = f"{len(rows)} values from {diverged} on: sampled tokens differ on this platform"
        return [Row(case, diverged, note, "", "", shown, "n/c")]
    return rows


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


def _verdict(kind: str, field: str, ref: Any, now: Any, rtol: float | None, diverged: bool) -> str:
    if ref is _ABSENT or now is _ABSENT:
        return "n/c" if diverged else "FAIL"
    if kind == "exact":
        return "ok" if identical(ref, now) else "FAIL"
    if diverged:
        return "ok" if identical(ref, now) else "n/c"
    if field.endswith(FLOAT_HASH_SUFFIX):
        return "ok"  # not compared off the reference platform: the float sum beside it is
    if kind == "exact-only":  # numbers cannot be judged without a measured tolerance
        if isinstance(ref, float) or isinstance(now, float):
            return "ok" if identical(ref, now) else "n/c"
        return "ok" if identical(ref, now) else "FAIL"
    assert rtol is not None
    return "ok" if within(ref, now, rtol) else "FAIL"


def _fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return list(a) + [key for key in b if key not in a]


def _order(reference: Mapping[str, Any], now: Mapping[str, Any]):
    """Keep the order the case produced (steps in order), reference first."""
    positions = {key: i for i, key in enumerate([*reference, *[k for k in now if k not in reference]])}
    return positions.__getitem__


def _count(values: Observation) -> int:
    return sum(len(fields) for fields in values.values())


def format_table(rows: Iterable[Row]) -> str:
    """The rows as a plain-text table with a header (what, step/where, field, reference, now, tolerance, verdict)."""
    header = Row("what", "where", "field", "reference", "now", "tolerance", "verdict")
    lines = [header, *rows]
    columns = ("what", "where", "field", "reference", "now", "tolerance", "verdict")
    widths = {name: max(len(getattr(row, name)) for row in lines) for name in columns}
    return "\n".join("  ".join(getattr(row, name).ljust(widths[name]) for name in columns).rstrip() for row in lines)
