"""Result records as one table (a pandas frame): which displayed row and cell each record belongs to, and the
checks that refuse what cannot be shown honestly (duplicates, mixed budgets, mixed lengths in one column).

Every block of the leaderboard (greedy tables, approximate decoding, sampled pass@k) groups the same frame.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from stabledrl_bench.core.sampling import DecodeSettingsError, recorded_decode
from stabledrl_bench.errors import UserError
from stabledrl_bench.reporting.layout import shown_table
from stabledrl_bench.reporting.naming import model_short_name
from stabledrl_bench.reporting.provenance import code_label, hardware_label
from stabledrl_bench.reporting.schema import REFERENCE_BASELINES


def _row_path(path: str | None, seed: int, task: str, comparison: str) -> str | None:
    """``path`` (a model's name or checkpoint) with its seed folder (``s<seed>``, the layout of ``reproduce
    --seeds``) and its task folder written ``*``: one method's replicates over training seeds are one row (their
    samples pooled), and so are its per-task checkpoints (``runs/<comparison>/<task>/...``), as in the papers'
    tables, where each task column of a method's row is its own training run. The folders above the comparison's
    own folder are written ``*`` as well: where a seed's runs were kept (``--runs``, another machine's scratch disk)
    does not make it another method."""
    if not path:
        return path
    parts = path.split("/")
    if comparison in parts[1:]:
        parts = ["*", *parts[parts.index(comparison, 1) :]]
    return "/".join("*" if part in (f"s{seed}", task) else part for part in parts)


def _model_label(model: Mapping[str, Any]) -> str:
    return model["name"] + (f" @ {model_short_name(model)}" if model["checkpoint"] else "")


FRAME_COLUMNS = [
    "index",
    "comparison",
    "table",
    "baseline",
    "model_key",
    "model",
    "protocol",
    "protocols",
    "preset",
    "task",
    "sub",
    "seed",
    "length",
    "max_completion_length",
    "budget_hash",
    "hardware",
    "code",
    "path",
    "approximate",
    "sampled",
    "selection",
    "selection_step",
]


def records_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per record with the fields the grouping and checks need; ``index`` points into ``records``.

    ``table`` is the leaderboard table the record is shown in (:func:`~.layout.shown_table`): a Table 1 record of
    HumanEval or MBPP belongs to the coding table, whose columns are SPG's coding table's.
    """
    rows = []
    for index, record in enumerate(records):
        model, where = record["model"], (record["seed"], record["task"], record["comparison"])
        rows.append(
            {
                "index": index,
                "comparison": record["comparison"],
                "table": shown_table(record["table"], record["task"]),
                "baseline": record["baseline"],
                "model_key": json.dumps([_row_path(model[key], *where) for key in ("name", "checkpoint")]),
                "model": _row_path(_model_label(model), *where),
                "protocol": record["protocol"],
                "protocols": _protocol_family(record),
                "preset": record["preset"],
                "task": record["task"],
                "sub": record["length"] if record["table"] == "table1" else record["sampling"],
                "seed": record["seed"],
                "length": record["length"],
                "max_completion_length": record["max_completion_length"],
                "budget_hash": record["budget_hash"],
                "hardware": hardware_label(record["environment"]),
                "code": code_label(record["environment"]),
                "path": record["_path"],
                "approximate": approximate_decoding(record),
                "sampled": sampled_decoding(record),
                "selection": record.get("selection", "final"),  # records from before checkpoint selection: final
                "selection_step": (record.get("validation") or {}).get("step"),
            }
        )
    return pd.DataFrame(rows, columns=FRAME_COLUMNS)


def _protocol_family(record: Mapping[str, Any]) -> str:
    """The protocols one row shows. Table 2's static and dynamic columns are two protocols of one family
    (``tiny-static`` / ``tiny-dynamic`` -> ``tiny-{static,dynamic}``), so one row holds both; elsewhere, one."""
    protocol, sampling = record["protocol"], record["sampling"]
    if record["table"] != "table2" or not sampling or sampling not in protocol:
        return protocol
    return protocol.replace(sampling, "{static,dynamic}")


def sampled_decoding(record: Mapping[str, Any]) -> bool:
    """Whether a result decoded every problem several times for pass@k / maj@k (a ``<name>-n<N>-t<T>``
    protocol): such records have their own block, never a greedy table's cells."""
    return bool(record["settings"].get("protocol", {}).get("pass_at_k", False))


def approximate_decoding(record: Mapping[str, Any]) -> bool:
    """Whether a result was decoded with Fast-dLLM's approximations (``d1-fast`` & co., full attention only).

    Read from the recorded settings, not the protocol's name, so a protocol added by a package is classified
    too; settings recorded before the modes existed have none of them, i.e. exact decoding. Block models' own
    protocols (TraceRL's dynamic threshold, EOS stop) are their reference decoders, not approximations.
    """
    settings = record["settings"]
    if settings.get("protocol", {}).get("attention", record["model"].get("attention", "full")) != "full":
        return False
    try:
        return recorded_decode(settings, "full").approximate
    except DecodeSettingsError as err:
        raise UserError(f"{record.get('_path', 'a result')}: its recorded decode settings are invalid: {err}") from None


ROW_KEY = ["comparison", "approximate", "table", "baseline", "selection", "model_key", "protocols", "preset"]
CELL_KEY = [*ROW_KEY, "task", "sub"]


def _paths(frame: pd.DataFrame) -> str:
    return ", ".join(frame["path"])


def check_consistency(frame: pd.DataFrame) -> None:
    """Refuse what cannot be shown honestly: duplicates, mixed budgets, mixed lengths inside one column."""
    duplicated = frame[frame.duplicated([*CELL_KEY, "seed"], keep=False)]
    if not duplicated.empty:
        raise UserError(f"the same evaluation (row, cell, seed) is stored twice: {_paths(duplicated)}")
    rl = frame[~frame["baseline"].isin(REFERENCE_BASELINES)]
    for comparison, runs in rl.groupby("comparison", sort=True):
        if runs["budget_hash"].nunique() > 1:
            listing = "; ".join(
                f"budget {digest}: {_paths(group)}" for digest, group in runs.groupby("budget_hash", sort=True)
            )
            raise UserError(f"comparison {comparison!r} mixes RL training budgets (refusing to compare): {listing}")
    for key, group in frame.groupby(["comparison", "table", "length"], sort=True):
        if group["max_completion_length"].nunique() > 1:
            raise UserError(
                f"comparison {key[0]!r} ({key[1]}): nominal length {key[2]} was generated with "
                f"different canvases {sorted(group['max_completion_length'].unique())}: {_paths(group)}"
            )
    for _, group in frame.groupby(CELL_KEY, sort=True):
        if group["length"].nunique() > 1:
            raise UserError(f"one cell pools results of different lengths: {_paths(group)}")


def row_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Reference rows (base, then sft) first, then RL rows alphabetically, a run's final row before its best one -
    stable across regenerations."""
    rank = frame["baseline"].map(lambda name: REFERENCE_BASELINES.index(name) if name in REFERENCE_BASELINES else 9)
    chosen = frame["selection"].map(lambda name: name != "final")
    return frame.assign(_rank=rank, _best=chosen).sort_values(
        ["_rank", "baseline", "_best", "model", "protocols", "preset"], kind="stable"
    )


def row_name(info: Mapping[str, str]) -> str:
    """A displayed row's short name (plot legends): its baseline, marked when it is a run's best checkpoint."""
    return info["Baseline"] + (" (best)" if info["Checkpoint"].startswith("best") else "")


def checkpoint_label(group: pd.DataFrame) -> str:
    """Which checkpoint of its runs a row reports (its "Checkpoint" column): ``start`` for base/sft, ``final``, or
    ``best on validation`` with the chosen steps (one per run: task, seed)."""
    first = group.iloc[0]
    if first["baseline"] in REFERENCE_BASELINES:
        return "start"
    if first["selection"] == "final":
        return "final"
    steps = sorted({int(step) for step in group["selection_step"]})
    return f"best on validation (step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))})"


def join_unique(values: Sequence[Any]) -> str:
    """The distinct values, sorted, as one cell's text: ``"0, 1, 2"``."""
    return ", ".join(str(value) for value in sorted(set(values)))
