"""Test-wide settings: nothing may touch the network, and CPU thread counts stay predictable; shared fixtures."""

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_var] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# transformers 5 draws progress bars when it loads and saves weights; the CLI tests read stderr line by line
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# The README's test command runs one pytest-xdist worker per core. Each computes on one intra-op thread, as the
# workers of `reproduce` do: two workers of two threads each on two cores would wait for each other at every
# operation (benchmarks/reports/threads_and_workers.md). Set before torch is imported, so it is torch's default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


import pytest  # noqa: E402  (the environment above must be set before anything imports transformers)

# A 2-layer tiny model: the cheapest real checkpoint, for tests that need a model folder but no particular weights.
# Every built-in baseline, written out independently of the registry (the tests check the registry against it).
BUILTIN_BASELINES = (
    "grpo",
    "spg",
    "espo",
    "trado",
    "stabledrl",
    "stabledrl_clip_only",
    "stabledrl_selfnorm_only",
    "wd1",
    "coupled_grpo",
    "gdpo",
    "cj_grpo",
    "agrpo",
    "justgrpo",
    "gdsd",
    "bgpo",
    "egspo",
    "mdpo",
    "dtreerpo",
    "igpo",
)
# d-TreeRPO's completions are the leaves of one tree per prompt: with these options, 2 x 2 = 4 (a budget's usual G)
TREE_OF_FOUR = {"num_tree_samples": 2, "tree_branch_factor": 2, "tree_contraction_factor": 2}
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def small_budget(**overrides):
    """The cheapest RL budget that still has every part (2 prompts x 4 completions, mu 2, a 16-token canvas)."""
    from stabledrl_bench.core.budget import Budget

    fields = {
        "max_steps": 2,
        "prompts_per_step": 2,
        "num_generations": 4,
        "num_iterations": 2,
        "max_completion_length": 16,
        "diffusion_steps": 8,
        "block_length": 8,
        "temperature": 0.9,
        "max_prompt_length": 32,
    }
    return Budget(**{**fields, **overrides})


def small_warm_start(steps: int = 2):
    """The cheapest warm start: a fresh SMALL tiny model (seed 0), then ``steps`` SFT steps of 4 Sudoku canvases."""
    from stabledrl_bench.experiments.runner import WarmStart
    from stabledrl_bench.training.sft import SFTConfig

    sft = SFTConfig(task="sudoku", max_steps=steps, batch_size=4, max_completion_length=16, progress=False)
    return WarmStart(sft=sft, init={**SMALL, "seed": 0})


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory):
    """A saved small tiny model (seed 0); shared by many tests, so treat it as read-only."""
    from stabledrl_bench.core.models import build_tiny, save_diffusion_lm

    path = tmp_path_factory.mktemp("small-tiny")
    save_diffusion_lm(build_tiny(**SMALL), path)
    return path


@pytest.fixture
def one_thread():
    """Models this small run faster on one intra-op thread (as the stress commands do); restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path for installed-distribution metadata (:func:`install_plugin`); every registry's state
    is restored afterwards."""
    from stabledrl_bench.cli import REGISTRIES

    monkeypatch.syspath_prepend(str(tmp_path))
    for module, attribute in REGISTRIES.values():
        registry = getattr(importlib.import_module(module), attribute)
        registry.entries()  # built-ins loaded before the snapshot
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
        monkeypatch.setattr(registry, "_loaded", False)
    before = set(sys.modules)
    yield tmp_path
    for module in set(sys.modules) - before:
        if module.startswith("sdrl_test_plugin"):
            del sys.modules[module]


def install_plugin(root: Path, group: str, entry: str, target: str, module: str, source: str) -> None:
    """Write ``module.py`` and a dist-info whose entry point ``entry = target`` sits in ``group``, as ``pip install``
    would leave them (``root`` is on sys.path: :func:`plugin_dir`)."""
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry} = {target}\n")
    importlib.invalidate_caches()


# The modules whose tests take minutes in all, slowest first. pytest-xdist gives each worker a whole module at a time
# (`--dist loadfile`, so a module-scoped fixture that launches runs runs once) in collection order
# (`--no-loadscope-reorder`): these start first, and no worker ends the run alone with one of them. (Collecting the
# launching module last instead, so that its launches would run when the other worker had little left, was tried:
# three runs took 664, 829 and 868 s, as one worker then ended the run alone with it.)
SLOWEST_MODULES = (
    "test_multiprocess.py",
    "test_reproduce.py",
    "test_regress.py",
    "test_platforms.py",
    "test_stress.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest modules first, every module's tests in their own order."""
    rank = {name: i for i, name in enumerate(SLOWEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
