"""Provenance of a record: where and with what code it was produced (hardware, package versions, git commit and
dirty flag, command line), stored in every record's ``environment``, and the short labels the tables show for it.

Why it is captured at write time: a number is only as trustworthy as the code that made it, and the code that was
checked out when a record was written cannot be recovered afterwards.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

ENV_PACKAGES = ("torch", "transformers", "accelerate", "datasets", "lm_eval", "math_verify", "stabledrl_bench")
GENERATED_PATHS = ("results", "leaderboard.md")


PACKAGE_DIR = Path(__file__).resolve().parent.parent


def git_state(directory: Path = PACKAGE_DIR) -> dict[str, Any]:
    """Commit and dirty flag of the git work tree holding ``directory`` (by default: this package's code);
    ``None`` values outside git."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    # What the commands themselves write (results/, the regenerated leaderboard.md) must not make every later run
    # "dirty": a second `reproduce` on the same checkout would otherwise disown results of committed code.
    excluded = (f":(top,exclude){path}" for path in GENERATED_PATHS)
    status = git("status", "--porcelain", "--untracked-files=all", "--", ":(top)", *excluded)
    if status is None:
        return {"commit": commit.strip(), "dirty": None}
    return {"commit": commit.strip(), "dirty": any(_changes_code(line) for line in status.splitlines())}


# An untracked file makes the tree dirty only if it can change what runs: a second runs folder (`--runs runs2`),
# a scratch log or a downloaded checkpoint does not.
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".cfg")


def _changes_code(status_line: str) -> bool:
    """One ``git status --porcelain`` line: any change to a tracked file, or an untracked code or config file."""
    if status_line.startswith("?? "):
        return status_line[3:].strip().strip('"').endswith(CODE_SUFFIXES)
    return bool(status_line.strip())


def _gpu_names() -> list[str]:
    try:
        import torch  # here, not at the top: optional, and slow to import for a reader of records
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in ``/proc/cpuinfo`` (empty where there is none); read once per program."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            break
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return fields


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; :func:`platform.processor` elsewhere)."""
    return _cpuinfo().get("model name") or platform.processor() or ""


def cpu_signature() -> str | None:
    """Family, model, stepping and a hash of the feature flags: virtual machines often report one generic model name
    ("Intel(R) Xeon(R) Processor") for different CPUs, and these tell them apart."""
    info = _cpuinfo()
    if "flags" not in info:
        return None
    flags = hashlib.sha256(" ".join(sorted(info["flags"].split())).encode()).hexdigest()[:12]
    return f"family {info.get('cpu family')} model {info.get('model')} stepping {info.get('stepping')} flags {flags}"


def cpu_numerics() -> dict[str, Any]:
    """What besides the code decides the bits a CPU computation produces: the CPU model, the vector instruction set
    torch's kernels dispatch to, and the intra-op thread count.

    Measured on the tiny preset: the same code and seed give the same weights bit for bit run after run on one
    machine, whatever the load, but other bits at another thread count or on another CPU model (the BLAS and
    oneDNN kernels block and reduce differently). A rerun is only expected to match bit for bit where these match.
    ``emulated`` lists the variables that forced other kernels (:data:`EMULATION_VARIABLES`), when any is set.
    """
    emulated = {name: value for name in EMULATION_VARIABLES if (value := os.environ.get(name))}
    try:
        import torch  # here, not at the top: optional, and slow to import for a reader of records
    except ImportError:
        return {"cpu": cpu_model(), "cpu_signature": cpu_signature()}
    return {
        "cpu": cpu_model(),
        "cpu_signature": cpu_signature(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        **({"emulated": emulated} if emulated else {}),  # another platform's kernels, forced (the platform study)
    }


# What forces other kernels on one machine (the platform study, `regress --measure-tolerance`): torch's vector
# instruction set, and the code paths of the BLAS (MKL) and of oneDNN.
EMULATION_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment_info() -> dict[str, Any]:
    """Where and with what a result was produced, so that a leaderboard row can say which hardware and code made it.

    The git state is that of the repository containing this package (``dirty`` when ``git status --porcelain``
    lists a change outside ``results/`` and ``leaderboard.md`` that can change what runs, see :func:`_changes_code`),
    because results from uncommitted code cannot be reproduced from the commit alone.
    """
    return {
        "python": platform.python_version(),
        "hardware": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "gpus": _gpu_names(),
            **cpu_numerics(),
        },
        "packages": {name: _package_version(name) for name in ENV_PACKAGES},
        "git": git_state(),
        "argv": list(sys.argv),
    }


def hardware_label(environment: Mapping[str, Any]) -> str:
    """Short hardware description for a table cell: ``"1× NVIDIA H200"`` or ``"CPU ×2"``."""
    hardware = environment.get("hardware") or {}
    gpus = hardware.get("gpus") or []
    if gpus:
        names = sorted(set(gpus))
        return ", ".join(f"{gpus.count(name)}× {name}" for name in names)
    return f"CPU ×{hardware.get('cpu_count', '?')}"


def code_label(environment: Mapping[str, Any]) -> str:
    """The code that produced a result, for a table cell: ``"00ef291"``, ``"00ef291 dirty"`` or ``"unknown"``.

    ``dirty`` means uncommitted changes (outside ``results/``) to tracked files, or untracked code or config files
    (:data:`CODE_SUFFIXES`), were present: that code cannot be checked out. Records written before untracked
    files were sorted this way call a tree dirty for any untracked file, e.g. a second runs folder.
    """
    git = environment.get("git") or {}
    commit = git.get("commit")
    if not commit:
        return "unknown"
    state = {True: " dirty", False: "", None: " dirty?"}[git.get("dirty")]
    return f"{str(commit)[:7]}{state}"


def code_counts(states: Iterable[Mapping[str, Any] | None]) -> dict[str, int]:
    """How many runs each code version trained (:func:`code_label` of each run's :func:`git_state`, most first).

    A run cache outlives the code that filled it, so a record built from cached runs may mix runs of several code
    versions; counting them makes that visible. A run that recorded no code state counts as ``"unknown"``.
    """
    return dict(Counter(code_label({"git": state or {}}) for state in states).most_common())


def unknown_commit(record: Mapping[str, Any]) -> list[str]:
    """One problem line when the commit a record says it was made at is not in this repository (none when it
    names no commit, or git is not here)."""
    commit = (record["environment"].get("git") or {}).get("commit")
    if not commit:
        return []
    try:
        done = subprocess.run(
            ["git", "cat-file", "-e", f"{commit}^{{commit}}"],
            cwd=PACKAGE_DIR,
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return []  # no git here: nothing to compare with
    return [] if done.returncode == 0 else [f"recorded commit {commit[:12]} is not in this repository"]


def forced_environment(forced: Mapping[str, str]) -> dict[str, str]:
    """This process's environment for a child that runs under exactly the kernels ``forced`` names: every other
    :data:`EMULATION_VARIABLES` inherited from here is dropped. Otherwise a platform would silently carry what the
    caller's shell forced (``ATEN_CPU_CAPABILITY=avx2`` left set, say): its records would name both and its name
    would not say what ran."""
    kept = {key: value for key, value in os.environ.items() if key not in EMULATION_VARIABLES}
    return {**kept, **forced}
