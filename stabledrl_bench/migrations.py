"""Everything this version does to read what older versions wrote, in one place.

Files outlive the code that wrote them: configs in users' repositories, run logs and result records committed with
papers. Renaming a field must not orphan them, and must not silently accept a stale name either. So an old name is
either read under its new name (files this package wrote: records, logs) or refused with a pointer to the new name
(files people write: configs, baseline options). Each table below says which, and what is still read:

* result records of schema v1 (:data:`RESULT_SCHEMA_RENAMES`, :func:`upgraded_result`);
* run logs written before a metric took TRL's name (:data:`LOG_METRIC_RENAMES`, :func:`upgraded_log_record`);
* training-reward tables written before seeds were recorded (:func:`upgraded_training_rewards`);
* config and decode-settings keys renamed so that one concept has one name (:data:`CONFIG_KEY_RENAMES`: refused in
  a config with the new name given; read under the new name in a stored result's settings);
* baseline options (:data:`BASELINE_OPTION_RENAMES`: refused with the new name given).

Two compatibilities are structural and live where they must: a budget's ``rollout_decode`` is left out of its hash
at its default (``core/budget.py``), and decode settings recorded before a field existed read back at that
field's default, exact decoding (``evaluation/native.py: stored_settings``).

This module imports nothing of the package, so every layer may use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: importing pandas costs every command a second
    import pandas as pd

CONFIG_KEY_RENAMES = {"completion_length": "max_completion_length", "gen_length": "max_completion_length"}
BASELINE_OPTION_RENAMES = {"num_t": "num_mc"}
LOG_METRIC_RENAMES = {"clip_frac": "clip_ratio"}
# schema -> {old field: new field}; v1 records (written before one name per concept) differ in the canvas field.
RESULT_SCHEMA_RENAMES = {"stabledrl-bench/result/v1": {"actual_gen_length": "max_completion_length"}}


def renamed_keys(unknown: list[str], known: set[str] | dict[str, Any], table: Mapping[str, str]) -> list[str]:
    """The keys of ``unknown`` that are old names of a ``known`` key, as ``"old (now new)"``."""
    return [f"{key} (now {table[key]})" for key in unknown if table.get(key) in known]


def upgraded_result(record: Mapping[str, Any], schema: str) -> dict[str, Any]:
    """``record`` in schema ``schema``: an older record's renamed fields under their new names (the file on disk
    is never rewritten, so its samples' sha256 stays valid). A record holding both names keeps the old one, which
    the loader then refuses as an unknown key."""
    renames = RESULT_SCHEMA_RENAMES.get(record.get("schema", ""))
    if renames is None:
        return dict(record)

    def name(key: str) -> str:
        return renames[key] if key in renames and renames[key] not in record else key

    return {"schema": schema} | {name(key): value for key, value in record.items() if key != "schema"}


def upgraded_log_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A run-log record with old metric names under their current names."""
    return {LOG_METRIC_RENAMES.get(key, key): value for key, value in record.items()}


def upgraded_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Stored decode settings with renamed keys (e.g. ``gen_length``) under their current names."""
    return {CONFIG_KEY_RENAMES.get(key, key): value for key, value in settings.items()}


def upgraded_training_rewards(rewards: pd.DataFrame) -> pd.DataFrame:
    """A training-reward table; one written before seeds were recorded holds seed 0 only."""
    if "seed" not in rewards.columns:
        rewards = rewards.copy()
        rewards.insert(1, "seed", 0)
    return rewards
