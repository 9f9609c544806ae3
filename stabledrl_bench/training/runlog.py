"""Per-step diagnostics: an append-only JSONL log (its curves are plotted by
:mod:`stabledrl_bench.reporting.curves`)."""

from __future__ import annotations

import json
from pathlib import Path

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.migrations import upgraded_log_record


class RunLog:
    """Appends one JSON object per line; on resume, lines beyond the resumed step are dropped first.

    A new run into a folder that holds the log of an earlier one (stopped before it saved a checkpoint to resume
    from) keeps that log beside the new one, as ``log.1.jsonl`` (``.2``, ...), and says so: a log is never
    overwritten silently.
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            if self.path.is_file() and self.path.stat().st_size:
                kept = _set_aside(self.path)
                print(f"note: {self.path} held the log of an earlier run that saved nothing to resume; kept as {kept}")
            self.path.write_text("")
        elif self.path.exists():
            kept = [r for r in read_log(self.path) if r.get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps(record, default=_json_default) + "\n")


def _set_aside(path: Path) -> Path:
    """Rename ``path`` (``log.jsonl``) to the first free ``log.<n>.jsonl`` beside it; returns the new path."""
    n = 1
    while (kept := path.with_name(f"{path.stem}.{n}{path.suffix}")).exists():
        n += 1
    path.rename(kept)
    return kept


def _json_default(obj):
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def read_log(path: str | Path) -> list[dict]:
    """Records of a JSONL log; a truncated last line (killed mid-write) is ignored; old metric names are renamed."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        records.append(upgraded_log_record(record))
    return records
