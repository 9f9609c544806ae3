"""The engine's layers (README, "What is where"): every import of a ``stabledrl_bench`` module runs down, never up.

The package is split into parts, each with a place ``(layer, rank)`` in :data:`PLACES`. A module may import its
own part and any part placed before it, nothing else:

* layer 0, the shared utilities: the top-level modules ``errors``, ``atomic``, ``config``, ``migrations``,
  ``plots``, ``processes`` (they import one another freely), the package's ``__init__`` and ``configs/``;
* layer 1: ``core/``, then the plug-ins built on it, ``tasks/`` and ``baselines/`` (neither imports the other);
* layer 2, in this order: ``reporting/`` (records and what is computed from them) < ``evaluation/`` (a model's
  records) < ``training/`` (which validates through ``evaluation/``);
* layer 3, in this order: ``experiments/`` < ``regression/``;
* layer 4: ``cli.py`` and ``__main__.py``.

Every import counts: at any depth (inside functions, under ``if TYPE_CHECKING``), ``import x``, ``from x import y``
and relative imports. ``tasks/lmeval/`` is lm-eval's task folder (package data that lm-eval loads by path, not a
package), so like the CLI it sits on top and is not checked. The last tests feed the checker violations written
for it, so that the check cannot pass by finding nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "stabledrl_bench"
# Where each installed package's files live (pyproject.toml's package-dir).
FOLDERS = {
    PACKAGE: ROOT / "stabledrl_bench",
    f"{PACKAGE}.tasks": ROOT / "tasks",
    f"{PACKAGE}.baselines": ROOT / "baselines",
    f"{PACKAGE}.configs": ROOT / "configs",
}
SHARED = {"errors", "atomic", "config", "migrations", "plots", "processes", "configs"}
TOP = {"cli", "__main__"}
PLACES = {
    "shared": (0, 0),
    "core": (1, 0),
    "tasks": (1, 1),
    "baselines": (1, 1),
    "reporting": (2, 0),
    "evaluation": (2, 1),
    "training": (2, 2),
    "experiments": (3, 0),
    "regression": (3, 1),
    "cli": (4, 0),
}


def part_of(module: str) -> str | None:
    """The part (a key of :data:`PLACES`) that ``module`` belongs to; None for a module no part claims."""
    if module == PACKAGE:
        return "shared"
    first = module.removeprefix(f"{PACKAGE}.").split(".")[0]
    if first in SHARED:
        return "shared"
    if first in TOP:
        return "cli"
    return first if first in PLACES else None


def package_sources() -> dict[str, tuple[str, bool]]:
    """Every module of the installed package: its dotted name -> (source, whether it is a package's ``__init__``).
    Folders without an ``__init__.py`` are not packages (``tasks/lmeval/``) and are left out."""
    sources = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(folder)
            if any(not (folder / parent / "__init__.py").is_file() for parent in [*relative.parents][:-1]):
                continue
            parts = [package, *relative.with_suffix("").parts]
            is_init = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_init else parts)
            sources[name] = (path.read_text(encoding="utf-8"), is_init)
    return sources


def imported_modules(module: str, source: str, *, is_init: bool = False) -> Iterator[str]:
    """The ``stabledrl_bench`` modules that ``source``, the code of ``module`` (a package's ``__init__`` when
    ``is_init``), imports at any depth. ``from stabledrl_bench import y`` imports the part ``y`` where ``y`` is one
    (``from stabledrl_bench import baselines``), else the package itself (``__version__``)."""
    package = module.split(".") if is_init else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names = [
                f"{origin}.{alias.name}" if origin == PACKAGE and part_of(f"{origin}.{alias.name}") else origin
                for alias in node.names
            ]
        else:
            continue
        yield from (name for name in names if name == PACKAGE or name.startswith(f"{PACKAGE}."))


def why_not(part: str, other: str) -> str | None:
    """Why ``part`` may not import ``other``; None when it may."""
    (layer, rank), (other_layer, other_rank) = PLACES[part], PLACES[other]
    if other == part or (layer, rank) > (other_layer, other_rank):
        return None
    if other_layer > layer:
        return f"{part}/ is layer {layer}, {other}/ layer {other_layer}"
    if other_rank > rank:
        return f"layer {layer}: {part}/ comes before {other}/"
    return f"layer {layer}: {part}/ and {other}/ do not import each other"


def layer_violations(sources: Mapping[str, tuple[str, bool]]) -> list[str]:
    """One line per import against the layers (``module -> imported module (why)``), and one per module that no
    part claims (place its part in :data:`PLACES` and in the README)."""
    problems = []
    for module, (source, is_init) in sorted(sources.items()):
        part = part_of(module)
        if part is None:
            problems.append(f"{module}: in no layer (add its part to PLACES and the README)")
            continue
        for target in sorted(set(imported_modules(module, source, is_init=is_init))):
            other = part_of(target)
            if other is None:
                problems.append(f"{module} -> {target} (a module in no layer)")
            elif why := why_not(part, other):
                problems.append(f"{module} -> {target} ({why})")
    return problems


def test_every_import_runs_down_the_layers() -> None:
    sources = package_sources()
    problems = layer_violations(sources)
    assert not problems, "imports against the layers (README, What is where):\n" + "\n".join(problems)


def test_the_check_sees_the_whole_package() -> None:
    sources = package_sources()
    expected = {
        "stabledrl_bench.cli",
        "stabledrl_bench.core.models.interface",
        "stabledrl_bench.training.trainer",
        "stabledrl_bench.experiments.stress.recheck",
        "stabledrl_bench.tasks.base",
        "stabledrl_bench.tasks.graders",
        "stabledrl_bench.baselines.grpo",
    }
    assert expected <= set(sources)
    assert {part_of(module) for module in sources} == set(PLACES)
    imports = [t for m, (source, init) in sources.items() for t in imported_modules(m, source, is_init=init)]
    assert len(imports) > 600  # the package's own imports are found (about 1300 names today)


def test_the_check_catches_imports_up_and_across() -> None:
    sources = {
        # up a layer, inside a function, relative
        "stabledrl_bench.evaluation.up": ("def f():\n    from ..experiments.stress.recheck import recheck\n", False),
        # across layer 2 against its order, relative (``from ..training``)
        "stabledrl_bench.reporting.fake": ("from ..training import trainer\n", False),
        # up two layers, plain import
        "stabledrl_bench.core.fake": ("import stabledrl_bench.evaluation.native\n", False),
        # across layer 2 against its order, under TYPE_CHECKING
        "stabledrl_bench.evaluation.fake": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from stabledrl_bench.training.runlog import X\n",
            False,
        ),
        # across layer 3 against its order, from a package's __init__
        "stabledrl_bench.experiments.fakepkg": ("from ...regression import cases\n", True),
        # beside each other in layer 1
        "stabledrl_bench.tasks.fake": ("from stabledrl_bench import baselines\n", False),
        # a module no part claims
        "stabledrl_bench.nowhere": ("", False),
        # allowed: down, along the order, its own part, the shared utilities, the package itself
        "stabledrl_bench.training.fake": (
            "from stabledrl_bench.reporting.results import read_result\n"
            "from stabledrl_bench.evaluation import native\n"
            "from . import runlog\nfrom .. import errors\nimport stabledrl_bench\n",
            False,
        ),
        "stabledrl_bench.regression.fake": (
            "def g():\n    from stabledrl_bench.experiments.presets import presets\n",
            False,
        ),
        "stabledrl_bench.atomic": ("from stabledrl_bench.errors import UserError\n", False),
        "stabledrl_bench.cli": ("from stabledrl_bench.regression.command import command\n", False),
    }
    assert layer_violations(sources) == [
        "stabledrl_bench.core.fake -> stabledrl_bench.evaluation.native (core/ is layer 1, evaluation/ layer 2)",
        "stabledrl_bench.evaluation.fake -> stabledrl_bench.training.runlog (layer 2: evaluation/ comes before "
        "training/)",
        "stabledrl_bench.evaluation.up -> stabledrl_bench.experiments.stress.recheck (evaluation/ is layer 2, "
        "experiments/ layer 3)",
        "stabledrl_bench.experiments.fakepkg -> stabledrl_bench.regression (layer 3: experiments/ comes before "
        "regression/)",
        "stabledrl_bench.nowhere: in no layer (add its part to PLACES and the README)",
        "stabledrl_bench.reporting.fake -> stabledrl_bench.training (layer 2: reporting/ comes before training/)",
        "stabledrl_bench.tasks.fake -> stabledrl_bench.baselines (layer 1: tasks/ and baselines/ do not import "
        "each other)",
    ]
