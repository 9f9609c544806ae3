"""Shipped configs: every recipe loads and builds its baseline; `base:` merging; accelerate configs parse."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stabledrl_bench.config import deep_merge, read_mapping
from stabledrl_bench.core.baseline import build_baseline
from stabledrl_bench.errors import UserError
from stabledrl_bench.tasks import REWARD_PROFILES, get_task
from stabledrl_bench.training.trainer import TrainConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RECIPES = sorted(p for p in (CONFIGS / "recipes").rglob("*.yaml") if not p.name.startswith("_"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recipe_loads_and_builds(path):
    cfg = TrainConfig.from_file(path)
    baseline = build_baseline(cfg.baseline, **cfg.baseline_options)
    task = get_task(cfg.task)
    assert cfg.protocol in task.protocols and cfg.reward_profile in REWARD_PROFILES
    assert cfg.train_split in (*task.splits, "generated")
    assert cfg.budget.max_steps % cfg.budget.num_iterations == 0
    assert baseline.name == path.parent.name


def test_stabledrl_recipe_is_the_official_setting():
    cfg = TrainConfig.from_file(CONFIGS / "recipes" / "stabledrl" / "countdown.yaml")
    b = cfg.budget
    assert (b.max_steps, b.prompts_per_step, b.num_generations, b.num_iterations) == (2000, 32, 16, 2)
    assert (cfg.optim.learning_rate, cfg.optim.max_grad_norm, cfg.seed) == (1e-6, 0.2, 113)
    assert cfg.lora is None and cfg.bf16


def test_base_files_deep_merge_and_cycles_are_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("budget: {max_steps: 4, num_iterations: 2}\nseed: 1\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nbudget: {max_steps: 8}\n")
    assert read_mapping(tmp_path / "b.yaml") == {"budget": {"max_steps": 8, "num_iterations": 2}, "seed": 1}
    assert deep_merge({"x": {"y": 1}}, {"x": 2}) == {"x": 2}
    (tmp_path / "c.yaml").write_text("base: d.yaml\n")
    (tmp_path / "d.yaml").write_text("base: c.yaml\n")
    with pytest.raises(UserError, match="cycle"):
        read_mapping(tmp_path / "c.yaml")


@pytest.mark.parametrize("name", ["ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3"])
def test_accelerate_configs_parse(name):
    data = yaml.safe_load((CONFIGS / "accelerate" / f"{name}.yaml").read_text())
    assert data["distributed_type"] in ("MULTI_GPU", "FSDP", "DEEPSPEED")
    assert data["mixed_precision"] == "bf16" and data["num_processes"] >= 1
