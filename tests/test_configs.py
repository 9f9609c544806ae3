"""Shipped configs: every recipe loads and builds its baseline; `base:` merging; accelerate configs parse."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from stabledrl_bench.config import deep_merge, read_mapping, read_recipe
from stabledrl_bench.core.baseline import build_baseline
from stabledrl_bench.core.budget import PAPER_RECIPE, Budget, paper_budget
from stabledrl_bench.errors import UserError
from stabledrl_bench.experiments import presets as presets_module
from stabledrl_bench.experiments.presets import presets
from stabledrl_bench.tasks import REWARD_PROFILES, get_task
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.optim import OptimConfig

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


def test_yaml_numbers_are_read_as_yaml_1_2_reads_them(tmp_path):
    """`1e-6` is a number (PyYAML follows YAML 1.1, which reads it as a string); a name is still a string."""
    path = tmp_path / "lr.yaml"
    path.write_text("optim: {learning_rate: 1e-6, weight_decay: 5E-2}\nbudget: {temperature: +9e-1}\ntask: 1e3x\n")
    assert read_mapping(path) == {
        "optim": {"learning_rate": 1e-6, "weight_decay": 0.05},
        "budget": {"temperature": 0.9},
        "task": "1e3x",
    }


def test_the_small_config_of_the_tiny_preset_page_loads(tmp_path):
    """docs/tiny-preset.md's small config, as written there."""
    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "tiny-preset.md").read_text()
    path = tmp_path / "small.yaml"
    path.write_text(re.search(r"^```yaml\n(.*?)^```", page, flags=re.M | re.S).group(1))
    cfg = TrainConfig.from_file(path)
    assert (cfg.budget.max_steps, cfg.budget.completions_per_step, cfg.optim.learning_rate) == (4, 8, 2e-5)
    assert cfg.checkpoint_every() == 2  # a tenth of the run, rounded up to whole rollout phases


@pytest.mark.parametrize("name", ["ddp", "fsdp", "deepspeed_zero2"])
def test_accelerate_configs_parse(name):
    data = yaml.safe_load((CONFIGS / "accelerate" / f"{name}.yaml").read_text())
    assert data["distributed_type"] in ("MULTI_GPU", "FSDP", "DEEPSPEED")
    assert data["mixed_precision"] == "bf16" and data["num_processes"] >= 1


# ------------------------------------------------------------------------------------ one source of truth
def test_defaults_are_the_stabledrl_recipe():
    """The paper's settings are written once, in the StableDRL recipe; code defaults must not drift from it."""
    recipe = read_recipe(PAPER_RECIPE)
    assert TrainConfig().budget == paper_budget() == Budget(**recipe["budget"])
    assert OptimConfig() == OptimConfig(**recipe["optim"])


@pytest.mark.parametrize("table", ["table1", "table2"])
def test_presets_load_and_paper_presets_reuse_the_recipe(table):
    loaded = presets(table)
    assert set(loaded) == {"paper", "tiny", "smoke"} | ({"tiny-fast"} if table == "table1" else set())
    paper, tiny, smoke = loaded["paper"], loaded["tiny"], loaded["smoke"]
    recipe = read_recipe(PAPER_RECIPE)
    assert (paper.prompt_protocol, paper.reward_profile) == (recipe["protocol"], recipe["reward_profile"])
    assert paper.bf16 and paper.gradient_checkpointing and paper.save_every == recipe["save_every"]
    assert paper.dtype == recipe["dtype"] == "float32"  # fp32 masters, bf16 compute
    expected = paper_budget()
    if table == "table2":  # SDAR: block 4, steps = canvas (the only differences from Table 1's budget)
        expected = dataclasses.replace(expected, block_length=4, diffusion_steps=256)
    assert paper.budget == expected
    if table == "table1":
        for task, entry in paper.tasks.items():
            task_recipe = read_recipe(f"stabledrl/{task}.yaml")
            assert entry.learning_rate == task_recipe["optim"]["learning_rate"]
            assert entry.train_split == task_recipe.get("train_split", "train")
    else:
        assert list(paper.tasks) == ["math500"] and paper.lengths == {2000: 2000}  # replaced, not merged
    # one rollout phase of half the groups, at half the steps per token: what a pipeline check needs
    halved = {"num_generations": tiny.budget.num_generations // 2, "diffusion_steps": tiny.budget.diffusion_steps // 2}
    assert smoke.budget == dataclasses.replace(tiny.budget, max_steps=tiny.budget.num_iterations, **halved)
    assert (smoke.sft.max_steps, smoke.eval_limit) == (10, 8) and smoke.sft.optim == tiny.sft.optim
    assert tiny.model == ("tiny" if table == "table1" else "tiny-block") == tiny.sft.model
    if table == "table1":  # the fast-rollout study's preset: the tiny one but for the rollouts' decoder
        fast = loaded["tiny-fast"]
        assert fast.budget == dataclasses.replace(tiny.budget, rollout_decode="fast")
        assert (fast.sft, fast.tasks, fast.optim) == (tiny.sft, tiny.tasks, tiny.optim)
        assert fast.task_sft("sudoku") == tiny.task_sft("sudoku")  # so the study shares the warm starts


def _write_presets(folder, text):
    (folder / "table1.yaml").write_text(text)
    return folder


def test_a_task_changes_the_warm_start_and_can_stay_out_of_the_default_run():
    tiny = presets("table1")["tiny"]
    assert tiny.default_tasks() == ["sudoku"] and not tiny.tasks["countdown"].default
    assert tiny.task_sft("sudoku") == tiny.sft  # no changes: the preset's warm start itself
    countdown = tiny.task_sft("countdown")
    assert (countdown.max_steps, countdown.batch_size, countdown.min_completion_length) == (3000, 32, 40)
    assert countdown.optim == dataclasses.replace(tiny.sft.optim, learning_rate=2e-3)  # merged key by key
    assert presets("table1")["smoke"].task_sft("countdown").max_steps == 10  # the smoke test stays a smoke test


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: {base: b}\nb: {base: a}\n", "cycle"),
        ("a: {base: nope}\n", "no preset 'nope'"),
        ("a: {descripton: x}\n", "unknown key"),
        ("a: {recipe: stabledrl/_base.yaml, description: x, model: tiny, tasks: {sudoku: 3}}\n", "expected a mapping"),
        (
            "a: {recipe: stabledrl/_base.yaml, description: x, model: tiny, sft: {}, protocols: [tiny],"
            " lengths: {128: 40}, tasks: {sudoku: {sft: {max_stepz: 3}}}}\n",
            r"tasks.sudoku.sft.*max_stepz",
        ),
        (
            "a: {recipe: stabledrl/_base.yaml, description: x, model: tiny, protocols: [tiny], lengths: {128: 40},"
            " tasks: {sudoku: {sft: {max_steps: 3}}}}\n",
            "does not have",
        ),
    ],
)
def test_bad_presets_are_one_line_errors(tmp_path, monkeypatch, text, message):
    monkeypatch.setattr(presets_module, "presets_dir", lambda: _write_presets(tmp_path, text))
    with pytest.raises(UserError, match=message):
        presets("table1")


def test_a_renamed_key_names_its_new_name(tmp_path):
    from stabledrl_bench.training.sft import SFTConfig

    path = tmp_path / "sft.yaml"
    path.write_text("completion_length: 64\n")
    with pytest.raises(UserError, match=r"renamed key\(s\) completion_length \(now max_completion_length\)"):
        SFTConfig.from_file(path)


def test_set_overrides_any_field_by_its_path(tmp_path: Path) -> None:
    """``--set key.path=value`` reaches every field of a config (here one the flags never offered, the learning rate),
    merges into the file's mapping key by key, and is checked like the file."""
    from stabledrl_bench.cli import _load_config, build_parser

    path = tmp_path / "run.yaml"
    path.write_text("baseline: grpo\ntask: sudoku\noptim:\n  learning_rate: 3.0e-6\n  weight_decay: 0.05\n")
    argv = ["train", "--config", str(path), "--seed", "3", "--set", "optim.learning_rate=1e-6"]
    args = build_parser().parse_args(
        [*argv, "--set", "budget.num_generations=4", "--set", "baseline_options={beta: 0}"]
    )
    cfg = _load_config(TrainConfig, args, {"seed": args.seed, "task": None})
    assert cfg.optim.learning_rate == 1e-6 and cfg.optim.weight_decay == 0.05  # the file's other optim field kept
    assert cfg.budget.num_generations == 4 and cfg.seed == 3 and cfg.baseline_options == {"beta": 0}
    for item, message in (
        ("optim.learning_rate", "expected key.path=value"),
        ("optim..lr=1", "expected key.path=value"),
        ("optim.learning_rate=[1", "the value is not YAML"),
        ("optim.learning_rat=1", "unknown key"),
        ("optim.learning_rate=abc", "learning_rate"),
    ):
        bad = build_parser().parse_args(["train", "--config", str(path), "--set", item])
        with pytest.raises(UserError, match=message):
            _load_config(TrainConfig, bad, {})


def test_a_partial_optim_of_sft_changes_only_the_sfts_own_optimizer_defaults() -> None:
    """`sft --set optim.learning_rate=...` (the help's example) changes that one field: the SFT's other optimizer
    defaults (cosine, warm-up 20, weight decay 0.01, clipping at 1.0) stay, not the RL recipe's of OptimConfig
    (linear, no warm-up, weight decay 0.1, clipping at 0.2), which a partial mapping used to fall back to."""
    from stabledrl_bench.cli import _load_config, build_parser
    from stabledrl_bench.training.sft import SFTConfig

    args = build_parser().parse_args(["sft", "--set", "optim.learning_rate=1e-6"])
    cfg = _load_config(SFTConfig, args, {})
    assert cfg.optim == dataclasses.replace(SFTConfig().optim, learning_rate=1e-6)
    assert (cfg.optim.warmup_steps, cfg.optim.max_grad_norm, cfg.optim.lr_scheduler_type) == (20, 1.0, "cosine")
