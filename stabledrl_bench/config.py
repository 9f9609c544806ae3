"""Typed configuration: dataclasses filled from YAML/JSON with one-line errors for every mistake.

Researchers edit these files by hand; a typo must fail loudly (``unknown key 'lerning_rate' in train.yaml``),
never be silently ignored and never surface as a traceback deep inside the trainer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from stabledrl_bench.errors import INT64_LIMIT, UserError
from stabledrl_bench.migrations import CONFIG_KEY_RENAMES, renamed_keys

T = TypeVar("T")


def _check_type(value: Any, annotation: Any, where: str) -> Any:
    """Validate (and lightly coerce int -> float) ``value`` against a dataclass field annotation."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check_type(value, option, where)
            except UserError as exc:
                errors.append(str(exc))
        raise UserError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping, got {type(value).__name__}")
        return from_dict(annotation, value, where)
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping, got {type(value).__name__}")
        key_type, value_type = typing.get_args(annotation) or (Any, Any)
        return {
            _check_type(k, key_type, f"{where} key"): _check_type(v, value_type, f"{where}.{k}")
            for k, v in value.items()
        }
    if origin in (list, tuple) or annotation in (list, tuple):
        if not isinstance(value, list | tuple):
            hint = f" (a list is written [{value}])" if isinstance(value, str) else ""
            raise UserError(f"{where}: expected a list, got {type(value).__name__}{hint}")
        args = typing.get_args(annotation)
        item_type = args[0] if args else Any
        items = [_check_type(v, item_type, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin or annotation) is tuple else items
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise UserError(f"{where}: expected a number, got {value!r}")  # NaN is never a setting
        if isinstance(value, int) and abs(value) >= INT64_LIMIT:
            raise UserError(f"{where}: {value} is out of range")
        return float(value)
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: expected an integer, got {value!r}")
        if abs(value) >= INT64_LIMIT:
            raise UserError(f"{where}: {value} does not fit in 64 bits")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where}: expected true/false, got {value!r}")
        return value
    if annotation is str:
        if not isinstance(value, str):
            raise UserError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise :class:`UserError`."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    renamed = renamed_keys(unknown, fields, CONFIG_KEY_RENAMES)  # an old file is told the new name
    if renamed:
        raise UserError(f"{where}: renamed key(s) {', '.join(renamed)}")
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(fields)}")
    required = [n for n, f in fields.items() if f.default is f.default_factory is dataclasses.MISSING and f.init]
    missing = [name for name in required if name not in data]
    if missing:
        raise UserError(f"{where}: missing key(s) {', '.join(missing)}")
    hints = typing.get_type_hints(cls)
    kwargs = {
        name: _check_type(_over_default(fields[name], value), hints[name], f"{where}.{name}")
        for name, value in data.items()
    }
    try:
        obj = cls(**kwargs)
    except TypeError as exc:
        raise UserError(f"{where}: {exc}") from exc
    return obj


def _over_default(field: dataclasses.Field, value: Any) -> Any:
    """A mapping given for a field whose default is a dataclass instance, merged over that default: a partial
    ``optim:`` (or ``--set optim.learning_rate=...``) of an SFT config changes those keys of the SFT's own optimizer
    defaults, not of the optimizer class's (which are the RL recipe's: another schedule, clipping and warm-up)."""
    if not isinstance(value, dict) or field.default_factory is dataclasses.MISSING:
        return value
    default = field.default_factory()
    if not dataclasses.is_dataclass(default) or isinstance(default, type):
        return value
    return deep_merge(dataclasses.asdict(default), value)


def require_finite(**values: float) -> None:
    """Numbers that must be finite (a learning rate, a temperature): one line names the first that is not."""
    for name, value in values.items():
        if not math.isfinite(value):
            raise UserError(f"{name} must be a finite number, got {value}")


def require_positive(**values: int | None) -> None:
    """Counts a config states must be at least 1 (None = not set); one clear line names the first that is not."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise UserError(f"{name} must be positive, got {value}")


# Settings that say where and how verbosely a run goes, not what it computes: never part of a run's identity
# (the key that decides whether a finished or checkpointed run may be reused or resumed).
NOT_IDENTITY = ("output_dir", "progress", "check_model", "save_every", "keep_checkpoints", "log_with")


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal data, equal text (the input of :func:`stable_hash`)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def stable_hash(value: Any) -> str:
    """``sha256(canonical JSON)[:12]``: key order and whitespace do not change it, any value does.

    Identifies a configuration (a training budget, an experiment) in records and folder names.
    """
    try:
        text = canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise UserError(f"cannot hash {type(value).__name__}: not plain JSON data ({exc})") from exc
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: ``1e-6`` is the number, not the string (YAML 1.1, which PyYAML
    follows, wants ``1.0e-6``). Learning rates are written ``1e-6`` in every paper and command line."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def configs_dir() -> Path:
    """The shipped ``configs/`` folder (recipes, presets, accelerate files), package ``stabledrl_bench.configs``."""
    from importlib.resources import files

    return Path(str(files("stabledrl_bench.configs")))


def read_recipe(name: str) -> dict[str, Any]:
    """A GPU recipe by its path under ``configs/recipes/`` (e.g. ``stabledrl/_base.yaml``), ``base:`` merged."""
    return read_mapping(configs_dir() / "recipes" / name)


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def read_mapping(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML or JSON mapping; a missing file or a syntax error is one clear line.

    A top-level ``base: other.yaml`` (relative to this file) is read first and deep-merged under this file, so
    recipes share one base per method and state only what differs per task.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    if path.resolve() in _seen:
        raise UserError(f"{path}: 'base' files include each other in a cycle")
    try:
        data = yaml.load(path.read_bytes().decode("utf-8-sig"), Loader=_Loader)
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"{path}: not valid YAML/JSON ({first})") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    require_bounded(data, str(path))
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise UserError(f"{path}: 'base' must be a file name")
    return deep_merge(read_mapping(path.parent / base, (*_seen, path.resolve())), data)


MAX_VALUES = 100_000  # values a config or record may hold once YAML aliases are expanded


def require_bounded(data: Any, where: str, limit: int = MAX_VALUES) -> None:
    """Refuse data that expands to more than ``limit`` values: a YAML alias bomb is a few lines that share nodes,
    which anything walking the data (hashing a config, writing a record) expands exponentially. Stops counting at
    the limit, so the check itself stays cheap."""
    count, stack = 0, [data]
    while stack:
        value = stack.pop()
        count += 1
        if count > limit:
            raise UserError(f"{where}: more than {limit:,} values once YAML aliases are expanded; refused")
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)


def parse_json(text: str, where: str) -> Any:
    """JSON text, or one line naming ``where``: invalid JSON, an integer longer than Python reads, nesting deeper
    than the parser's recursion limit."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError, so is the int digit limit
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"{where}: not readable JSON ({type(exc).__name__}: {first})") from exc


def dotted_overrides(items: Sequence[str], option: str = "--set") -> dict[str, Any]:
    """``["optim.learning_rate=1e-6", "budget.num_generations=16"]`` as the nested mapping they set, each value
    read as JSON where it is JSON (so ``1e-6`` is a number, which YAML 1.1 would read as a string), else as a YAML
    scalar or flow collection (``true``, ``[a, b]``, ``{beta: 0}``); one error line for a malformed item.

    Why: every field of a config can then be overridden on the command line with the names of the config file,
    and checked by the same :func:`from_dict` as the file, instead of a hand-picked list of flags."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise UserError(f"{option} {item!r}: expected key.path=value, e.g. optim.learning_rate=1e-6")
        try:
            value = json.loads(text)  # first: YAML 1.1 reads 1e-6 as a string
        except ValueError:
            try:
                value = yaml.safe_load(text) if text.strip() else ""
            except yaml.YAMLError as exc:
                raise UserError(f"{option} {item!r}: the value is not YAML ({str(exc).splitlines()[0]})") from None
        nested: Any = value
        for part in reversed(parts):
            nested = {part: nested}
        out = deep_merge(out, nested)
    return out


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``; nested mappings merge key by key, everything else is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
