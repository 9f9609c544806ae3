"""One registry type for every plug-in point: baselines, estimators, advantage rules, tasks, reward profiles,
evaluation protocols and model families.

Each kind has one :class:`Registry` instance, defined next to the thing it registers (``BASELINES`` in
:mod:`stabledrl_bench.core.baseline`, ``ESTIMATORS`` in :mod:`stabledrl_bench.core.estimators`, ...). All of them
behave the same way, so a researcher who has added one kind of plug-in knows how to add every other:

* ``@REGISTRY.register("name")`` (or ``REGISTRY.register("name", obj)``) adds an entry; registering another object
  under a taken name is an error naming the module that holds it;
* ``REGISTRY.get("name")`` returns it, or raises one clear line: ``unknown baseline 'ppo'; known: grpo, spg, ...``;
* packages add entries without editing this repository through the kind's entry-point group, e.g.::

      [project.entry-points."stabledrl_bench.baselines"]
      my_method = "my_package.my_module"           # importing the module runs its @register
      [project.entry-points."stabledrl_bench.reward_profiles"]
      digits = "my_package.rewards:digit_share"    # an object: registered under the entry point's name

Built-in entries and plugins are loaded lazily, on the first lookup, so importing a registry costs nothing.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Sequence
from importlib import import_module, metadata
from typing import Generic, TypeVar, overload

from stabledrl_bench.errors import UserError

T = TypeVar("T")

ENTRY_POINT_PREFIX = "stabledrl_bench."


class Registry(Generic[T]):
    """Names -> objects of one kind, with duplicate detection, lazy built-ins and entry-point plugins.

    ``kind`` names the entries in messages (``"baseline"``); ``group`` is the entry-point group (``"baselines"``
    becomes ``stabledrl_bench.baselines``); ``builtins`` are modules whose import registers the built-in entries;
    ``check(name, obj)`` validates (and may complete) an object as it is registered.
    """

    def __init__(
        self,
        kind: str,
        group: str,
        *,
        builtins: Sequence[str] = (),
        check: Callable[[str, T], T] | None = None,
    ) -> None:
        self.kind = kind
        self.group = ENTRY_POINT_PREFIX + group
        self._builtins = tuple(builtins)
        self._check = check
        self._entries: dict[str, T] = {}
        self._loaded = False

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T) -> T: ...

    def register(self, name: str, obj: T | None = None) -> T | Callable[[T], T]:
        """Add ``obj`` under ``name``; without ``obj``, a decorator that does so."""

        def add(item: T) -> T:
            if self._check is not None:
                item = self._check(name, item)
            existing = self._entries.get(name)
            if existing is not None and existing is not item:
                where, here = (getattr(i, "__module__", type(i).__module__) for i in (existing, item))
                twice = where.endswith(f".{here}") or here.endswith(f".{where}")
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by {where})"
                    + (
                        f": the same file was imported a second time as {here}; import the package's copy "
                        "(stabledrl_bench.baselines, .tasks), not the repository's top-level folder"
                        if twice
                        else ""
                    )
                )
            self._entries[name] = item
            return item

        return add if obj is None else add(obj)

    def _load(self) -> None:
        """Import the built-in entries and, once, every plugin of the entry-point group."""
        if self._loaded:
            return
        self._loaded = True  # first: a plugin module may look entries up while it is imported
        for module in self._builtins:
            import_module(module)
        for entry in metadata.entry_points(group=self.group):
            try:
                loaded = entry.load()
            except Exception as exc:  # a broken plugin must name itself, not break the built-ins silently
                raise UserError(f"{self.kind} plugin {entry.name!r} ({entry.value}) failed to load: {exc}") from exc
            if not isinstance(loaded, types.ModuleType) and self._entries.get(entry.name) is not loaded:
                self.register(entry.name, loaded)

    def get(self, name: str) -> T:
        """The entry called ``name``; an unknown name is one line listing the known ones."""
        self._load()
        if name not in self._entries:
            raise UserError(f"unknown {self.kind} {name!r}; known: {', '.join(self._entries) or 'none'}")
        return self._entries[name]

    def entries(self) -> dict[str, T]:
        """Every entry by name, built-ins first, then plugins, in registration order."""
        self._load()
        return dict(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return list(self.entries().items())

    def values(self) -> list[T]:
        return list(self.entries().values())

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries())

    def __len__(self) -> int:
        return len(self.entries())


def subclass_check(base: type, attribute: str = "name") -> Callable[[str, type], type]:
    """A ``check`` for registries of classes: the entry must subclass ``base``; its key is set as ``attribute``.

    Setting ``cls.<attribute>`` here keeps one source for a class's name (the ``register`` call), so a record, an
    error message and the registry can never disagree about what an entry is called.
    """

    def check(name: str, cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"{name!r} must be a {base.__name__} subclass, got {cls!r}")
        setattr(cls, attribute, name)
        return cls

    return check
