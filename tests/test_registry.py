"""Baseline registry: built-in names, errors, official defaults and plugins through real entry points."""

import importlib
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stabledrl_bench.core import registry
from stabledrl_bench.core.estimators import build_estimator
from stabledrl_bench.core.registry import available_baselines, build_baseline, get_baseline
from stabledrl_bench.errors import UserError

BUILTIN = ["grpo", "spg", "espo", "trado", "stabledrl", "stabledrl_clip_only", "stabledrl_selfnorm_only"]


def test_builtin_baselines_are_registered() -> None:
    assert set(BUILTIN) <= set(available_baselines())
    for name in BUILTIN:
        assert get_baseline(name).name == name


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UserError, match=r"unknown baseline 'ppo'.*grpo.*stabledrl"):
        get_baseline("ppo")


def test_unknown_option_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"unknown option.*clip_ratio"):
        build_baseline("stabledrl", clip_ratio=3.0)


@pytest.mark.parametrize(
    ("name", "estimator", "needs_old", "needs_ref", "coupled", "defaults"),
    [
        ("grpo", "d1_one_step", True, True, True, {"epsilon": 0.5, "beta": 0.04, "p_mask_prompt": 0.15}),
        ("spg", "spg_block", False, False, True, {"omega": 0.5, "eubo_beta": 1.5, "num_t": 2, "block_length": None}),
        ("espo", "espo_elbo", True, True, True, {"epsilon": 0.2, "beta": 1e-3, "num_mc": 2, "reduce_var": True}),
        ("trado", "trace_replay", True, False, True, {"epsilon": 0.2, "beta": 0.01, "normalize": "length"}),
        ("stabledrl", "spg_block", True, False, False, {"mode": "official", "clip_threshold": 5.0, "omega": 0.5}),
    ],
)
def test_official_defaults_and_estimator_wiring(
    name: str, estimator: str, needs_old: bool, needs_ref: bool, coupled: bool, defaults: dict
) -> None:
    baseline = build_baseline(name)
    assert (baseline.estimator, baseline.needs_old, baseline.needs_ref) == (estimator, needs_old, needs_ref)
    assert baseline.config.coupled == coupled
    assert {k: getattr(baseline.config, k) for k in defaults} == defaults
    build_estimator(baseline.estimator, **baseline.estimator_kwargs())  # every option is one the estimator takes


def test_clip_threshold_ablation_is_a_stabledrl_option() -> None:
    for threshold in (1.0, 5.0, 100.0, 1000.0):
        config = build_baseline("stabledrl", clip_threshold=threshold).config
        assert (config.clip_low, config.clip_high) == (-math.inf, math.log(threshold))
    paper = build_baseline("stabledrl", mode="paper", epsilon=0.1).config
    assert (paper.clip_low, paper.clip_high) == (math.log(0.9), math.log(1.1))
    assert build_baseline("stabledrl_selfnorm_only").config.clip_high == math.inf


PLUGIN_SOURCE = """
from stabledrl_bench.core.registry import Baseline, register_baseline


@register_baseline("{name}")
class PluginBaseline(Baseline):
    estimator = "d1_one_step"
"""


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path that will hold installed-distribution metadata; the registry state is restored."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_loaded_plugins", False)
    before = set(sys.modules)
    yield tmp_path
    for module in set(sys.modules) - before:
        if module.startswith("sdrl_test_plugin"):
            del sys.modules[module]


def _install(root: Path, dist: str, module: str, source: str) -> None:
    """Write ``module.py`` and a ``<dist>.dist-info`` whose entry point exposes it in the baselines group."""
    (root / f"{module}.py").write_text(source)
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{dist} = {module}\n")
    importlib.invalidate_caches()


def test_plugin_baseline_through_entry_points(plugin_dir: Path) -> None:
    _install(plugin_dir, "sdrl_test_plugin_ok", "sdrl_test_plugin_ok", PLUGIN_SOURCE.format(name="my_method"))
    names = list(available_baselines())
    assert "my_method" in names and set(BUILTIN) <= set(names)
    assert build_baseline("my_method").estimator == "d1_one_step"


def test_plugin_that_fails_to_import_is_named(plugin_dir: Path) -> None:
    _install(plugin_dir, "sdrl_test_plugin_bad", "sdrl_test_plugin_bad", "raise RuntimeError('boom')\n")
    with pytest.raises(UserError, match=r"sdrl_test_plugin_bad.*failed to load: boom"):
        available_baselines()
