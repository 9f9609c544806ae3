"""The registries: built-in names, errors, official defaults, and one external plugin per registry, installed
through real entry points (a ``*.dist-info`` folder on ``sys.path``, as ``pip install`` would leave it)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from conftest import BUILTIN_BASELINES, install_plugin, small_budget

from stabledrl_bench.cli import main
from stabledrl_bench.core.advantages import ADVANTAGES
from stabledrl_bench.core.baseline import BASELINES, build_baseline, training_estimator
from stabledrl_bench.core.estimators import (
    ESTIMATORS,
    CoupledPair,
    D1OneStep,
    ESPOElbo,
    SDMCElbo,
    SPGBlock,
    StaircaseElbo,
    TraceReplay,
    build_estimator,
)
from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.core.models.backends import MODEL_FAMILIES
from stabledrl_bench.core.registry import Registry
from stabledrl_bench.core.rollouts import ROLLOUTS
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.protocols import PROTOCOLS
from stabledrl_bench.experiments.stress.options import EXPERIMENTS
from stabledrl_bench.tasks import REWARD_PROFILES, TASKS, get_task

ALL = {
    "baselines": BASELINES,
    "estimators": ESTIMATORS,
    "advantages": ADVANTAGES,
    "rollouts": ROLLOUTS,
    "tasks": TASKS,
    "reward-profiles": REWARD_PROFILES,
    "protocols": PROTOCOLS,
    "model-families": MODEL_FAMILIES,
    "stress-experiments": EXPERIMENTS,
}


# ------------------------------------------------------------------------------------------ the registry type
def test_duplicate_unknown_and_listing() -> None:
    reg: Registry[int] = Registry("widget", "test_widgets")
    reg.register("a", 1)
    reg.register("a", 1)  # the same object again (a module imported twice) is fine
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a", 2)
    with pytest.raises(UserError, match=r"^unknown widget 'b'; known: a$"):
        reg.get("b")
    assert list(reg) == ["a"] and "a" in reg and reg.items() == [("a", 1)]


def test_a_file_imported_under_two_module_names_is_named_as_such() -> None:
    """`import baselines` from the repository root runs the files of `stabledrl_bench.baselines` a second time under
    another module name: the error says so, where a bare "already registered" sends people looking for a clash."""
    reg: Registry[type] = Registry("widget", "test_widgets")
    first, second = (
        type("W", (), {"__module__": "stabledrl_bench.baselines.w"}),
        type("W", (), {"__module__": "baselines.w"}),
    )
    reg.register("w", first)
    with pytest.raises(ValueError, match=r"imported a second time as baselines\.w; import the package's copy"):
        reg.register("w", second)
    other = type("W", (), {"__module__": "my_plugin"})
    with pytest.raises(ValueError, match=r"already registered \(by stabledrl_bench\.baselines\.w\)$"):
        reg.register("w", other)  # a real clash of two methods: no hint about imports


@pytest.mark.parametrize("what", sorted(ALL))
def test_every_registry_names_its_entries_and_lists_them(what: str, capsys: pytest.CaptureFixture) -> None:
    registry = ALL[what]
    assert len(registry) >= (1 if what == "rollouts" else 2)  # one rollout scheme is built in: the default
    with pytest.raises(UserError, match=rf"^unknown {registry.kind} 'nope'; known: "):
        registry.get("nope")
    assert main(["list", what]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    built_on_request = ["<protocol>-n<N>-t<T>"] if what == "protocols" else []  # sampled protocols: a pattern
    assert listed == [*registry, *built_on_request]


# ------------------------------------------------------------------------------------------------ baselines
def test_builtin_baselines_are_registered() -> None:
    assert set(BUILTIN_BASELINES) <= set(BASELINES)
    for name in BUILTIN_BASELINES:
        assert BASELINES.get(name).name == name


def test_unknown_option_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"unknown option.*clip_ratio"):
        build_baseline("stabledrl", clip_ratio=3.0)
    with pytest.raises(UserError, match=r"^baseline 'spg': option num_t \(now num_mc\)$"):
        build_baseline("spg", num_t=2)


@pytest.mark.parametrize(
    ("name", "estimator", "advantage", "needs_old", "needs_ref", "coupled", "defaults"),
    [
        ("grpo", D1OneStep(p_mask_prompt=0.15), "group_mean", True, True, True, {"epsilon": 0.5, "beta": 0.04}),
        ("spg", SPGBlock(num_mc=2, eubo_beta=1.5), "group_mean", False, False, True, {"omega": 0.5}),
        ("espo", ESPOElbo(num_mc=2, reduce_var=True), "leave_one_out", True, True, True, {"beta": 1e-3}),
        ("trado", TraceReplay(shrink=1), "group_zscore", True, False, True, {"beta": 0.01, "normalize": "length"}),
        ("stabledrl", SPGBlock(num_mc=2), "group_mean", True, False, False, {"clip_threshold": 5.0}),
        ("wd1", D1OneStep(p_mask_prompt=0.15), "group_mean", False, False, True, {"sync_ref_model": False}),
        (
            "coupled_grpo",  # apple/ml-diffucoder: leave_one_out = True; recipe lines 11-12; TRL's mix-up alpha
            CoupledPair(t_min=0.2, t_max=0.8, p_mask_prompt=0.0),
            "leave_one_out",
            True,
            True,
            True,
            {
                "epsilon": 0.5,
                "beta": 0.01,
                "sync_ref_model": True,
                "ref_model_sync_steps": 64,
                "ref_model_mixup_alpha": 0.6,
            },
        ),
        (
            "gdpo",
            SDMCElbo(nodes=3, mc_samples=1, mask_seed="content"),
            "group_mean",
            True,
            False,
            True,
            {"epsilon": 0.5},
        ),
    ],
)
def test_official_defaults_estimator_spec_and_advantage_rule(
    name: str, estimator, advantage: str, needs_old: bool, needs_ref: bool, coupled: bool, defaults: dict
) -> None:
    baseline = build_baseline(name)
    assert baseline.estimator() == estimator
    assert (baseline.advantage, baseline.needs_old, baseline.needs_ref) == (advantage, needs_old, needs_ref)
    assert baseline.config.coupled == coupled
    assert {k: getattr(baseline.config, k) for k in defaults} == defaults
    assert baseline.advantage in ADVANTAGES


@pytest.mark.parametrize(("name", "scale"), [("spg", "mean"), ("stabledrl", "mean"), ("espo", "sum")])
def test_block_models_get_the_staircase_counterpart(name: str, scale: str) -> None:
    """The spec, not a table keyed by estimator name, says what a block-diffusion model needs."""
    full, block = build_tiny(attention="full"), build_tiny(attention="block", block_size=4)
    spec = build_baseline(name).estimator()
    assert type(training_estimator(build_baseline(name), full, block_length=8)) is type(spec)
    staircase = training_estimator(build_baseline(name), block)
    assert isinstance(staircase, StaircaseElbo)
    assert (staircase.scale, staircase.block_length, staircase.num_mc) == (scale, 4, spec.num_mc)
    for token_level in ("grpo", "trado"):  # these handle block attention themselves
        baseline = build_baseline(token_level)
        assert training_estimator(baseline, block) == baseline.estimator()


def test_spg_masks_in_the_rollout_block_unless_given_its_own() -> None:
    full = build_tiny(attention="full")
    assert training_estimator(build_baseline("spg"), full, block_length=8).block_length == 8
    assert training_estimator(build_baseline("spg", block_length=4), full, block_length=8).block_length == 4
    assert training_estimator(build_baseline("spg"), full, micro_batch_size=2, block_length=8).micro_batch_size == 2
    with pytest.raises(UserError, match="spg_block needs block_length"):
        training_estimator(build_baseline("spg"), full)


def test_estimator_settings_are_typed_and_recorded() -> None:
    spec = build_estimator("spg_block", num_mc=3, block_length=8)
    assert spec == SPGBlock(num_mc=3, block_length=8) and hash(spec) == hash(SPGBlock(num_mc=3, block_length=8))
    assert spec.settings()["name"] == "spg_block" and spec.settings()["num_mc"] == 3
    with pytest.raises(UserError, match=r"has no option.*num_t"):
        build_estimator("spg_block", num_t=2)
    with pytest.raises(UserError, match="num_mc must be a positive integer"):
        SPGBlock(num_mc=0)


def test_clip_threshold_ablation_is_a_stabledrl_option() -> None:
    for threshold in (1.0, 5.0, 100.0, 1000.0):
        config = build_baseline("stabledrl", clip_threshold=threshold).config
        assert (config.clip_low, config.clip_high) == (-math.inf, math.log(threshold))
    paper = build_baseline("stabledrl", mode="paper", epsilon=0.1).config
    assert (paper.clip_low, paper.clip_high) == (math.log(0.9), math.log(1.1))
    assert build_baseline("stabledrl_selfnorm_only").config.clip_high == math.inf


# ------------------------------------------------------------------------------------------------- plugins
BASELINE_PLUGIN = """
from stabledrl_bench.core.baseline import Baseline, register_baseline
from stabledrl_bench.core.estimators import D1OneStep


@register_baseline("my_method")
class PluginBaseline(Baseline):
    advantage = "my_rule"

    def estimator(self):
        return D1OneStep(p_mask_prompt=0.0)
"""

# One plugin per registry: (registry, module source, entry-point target: a module or "module:object").
PLUGINS = {
    "baselines": (BASELINE_PLUGIN, ""),
    "estimators": (
        """
from dataclasses import dataclass
from stabledrl_bench.core.estimators import D1OneStep

@dataclass(frozen=True, kw_only=True)
class NoPromptMask(D1OneStep):
    p_mask_prompt: float = 0.0
""",
        ":NoPromptMask",
    ),
    "advantages": (
        """
import torch

def my_rule(rewards, group_ids, correct=None):
    return rewards - rewards.mean(), torch.ones_like(group_ids, dtype=torch.bool)
""",
        ":my_rule",
    ),
    "rollouts": (
        """
from dataclasses import dataclass
from stabledrl_bench.core.rollouts import Independent, Rollout

@dataclass(frozen=True)
class FirstHalf(Independent):
    '''The default rollout, recording how many rows make half of the micro-batch.'''

    def sample(self, dlm, prompt_ids, prompt_mask, settings, generator):
        out = super().sample(dlm, prompt_ids, prompt_mask, settings, generator)
        return Rollout(out.completion_ids, out.unmask_step, out.nfe, {"half": len(prompt_ids) // 2})
""",
        ":FirstHalf",
    ),
    "tasks": (
        """
from stabledrl_bench.tasks.sudoku import SudokuTask

class HardSudoku(SudokuTask):
    '''Sudoku with a different name.'''
""",
        ":HardSudoku",
    ),
    "reward-profiles": (
        """
from stabledrl_bench.tasks import RewardResult

def binary(task, completions, docs):
    return [RewardResult.of(correct=float(g.correct)) for g in task.grade_many(completions, docs)]
""",
        ":binary",
    ),
    "protocols": (
        """
import dataclasses
from stabledrl_bench.evaluation.protocols import get_protocol

GREEDY4 = dataclasses.replace(get_protocol("tiny"), name="tiny-4", tokens_per_step=4)
""",
        ":GREEDY4",
    ),
    "model-families": (
        """
from stabledrl_bench.core.models.backends import MODEL_FAMILIES, TinyBackend

@MODEL_FAMILIES.register("tiny-fork")
class TinyFork(TinyBackend):
    model_types = ("tiny_fork",)
""",
        "",
    ),
    "stress-experiments": (  # run end to end in tests/test_stress_plugin.py
        """
from dataclasses import dataclass
from pathlib import Path
from stabledrl_bench.experiments.stress.options import Experiment, option

@dataclass(frozen=True)
class EchoOptions:
    word: str = option("hello")

def run(stress, options):
    return Path(stress.results) / "echo.json"

ECHO = Experiment("echo", "a plugin experiment: one module, nothing else edited", EchoOptions, run)
""",
        ":ECHO",
    ),
}
ENTRY_NAMES = {
    "baselines": "my_method",
    "estimators": "no_prompt_mask",
    "advantages": "my_rule",
    "rollouts": "first_half",
    "tasks": "hard_sudoku",
    "reward-profiles": "binary",
    "protocols": "tiny-4",
    "model-families": "tiny-fork",
    "stress-experiments": "echo",
}


def test_a_plugin_task_is_trained_evaluated_written_verified_and_shown(
    plugin_dir: Path, small_checkpoint: Path, tmp_path: Path
) -> None:
    """An installed task needs no edit to this repository: RL, a result record, verify, its own board column."""
    from stabledrl_bench.reporting.leaderboard import build_leaderboard
    from stabledrl_bench.reporting.results import load_results
    from stabledrl_bench.training.config import TrainConfig
    from stabledrl_bench.training.trainer import RLTrainer

    source, target = PLUGINS["tasks"]
    install_plugin(
        plugin_dir, TASKS.group, "hard_sudoku", "sdrl_test_plugin_tasks" + target, "sdrl_test_plugin_tasks", source
    )
    run = tmp_path / "run"
    config = TrainConfig(
        baseline="grpo",
        task="hard_sudoku",
        model=str(small_checkpoint),
        protocol="tiny",
        budget=small_budget(),
        output_dir=str(run),
        progress=False,
    )
    final = RLTrainer(config).train()
    results = tmp_path / "results"
    common = ["--task", "hard_sudoku", "--protocol", "tiny", "--max-completion-length", "8", "--limit", "4"]
    assert (
        main(
            ["eval", "--model", str(final), "--baseline", "grpo", "--run", str(run), "--results", str(results), *common]
        )
        == 0
    )
    assert (
        main(["eval", "--model", str(small_checkpoint), "--baseline", "sft", "--results", str(results), *common]) == 0
    )
    assert main(["verify", "--results", str(results)]) == 0
    recorded = {r["baseline"]: r.get("advantage") for r in load_results(results)}  # the run's rule, from its run.json
    assert recorded == {"grpo": {"rule": "group_mean", "options": {}}, "sft": None}
    markdown = build_leaderboard(results, {"schema": "stabledrl-bench/published/v1"})
    header = next(line for line in markdown.splitlines() if line.startswith("| Baseline | Checkpoint | Model"))
    assert "| hard_sudoku 256 |" in header and "| Sudoku 256 |" in header  # its own column beside the paper's
    assert "hard_sudoku is not a column of the paper. It is not in the overall average." in markdown
    assert "| grpo |" in markdown and "**Change from the starting point**" in markdown


def _fenced(page: str, language: str) -> list[str]:
    """The ``language`` code blocks of a markdown page, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", page, flags=re.M | re.S)


def test_the_task_page_example_is_listed_evaluated_and_run_by_lm_eval(
    plugin_dir: Path, small_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """docs/tasks.md's example, exactly as written there, installed as a package would be: `list tasks` shows it,
    its gold completions grade as correct, `eval` records it, and lm-eval runs it through the generic dllm_task."""
    from lm_eval.tasks import TaskManager
    from test_lmeval_tasks import LMEVAL_DIR, gold_run

    page = (Path(__file__).resolve().parents[1] / "docs" / "tasks.md").read_text()
    source, entry = _fenced(page, "python")[0], _fenced(page, "toml")[0]
    name, target = re.search(r'^(\w+) = "[\w.]+(:\w+)"$', entry, flags=re.M).groups()
    module = "sdrl_test_plugin_doc_task"
    install_plugin(plugin_dir, TASKS.group, name, module + target, module, source)
    assert main(["list", "tasks"]) == 0
    assert re.search(rf"^{name} +Add two numbers below 100", capsys.readouterr().out, flags=re.M)
    task = get_task(name)
    docs = task.eval_docs()
    assert len(docs) == 64 and not {(d["a"], d["b"]) for d in docs} & {(d["a"], d["b"]) for d in task.load("train")}
    assert all(task.grade(task.target_completion(doc, p), doc).correct for doc in docs[:4] for p in task.protocols)
    results = tmp_path / "results"
    argv = ["eval", "--model", str(small_checkpoint), "--task", name, "--protocol", "tiny", "--limit", "2"]
    assert main([*argv, "--max-completion-length", "8", "--results", str(results)]) == 0
    assert len(list(results.rglob("*.json"))) == 1
    manager = TaskManager(include_path=str(LMEVAL_DIR), include_defaults=False, metadata={"harness_task": name})
    metrics = gold_run(manager, ["dllm_task"])["dllm_task"]
    assert (metrics["acc"], metrics["score"]) == (1.0, 1.0)


@pytest.mark.parametrize("what", sorted(PLUGINS))
def test_external_plugin_through_entry_points(what: str, plugin_dir: Path) -> None:
    registry, (source, target) = ALL[what], PLUGINS[what]
    module = f"sdrl_test_plugin_{what.replace('-', '_')}"
    name = ENTRY_NAMES[what]
    install_plugin(plugin_dir, registry.group, name, module + target, module, source)
    names = list(registry)
    assert name in names and names.index(name) == len(names) - 1  # built-ins first, then plugins
    entry = registry.get(name)
    if what == "estimators":
        assert entry.name == name and build_estimator(name).p_mask_prompt == 0.0
    elif what == "tasks":
        assert get_task(name).name == name
    elif what == "model-families":
        from stabledrl_bench.core.models.backends import family_of

        assert entry.family == name and family_of("tiny_fork") == name
    elif what == "stress-experiments":
        assert entry.options().word == "hello"


def test_plugins_compose(plugin_dir: Path) -> None:
    """A plugin baseline may name a plugin advantage rule; a plugin reward profile scores a built-in task."""
    for what in ("baselines", "advantages", "reward-profiles"):
        source, target = PLUGINS[what]
        module = f"sdrl_test_plugin_{what.replace('-', '_')}"
        install_plugin(plugin_dir, ALL[what].group, ENTRY_NAMES[what], module + target, module, source)
    baseline = build_baseline("my_method")
    advantages, keep = baseline.advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    assert advantages.tolist() == [0.5, -0.5] and keep.all()
    task = get_task("sudoku")
    doc = task.eval_docs(limit=1)[0]
    solved = task.target_completion(doc, "tiny")
    assert task.reward(solved, doc, "binary").components == {"correct": 1.0}


def test_a_plugin_method_trains_with_its_own_plugin_rollout_scheme(
    plugin_dir: Path, small_checkpoint: Path, tmp_path: Path
) -> None:
    """A method from one package may sample with a rollout scheme from another: the trainer draws every rollout
    through it (its records reach the trainer), and the run folder names it."""
    import json

    from stabledrl_bench.core.rollouts import Rollout
    from stabledrl_bench.training.config import TrainConfig
    from stabledrl_bench.training.trainer import RLTrainer

    source, target = PLUGINS["rollouts"]
    install_plugin(
        plugin_dir, ROLLOUTS.group, "first_half", "sdrl_rollout_plugin" + target, "sdrl_rollout_plugin", source
    )
    method = """
from stabledrl_bench.core.baseline import BASELINES, register_baseline
from stabledrl_bench.core.rollouts import ROLLOUTS


@register_baseline("my_sampler")
class MySampler(BASELINES.get("grpo")):
    def rollout(self):
        return ROLLOUTS.get("first_half")()
"""
    install_plugin(plugin_dir, BASELINES.group, "my_sampler", "sdrl_method_plugin", "sdrl_method_plugin", method)
    drawn: list[Rollout] = []
    scheme = ROLLOUTS.get("first_half")
    sample = scheme.sample

    def spy(self, *args):
        drawn.append(sample(self, *args))
        return drawn[-1]

    scheme.sample = spy
    try:
        config = TrainConfig(
            baseline="my_sampler", task="sudoku", model=str(small_checkpoint), protocol="tiny",
            budget=small_budget(max_steps=2), output_dir=str(tmp_path / "run"), progress=False,
        )  # fmt: skip
        RLTrainer(config).train()
    finally:
        scheme.sample = sample
    # one rollout phase (mu = 2) of two micro-batches, each one prompt x 4 completions
    assert len(drawn) == 2 and all(rollout.records == {"half": 2} for rollout in drawn)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["rollout"] == {"name": "first_half"}


def test_plugin_that_fails_to_import_is_named(plugin_dir: Path) -> None:
    install_plugin(
        plugin_dir, BASELINES.group, "bad", "sdrl_test_plugin_bad", "sdrl_test_plugin_bad", "raise OSError('boom')\n"
    )
    with pytest.raises(UserError, match=r"baseline plugin 'bad'.*failed to load: boom"):
        BASELINES.entries()
