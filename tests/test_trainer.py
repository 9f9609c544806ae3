"""RL trainer and SFT on the tiny model: every baseline runs, resume is exact, errors are clear."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import BUILTIN_BASELINES, SMALL, TREE_OF_FOUR, small_budget

from stabledrl_bench.config import from_dict
from stabledrl_bench.core import rollouts as rollouts_module
from stabledrl_bench.core.baseline import BASELINES, build_baseline
from stabledrl_bench.core.budget import Budget, paper_budget
from stabledrl_bench.core.masks import staircase_mask, staircase_position_ids
from stabledrl_bench.core.models import build_tiny, load_diffusion_lm, save_diffusion_lm
from stabledrl_bench.core.sampling import BlockDecode, FullDecode, generate
from stabledrl_bench.errors import UserError
from stabledrl_bench.training import sft as sft_module
from stabledrl_bench.training import trainer as trainer_module
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.optim import OptimConfig
from stabledrl_bench.training.runlog import read_log
from stabledrl_bench.training.sft import SFTConfig, encode_targets, run_sft, sft_loss
from stabledrl_bench.training.trainer import RLTrainer, TrainingDiverged


@pytest.fixture(scope="module")
def small_models(tmp_path_factory) -> dict[str, Path]:
    paths = {}
    for attention in ("full", "block"):
        path = tmp_path_factory.mktemp(f"tiny-{attention}")
        save_diffusion_lm(build_tiny(attention=attention, block_size=4, **SMALL), path)
        paths[attention] = path
    return paths


def _config(model: Path, out: Path, baseline: str = "stabledrl", steps: int = 2, **overrides) -> TrainConfig:
    budget = small_budget(max_steps=steps)
    fields = {
        "baseline": baseline,
        "task": "countdown",
        "model": str(model),
        "protocol": "tiny",
        "train_split": "generated",
        "generator_options": {"num_numbers": [3]},
        "budget": budget,
        "optim": OptimConfig(learning_rate=1e-3, lr_scheduler_type="linear", max_grad_norm=1.0),
        "per_device_prompts": 1,
        "output_dir": str(out),
        "progress": False,
        **overrides,
    }
    return TrainConfig(**fields)


REQUIRED_LOG_KEYS = {"step", "reward_mean", "loss", "grad_norm", "learning_rate", "seconds", "nfe_total"}


def test_builtin_list_is_complete():
    assert set(BUILTIN_BASELINES) <= set(BASELINES.entries())


@pytest.mark.parametrize("baseline", BUILTIN_BASELINES)
def test_each_baseline_runs_and_writes_log_plot_checkpoint(baseline, small_models, tmp_path):
    options = {"baseline_options": {"keep_range": [0.0, 1.0]}} if baseline == "trado" else {}
    if baseline == "mdpo":  # its 16 trained steps exceed the 8 of this budget's sampler
        options = {"baseline_options": {"sample_train_steps": 4}}
    if baseline == "dtreerpo":  # the budget's 4 completions per prompt are the leaves of its tree
        options = {"baseline_options": TREE_OF_FOUR}
    elif baseline == "igpo":  # its hints need worked solutions: GSM8K's training answers
        options = {"task": "gsm8k", "train_split": "train", "generator_options": {}}
    final = RLTrainer(_config(small_models["full"], tmp_path, baseline, **options)).train()
    records = read_log(tmp_path / "log.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert all(set(r) >= REQUIRED_LOG_KEYS for r in records)
    assert all(math.isfinite(r["grad_norm"]) for r in records)
    assert "reward_mean" in records[0] and "accuracy" in records[0] and "rollout_nfe" in records[0]
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert (tmp_path / "checkpoints" / "step_000002" / "state.pt").is_file()
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["budget_hash"] == _config(small_models["full"], tmp_path).budget.hash()
    assert load_diffusion_lm(final).family == "tiny"


def test_gradient_checkpointing_gives_the_same_step(small_models, tmp_path):
    """Activation checkpointing (the GPU recipes' memory setting) must not change the maths."""
    a = RLTrainer(_config(small_models["full"], tmp_path / "a")).train()
    b = RLTrainer(_config(small_models["full"], tmp_path / "b", gradient_checkpointing=True)).train()
    pa, pb = _params(a), _params(b)
    assert all(torch.allclose(pa[k], pb[k], rtol=0, atol=1e-6) for k in pa)


@pytest.mark.parametrize("checkpointing", [True, False])
def test_no_activation_is_alive_when_the_optimizer_steps(small_models, tmp_path, checkpointing):
    """The backward pass frees the loss's graph, recomputed blocks included: when AdamW steps, what is left of the
    forward passes (torch's MemTracker: storages made in a forward or a recomputation and still alive) is smaller
    than one hidden-state tensor of a micro-batch, i.e. per-token values at most (the loss and the estimates)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    budget = small_budget(prompts_per_step=1)  # one micro-batch: MemTracker follows one forward of a module a step
    trainer = RLTrainer(_config(small_models["full"], tmp_path, budget=budget, gradient_checkpointing=checkpointing))
    micro_batches, _ = trainer.rollout()
    tracker = MemTracker()
    tracker.track_external(trainer.optimizer.optimizer, trainer.train_dlm.model)
    alive: list[int] = []

    def at_step(*_) -> None:
        (current,) = tracker.get_tracker_snapshot("current").values()
        alive.append(next(value for key, value in current.items() if getattr(key, "name", key) == "ACT"))

    handle = trainer.optimizer.optimizer.register_step_pre_hook(at_step)
    with tracker:
        trainer.optimizer_step(micro_batches, 0)
    handle.remove()
    rows, prompt = micro_batches[-1].batch.prompt_ids.shape
    hidden_state = 4 * rows * (prompt + micro_batches[-1].batch.completion_ids.shape[1]) * SMALL["hidden_size"]
    assert len(alive) == 1
    assert alive[0] < hidden_state


def test_block_model_uses_staircase_estimator(small_models, tmp_path):
    trainer = RLTrainer(_config(small_models["block"], tmp_path, "stabledrl"))
    assert type(trainer.estimator).name == "staircase_elbo"
    trainer.train()
    assert len(read_log(tmp_path / "log.jsonl")) == 2


def test_lora_training_uses_the_adapter_free_model_as_reference(small_models, tmp_path, monkeypatch):
    from stabledrl_bench.tasks.base import RewardResult
    from stabledrl_bench.training.config import LoraSettings

    cfg = _config(small_models["full"], tmp_path, "grpo", lora=LoraSettings(r=4, alpha=8, target_modules=["qkv"]))
    trainer = RLTrainer(cfg)
    assert trainer.ref_dlm is None  # the reference is the base model with the adapter disabled
    trainable = sum(p.numel() for p in trainer.dlm.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.dlm.model.parameters())
    assert 0 < trainable < total
    # a random tiny model earns no task reward; any reward that varies within a group gives a gradient
    by_length = _per_completion(lambda text, doc, profile: RewardResult(len(text) % 3, {}))
    monkeypatch.setattr(trainer.task, "reward_many", by_length)
    final = trainer.train()
    merged = load_diffusion_lm(final)  # exported merged: loads without peft
    base = load_diffusion_lm(small_models["full"])
    changed = [k for k, v in merged.model.state_dict().items() if not torch.equal(v, base.model.state_dict()[k])]
    assert changed and all("qkv" in k for k in changed)
    assert "kl" in read_log(tmp_path / "log.jsonl")[0]


@pytest.mark.parametrize("baseline", ["stabledrl", "spg", "espo"])
def test_rl_raises_a_learnable_reward(baseline, small_models, tmp_path, monkeypatch):
    """End-to-end learning check: reward = fraction of '7' characters, which a policy can raise by itself.

    Measured on seeds 0-2 (12 steps, lr 1e-2): first rollout 0.01-0.03, last 0.17-0.49 for StableDRL, SPG and
    ESPO, so last > 3 x first + 0.05 has a wide margin. (diffu-GRPO's one-step all-masked estimator does not
    move this reward on the tiny model: 0.01-0.10 after 12 steps, which is why it is not asserted here.)
    """
    from stabledrl_bench.tasks.base import RewardResult

    cfg = _config(small_models["full"], tmp_path, baseline, steps=12)
    cfg.budget = Budget(**{**cfg.budget.to_dict(), "num_generations": 8, "temperature": 1.0})
    cfg.optim = OptimConfig(learning_rate=1e-2, lr_scheduler_type="constant", max_grad_norm=1.0)
    cfg.per_device_prompts = 2
    trainer = RLTrainer(cfg)
    seven = _per_completion(lambda text, doc, profile: RewardResult(text.count("7") / max(1, len(text)), {}))
    monkeypatch.setattr(trainer.task, "reward_many", seven)
    trainer.train()
    rewards = [r["reward_mean"] for r in read_log(tmp_path / "log.jsonl") if r["phase_iteration"] == 0]
    assert rewards[-1] > 3 * rewards[0] + 0.05, rewards


def _params(path: Path) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in load_diffusion_lm(path).model.state_dict().items()}


def test_resume_is_identical_to_uninterrupted(small_models, tmp_path):
    """4 steps in one go == 2 steps, a new process-like trainer resuming from disk, 2 more steps."""
    whole = RLTrainer(_config(small_models["full"], tmp_path / "a", steps=4)).train()
    RLTrainer(_config(small_models["full"], tmp_path / "b", steps=4)).train(stop_after=2)
    assert not (tmp_path / "b" / "final").exists()
    resumed = RLTrainer(_config(small_models["full"], tmp_path / "b", steps=4)).train(resume=True)
    a, b = _params(whole), _params(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    log_a = read_log(tmp_path / "a" / "log.jsonl")
    log_b = read_log(tmp_path / "b" / "log.jsonl")
    assert [r["step"] for r in log_b] == [1, 2, 3, 4]
    assert [r["loss"] for r in log_a] == [r["loss"] for r in log_b]


def test_resume_refuses_a_different_budget_and_fresh_runs_refuse_old_checkpoints(small_models, tmp_path):
    RLTrainer(_config(small_models["full"], tmp_path, steps=4)).train(stop_after=2)
    with pytest.raises(UserError, match="budget"):
        RLTrainer(_config(small_models["full"], tmp_path, steps=6)).train(resume=True)
    with pytest.raises(UserError, match="already holds checkpoints"):
        RLTrainer(_config(small_models["full"], tmp_path, steps=4)).train()


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_nonfinite_losses_stop_with_one_clear_error_and_keep_the_parameters(small_models, tmp_path, monkeypatch):
    trainer = RLTrainer(_config(small_models["full"], tmp_path, steps=4, max_nonfinite_steps=2))
    before = {k: v.clone() for k, v in trainer.dlm.model.state_dict().items()}

    def nan_loss(inputs):
        loss = inputs.new.elbo.sum() * float("nan")
        return loss, {}

    monkeypatch.setattr(trainer.baseline, "loss", nan_loss)
    with pytest.raises(TrainingDiverged, match="2 consecutive non-finite steps"):
        trainer.train()
    after = trainer.dlm.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert (tmp_path / "checkpoints" / "step_000002" / "state.pt").is_file()
    assert all(r["skipped"] for r in read_log(tmp_path / "log.jsonl"))


def test_config_errors_are_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"baseline": "grpo", "lerning_rate": 1}))
    with pytest.raises(UserError, match="unknown key"):
        TrainConfig.from_file(path)
    path.write_text(yaml.safe_dump({"budget": {"max_steps": "many"}}))
    with pytest.raises(UserError, match=r"budget\.max_steps: expected an integer"):
        TrainConfig.from_file(path)
    path.write_text("baseline: [unclosed")
    with pytest.raises(UserError, match="not valid YAML"):
        TrainConfig.from_file(path)
    with pytest.raises(UserError, match="must be a multiple of num_iterations"):
        from_dict(Budget, {**paper_budget().to_dict(), "max_steps": 3, "num_iterations": 2})
    with pytest.raises(UserError, match=r"^config: missing key\(s\) prompts_per_step, num_generations,"):
        from_dict(Budget, {"max_steps": 4})  # a budget alone has no defaults: every value is written down
    path.write_text(yaml.safe_dump({"budget": {"max_steps": 4}}))  # a config's budget overrides the recipe's
    assert TrainConfig.from_file(path).budget == dataclasses.replace(paper_budget(), max_steps=4)
    with pytest.raises(UserError, match="unknown baseline"):
        RLTrainer(_config(tmp_path, tmp_path / "out", baseline="nope"))


def test_rerunning_an_interrupted_train_command_resumes_it(small_models, tmp_path):
    """The README's promise: after a kill, re-run the same command (no --resume needed)."""
    from stabledrl_bench.cli import main
    from stabledrl_bench.config import to_dict

    def write(name: str, out: str) -> str:
        cfg = _config(small_models["full"], tmp_path / out, steps=4, task="sudoku", train_split="train")
        cfg.generator_options = {}
        (tmp_path / name).write_text(yaml.safe_dump(to_dict(cfg)))
        return str(tmp_path / name)

    config = write("train.yaml", "out")
    assert main(["train", "--config", str(config), "--stop-after", "2"]) == 0
    assert not (tmp_path / "out" / "final").exists()
    assert main(["train", "--config", str(config)]) == 0
    assert [r["step"] for r in read_log(tmp_path / "out" / "log.jsonl")] == [1, 2, 3, 4]
    assert (tmp_path / "out" / "final" / "config.json").is_file()
    assert main(["train", "--config", write("fresh.yaml", "fresh"), "--resume"]) == 2  # --resume needs a checkpoint


def _slow_sft_loss(dlm, prompt_ids, prompt_mask, targets, generator, eps=1e-3):
    """Per-row loop version of sft_loss (same random draws, same order)."""
    batch, length = targets.shape
    if dlm.attention == "block":
        n_blocks = -(-length // dlm.block_size)
        t_blocks = torch.rand(batch, n_blocks, generator=generator)
    else:
        t_rows = torch.rand(batch, 1, generator=generator)
    u = torch.rand(batch, length, generator=generator)
    total = 0.0
    for i in range(batch):
        noisy = targets[i].clone()
        probs = []
        for k in range(length):
            t = t_blocks[i, k // dlm.block_size] if dlm.attention == "block" else t_rows[i, 0]
            p = (1 - eps) * t + eps
            probs.append(p)
            if u[i, k] < p:
                noisy[k] = dlm.mask_id
        if dlm.attention == "block":
            ids = torch.cat((prompt_ids[i], targets[i], noisy))[None]
            logits = dlm.logits(
                ids,
                attention_mask=staircase_mask(prompt_mask[i : i + 1], length, dlm.block_size),
                position_ids=staircase_position_ids(prompt_mask[i : i + 1], length),
            )[0, -length:]
        else:
            ids = torch.cat((prompt_ids[i], noisy))[None]
            valid = torch.cat((prompt_mask[i], torch.ones(length, dtype=torch.bool)))[None]
            logits = dlm.logits(ids, attention_mask=valid)[0, -length:]
        logp = torch.log_softmax(logits.double(), dim=-1)
        for k in range(length):
            if noisy[k] == dlm.mask_id:
                total += -logp[k, targets[i, k]].item() / float(probs[k])
    return total / (batch * length)


@pytest.mark.parametrize("attention", ["full", "block"])
def test_sft_loss_matches_loop_implementation(attention):
    dlm = build_tiny(attention=attention, block_size=4, **SMALL)
    dlm.model.double()
    prompt_ids, prompt_mask = dlm.encode_prompts(["12 -> 3", "7 8 9 -> 10"])
    targets, truncated = encode_targets(dlm, ["<answer>1+2</answer>", "<answer>7</answer>"], 20)
    assert truncated == 1
    fast = sft_loss(dlm, prompt_ids, prompt_mask, targets, torch.Generator().manual_seed(3))
    slow = _slow_sft_loss(dlm, prompt_ids, prompt_mask, targets, torch.Generator().manual_seed(3))
    assert fast.item() == pytest.approx(slow, rel=1e-6)  # the fast path computes CE in float32


def test_run_sft_writes_a_loadable_model(small_models, tmp_path):
    cfg = SFTConfig(
        task="sudoku",
        model=str(small_models["full"]),
        max_steps=3,
        batch_size=4,
        max_completion_length=36,
        output_dir=str(tmp_path),
        progress=False,
    )
    final = run_sft(cfg)
    assert load_diffusion_lm(final).family == "tiny"
    assert [r["step"] for r in read_log(tmp_path / "log.jsonl")] == [1, 2, 3]


@pytest.mark.parametrize("low", [None, 36])
def test_sft_canvas_is_fixed_or_drawn_from_the_range(small_models, tmp_path, monkeypatch, low):
    canvases = []

    def spy(dlm, texts, length):
        canvases.append(length)
        return encode_targets(dlm, texts, length)

    monkeypatch.setattr(sft_module, "encode_targets", spy)
    run_sft(
        SFTConfig(
            task="sudoku",
            model=str(small_models["full"]),
            max_steps=12,
            batch_size=2,
            max_completion_length=40,
            min_completion_length=low,
            output_dir=str(tmp_path),
            progress=False,
        )
    )
    if low is None:
        assert canvases == [40] * 12
    else:
        assert set(canvases) <= set(range(36, 41)) and len(set(canvases)) > 1


@pytest.mark.parametrize("low", [0, 41])
def test_sft_rejects_a_canvas_range_outside_the_canvas(low):
    with pytest.raises(UserError, match="min_completion_length must be between 1 and max_completion_length=40"):
        SFTConfig(max_completion_length=40, min_completion_length=low)


def test_accelerate_launch_two_cpu_processes(small_models, tmp_path):
    """DDP with gloo on two CPU processes: both ranks roll out their slice, gradients are averaged.

    accelerate 1.x starts CPU multi-process runs through MPI only (``--cpu --num_processes 2`` without
    ``--mpirun_hostfile`` runs ONE process); its torchrun launcher (``--multi_gpu``) works on CPUs with gloo.
    """
    cfg = _config(small_models["full"], tmp_path / "run", steps=2)
    data = {k: v for k, v in cfg.__dict__.items() if k not in ("budget", "optim", "validation")}
    data["budget"] = cfg.budget.to_dict()
    data["optim"] = cfg.optim.__dict__
    config_path = tmp_path / "train.yaml"
    config_path.write_text(yaml.safe_dump(data))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "stabledrl_bench",
        "train",
        "--config",
        str(config_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["world_size"] == 2
    assert [r["step"] for r in read_log(tmp_path / "run" / "log.jsonl")] == [1, 2]
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def _per_completion(reward):
    """A ``reward_many`` made of a per-completion reward: the trainer scores each rollout chunk in one call."""

    def reward_many(texts, docs, profile):
        return [reward(text, doc, profile) for text, doc in zip(texts, docs, strict=True)]

    return reward_many


def _counting_reward(pattern: list[float]):
    """A reward that ignores the text: the i-th scored completion gets pattern[i % len(pattern)]."""
    from stabledrl_bench.tasks.base import RewardResult

    calls = []

    def reward(text, doc, profile):
        calls.append(text)
        return RewardResult(pattern[(len(calls) - 1) % len(pattern)], {})

    return reward


def test_informative_groups_are_counted_by_hand(small_models, tmp_path, monkeypatch, recwarn):
    trainer = RLTrainer(_config(small_models["full"], tmp_path, "grpo"))
    # 2 prompts x 4 completions, scored group by group: the first group's rewards differ, the second's do not.
    monkeypatch.setattr(trainer.task, "reward_many", _per_completion(_counting_reward([0, 1, 0, 0, 1, 1, 1, 1])))
    trainer.train()
    assert read_log(tmp_path / "log.jsonl")[0]["informative_groups"] == 0.5
    assert not [w for w in recwarn if "nothing was learned" in str(w.message)]


def test_a_run_with_nothing_to_learn_warns(small_models, tmp_path, monkeypatch):
    trainer = RLTrainer(_config(small_models["full"], tmp_path, "stabledrl"))
    constant = _per_completion(_counting_reward([0.25]))  # e.g. every answer tag malformed
    monkeypatch.setattr(trainer.task, "reward_many", constant)
    with pytest.warns(UserWarning, match=r"in all 1 rollouts every group's completions got the same reward"):
        trainer.train()
    assert read_log(tmp_path / "log.jsonl")[0]["informative_groups"] == 0.0


def test_a_rollout_scores_each_chunk_as_one_batch_with_the_one_by_one_rewards(small_models, tmp_path, monkeypatch):
    """Rewards and grades of a rollout chunk are computed in one call each (so math-verify checks the chunk on
    every worker at once), and the logged reward is what scoring the completions one by one gives."""
    cfg = _config(small_models["full"], tmp_path, "grpo", task="gsm8k", train_split="train")
    cfg.reward_profile = "stabledrl"
    trainer = RLTrainer(cfg)
    task, batches = trainer.task, []
    reward_many, grade_many = task.reward_many, task.grade_many

    def spy_reward_many(texts, docs, profile):
        batches.append(("reward", list(texts), list(docs)))
        return reward_many(texts, docs, profile)

    def spy_grade_many(texts, docs):
        batches.append(("grade", list(texts), list(docs)))
        return grade_many(texts, docs)

    monkeypatch.setattr(task, "reward_many", spy_reward_many)
    monkeypatch.setattr(task, "grade_many", spy_grade_many)
    _, metrics = trainer.rollout()
    monkeypatch.undo()
    rewarded = [(texts, docs) for kind, texts, docs in batches if kind == "reward"]
    assert [(texts, docs) for kind, texts, docs in batches if kind == "grade"] == rewarded
    assert [len(texts) for texts, _ in rewarded] == [cfg.budget.num_generations] * 2  # 2 chunks of 1 prompt
    scored = [pair for texts, docs in rewarded for pair in zip(texts, docs, strict=True)]
    rewards = [task.reward(text, doc, "stabledrl").total for text, doc in scored]
    correct = [float(task.grade(text, doc).correct) for text, doc in scored]
    assert metrics["reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert metrics["accuracy"] == pytest.approx(sum(correct) / len(correct))


def test_rollout_decode_is_opt_in_and_keeps_every_existing_budget_hash():
    paper = paper_budget()
    assert paper.rollout_decode == "exact" and "rollout_decode" not in paper.to_dict()
    assert paper.hash() == "ddfbf18cd517"  # the paper budget's hash before rollout_decode existed
    assert from_dict(Budget, paper.to_dict()) == paper
    fast = dataclasses.replace(paper, rollout_decode="fast")
    assert fast.hash() != paper.hash() and fast.to_dict()["rollout_decode"] == "fast"
    assert from_dict(Budget, fast.to_dict()) == fast
    full, block = build_tiny(), build_tiny(attention="block", block_size=4)
    assert paper.decode_settings(full) == FullDecode(
        max_completion_length=paper.max_completion_length,
        block_length=paper.block_length,
        steps=paper.diffusion_steps,
        temperature=paper.temperature,
    )
    assert paper.decode_settings(block) == BlockDecode(
        max_completion_length=paper.max_completion_length,
        block_length=4,
        steps=paper.diffusion_steps,
        temperature=paper.temperature,
        use_cache=block.supports_kv_cache,
    )
    with pytest.raises(UserError, match="rollout_decode='fast' is a full-attention mode"):
        fast.decode_settings(block)
    with pytest.raises(UserError, match="rollout_decode must be one of"):
        dataclasses.replace(paper, rollout_decode="turbo")


def test_trainer_decodes_rollouts_with_the_budgets_mode(small_models, tmp_path, monkeypatch):
    cfg = _config(small_models["full"], tmp_path)
    cfg.budget = dataclasses.replace(cfg.budget, rollout_decode="fast")
    used = []

    def recording(dlm, prompt_ids, prompt_mask, settings, generator=None):
        used.append(settings)
        return generate(dlm, prompt_ids, prompt_mask, settings, generator=generator)

    monkeypatch.setattr(rollouts_module, "generate", recording)  # the default rollout scheme's sampler call
    RLTrainer(cfg).train()
    assert used and all(s.cache == "dual" and s.strategy == "dynamic" and s.stop_at_eos for s in used)
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["budget"]["rollout_decode"] == "fast" and info["budget_hash"] == cfg.budget.hash()
    assert all(math.isfinite(r["loss"]) for r in read_log(tmp_path / "log.jsonl"))


def test_trackers_log_every_step_into_the_run_folder_and_leave_the_run_log_alone(small_models, tmp_path, monkeypatch):
    """TensorBoard's events and an offline W&B run (no network), both in the run folder: W&B's run file holds the
    run's settings and, for every step, the numbers log.jsonl holds."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    RLTrainer(_config(small_models["full"], tmp_path / "plain")).train()
    RLTrainer(_config(small_models["full"], tmp_path / "tracked", log_with=["tensorboard", "wandb"])).train()
    drop = ("seconds",)
    plain, tracked = (
        [{k: v for k, v in r.items() if k not in drop} for r in read_log(tmp_path / run / "log.jsonl")]
        for run in ("plain", "tracked")
    )
    assert plain == tracked
    assert list((tmp_path / "tracked").rglob("events.out.tfevents*"))
    (run_file,) = (tmp_path / "tracked" / "wandb").glob("offline-run-*/run-*.wandb")
    records = list(_wandb_records(run_file))
    kinds = [record.WhichOneof("record_type") for record in records]
    assert kinds.count("run") == 1 and kinds[-1] == "exit"  # one run, finished
    assert next(r.run.project for r in records if r.HasField("run")) == "stabledrl-countdown"
    config = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for r in records for i in r.config.update}
    assert config["config/baseline"] == "stabledrl" and config["budget/max_steps"] == 2
    history = [
        {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.HasField("history")
    ]
    for logged, step in zip(history, read_log(tmp_path / "tracked" / "log.jsonl"), strict=True):
        numbers = {k: v for k, v in step.items() if isinstance(v, int | float)}
        assert {k: logged[k] for k in numbers} == numbers


def _wandb_records(path: Path):
    """The records of an offline W&B run file (wandb 0.2x+ ships no Python reader): W&B's 7-byte header, then
    LevelDB's log format, 32 KiB blocks of chunks, each behind a 7-byte header (CRC, length, type; a record is one
    FULL chunk or FIRST, MIDDLE..., LAST)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_a_tracker_that_is_not_installed_stops_the_run(small_models, tmp_path, monkeypatch):
    import accelerate.utils

    monkeypatch.setattr(accelerate.utils, "is_wandb_available", lambda: False)
    with pytest.raises(UserError, match=r"log_with \['wandb'\]: not installed; pip install wandb"):
        RLTrainer(_config(small_models["full"], tmp_path, log_with=["wandb"]))


def test_a_run_whose_weights_turn_non_finite_stops_and_saves_none_of_them(small_models, tmp_path, monkeypatch):
    """A finite loss and gradient do not make finite weights (an overflowing update): the run stops at that step,
    never ending with a NaN model and exit status 0."""
    trainer = RLTrainer(_config(small_models["full"], tmp_path, "grpo", steps=4))
    step = trainer.optimizer.step

    def overflowing_step(*args, **kwargs):
        step(*args, **kwargs)
        if trainer.step >= 2:  # the third optimizer step
            with torch.no_grad():
                next(trainer.train_dlm.model.parameters()).view(-1)[0] = float("inf")

    monkeypatch.setattr(trainer.optimizer, "step", overflowing_step)
    with pytest.raises(TrainingDiverged, match="the weights became non-finite at step 3"):
        trainer.train(resume=False)
    assert [r["step"] for r in read_log(tmp_path / "log.jsonl")] == [1, 2, 3]
    assert not (tmp_path / "final").exists()  # the default checkpoint of step 2 holds the weights before step 3
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002"]


# ----------------------------------------------------------------------------------------------- shared anchor
def _varied(trainer, monkeypatch):
    """Rewards that differ inside every group, so that each method has a gradient."""
    from stabledrl_bench.tasks.base import RewardResult

    by_length = _per_completion(lambda text, doc, profile: RewardResult(len(text) % 3, {}))
    monkeypatch.setattr(trainer.task, "reward_many", by_length)


@pytest.mark.parametrize("baseline", ["stabledrl", "grpo"])
def test_the_shared_anchor_adds_beta_times_k3_to_the_methods_loss(baseline, small_models, tmp_path, monkeypatch):
    """The anchored micro-batch loss equals the method's loss plus anchor_beta x k3 of (E_ref - E_theta) / L,
    recomputed here from the stored masks with the ELBO estimator on the two models (the policy moved away from the
    reference first, so the term is not 0)."""
    from stabledrl_bench.core.estimators import ESPOElbo

    trainer = RLTrainer(_config(small_models["full"], tmp_path, baseline, anchor_beta=0.3))
    assert trainer.ref_dlm is not None and type(trainer.anchor) is ESPOElbo and trainer.anchor.num_mc == 1
    _varied(trainer, monkeypatch)
    micro_batches, _ = trainer.rollout()
    with torch.no_grad():
        for p in trainer.train_dlm.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    mb = micro_batches[0]
    noise, ref = mb.anchor[1]
    state = mb.generators["mask"].get_state()  # StableDRL draws fresh masks in the loss: the same ones twice
    anchored, metrics = trainer._micro_loss(mb, 1)
    trainer.anchor = None
    mb.generators["mask"].set_state(state)
    plain, _ = trainer._micro_loss(mb, 1)
    estimator = ESPOElbo(num_mc=1)
    with torch.no_grad():
        new = estimator.evaluate(trainer.train_dlm, mb.batch, noise).elbo
        old = estimator.evaluate(trainer.ref_dlm, mb.batch, noise).elbo
    torch.testing.assert_close(ref.elbo, old)
    x = (old - new) / mb.batch.completion_ids.shape[1]
    kl = (torch.exp(x) - x - 1).mean()
    assert kl > 1e-6
    torch.testing.assert_close(metrics["anchor_kl"], kl.item(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(anchored.detach(), plain.detach() + 0.3 * kl, rtol=1e-5, atol=1e-7)


def test_the_anchor_pulls_nothing_at_the_start_and_is_logged(small_models, tmp_path, monkeypatch):
    """At the first step the policy is the reference: the anchor is 0 with a zero gradient, so step 1 is the
    unanchored step; from the second step on the policy has moved and the anchor is positive."""
    logs = {}
    for beta in (0.0, 0.5):
        trainer = RLTrainer(_config(small_models["full"], tmp_path / str(beta), "stabledrl", anchor_beta=beta))
        assert (trainer.ref_dlm is None) == (beta == 0)  # StableDRL loads a reference only for the anchor
        _varied(trainer, monkeypatch)
        trainer.train()
        logs[beta] = read_log(tmp_path / str(beta) / "log.jsonl")
    plain, anchored = logs[0.0], logs[0.5]
    assert "anchor_kl" not in plain[0]
    assert anchored[0]["anchor_kl"] == 0.0 and anchored[1]["anchor_kl"] > 0
    assert anchored[0]["grad_norm"] == plain[0]["grad_norm"] and anchored[0]["loss"] == plain[0]["loss"]
    assert anchored[1]["loss"] != plain[1]["loss"]


def test_the_anchor_is_checked_and_absent_from_an_unanchored_runs_identity(small_models, tmp_path):
    from stabledrl_bench.experiments.runner import TrainJob, control_config

    with pytest.raises(UserError, match=r"^anchor_beta must be a finite number >= 0"):
        _config(small_models["full"], tmp_path, anchor_beta=-0.1)
    plain = TrainJob(_config(small_models["full"], tmp_path))
    anchored = TrainJob(_config(small_models["full"], tmp_path, anchor_beta=0.04))
    assert "anchor_beta" not in plain.identity()["config"]  # runs cached before the anchor keep their keys
    assert anchored.identity()["config"]["anchor_beta"] == 0.04 and anchored.key() != plain.key()
    # every run of a seed shares its frozen control, anchored or not
    assert TrainJob(control_config(anchored.config, "")).key() == TrainJob(control_config(plain.config, "")).key()


def test_lora_anchors_to_the_adapter_free_model(small_models, tmp_path, monkeypatch):
    from stabledrl_bench.training.config import LoraSettings

    lora = LoraSettings(r=4, alpha=8, target_modules=["qkv"])
    trainer = RLTrainer(_config(small_models["full"], tmp_path, "spg", lora=lora, anchor_beta=0.1))
    assert trainer.ref_dlm is None
    _varied(trainer, monkeypatch)
    trainer.train()
    log = read_log(tmp_path / "log.jsonl")
    assert log[0]["anchor_kl"] == 0.0 and log[1]["anchor_kl"] > 0


# ----------------------------------------------------------------------------------------------- reference sync
def _cheap(model: Path, out: Path, baseline: str, monkeypatch, **overrides) -> TrainConfig:
    """Sudoku's 288 training puzzles (no 10,000-puzzle pool to generate) and no curves plot: for tests of what the
    trainer does between steps."""
    monkeypatch.setattr(trainer_module, "plot_curves", lambda *args, **kwargs: None)
    return _config(model, out, baseline, task="sudoku", train_split="train", generator_options={}, **overrides)


def test_a_synced_reference_mixes_by_hand_and_resumes_identically(small_models, tmp_path, monkeypatch):
    """Coupled-GRPO's reference synced every 2 steps with alpha 0.25: after steps 2 and 4 (and only then)
    ref <- (1 - a) ref + a policy (TRL's mix-up), so the reference at the end is (1 - a)^2 ref_0 + a (1 - a) policy_2
    + a policy_4, recomputed from the policies the trainer mixed in. The reference mixed at step 2 drives the KL of
    steps 3-4: a run stopped at step 2 and resumed must restore it from its checkpoint (it cannot be re-derived from
    the step-2 weights) to end with the same weights and losses."""
    alpha, mixed = 0.25, []
    original = trainer_module.mix_into

    def spy(target, source, a):
        mixed.append({k: v.detach().clone() for k, v in source.state_dict().items()})
        return original(target, source, a)

    monkeypatch.setattr(trainer_module, "mix_into", spy)
    options = {"ref_model_sync_steps": 2, "ref_model_mixup_alpha": alpha}
    logs = []
    for name, stop in (("a", None), ("b", 2)):
        config = _cheap(
            small_models["full"], tmp_path / name, "coupled_grpo", monkeypatch, steps=4, baseline_options=options
        )
        trainer = RLTrainer(config)
        _varied(trainer, monkeypatch)
        if stop is None:
            assert trainer.syncs_reference and trainer.run_info()["reference_sync"] == {"steps": 2, "alpha": alpha}
            start = {k: v.detach().clone() for k, v in trainer.ref_dlm.model.state_dict().items()}
            trainer.train()
            end = trainer.ref_dlm.model.state_dict()
            for key, ref0 in start.items():
                expected = (1 - alpha) ** 2 * ref0 + alpha * (1 - alpha) * mixed[0][key] + alpha * mixed[1][key]
                torch.testing.assert_close(end[key], expected, rtol=0, atol=1e-6)
            assert not torch.equal(mixed[0][key], mixed[1][key]) and not torch.equal(end[key], start[key])
        else:
            trainer.train(stop_after=stop)
            assert (tmp_path / name / "checkpoints" / "step_000002" / "reference" / "rank0.pt").is_file()
            trainer = RLTrainer(config)
            _varied(trainer, monkeypatch)
            trainer.train(resume=True)
        logs.append(read_log(tmp_path / name / "log.jsonl"))
    assert [r.get("reference_synced", False) for r in logs[0]] == [False, True, False, True]
    a, b = _params(tmp_path / "a" / "final"), _params(tmp_path / "b" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in logs[0]] == [r["loss"] for r in logs[1]] and logs[0][2]["kl"] > 0


def test_reference_sync_settings_are_checked_and_off_in_a_frozen_runs_identity(small_models, tmp_path):
    from stabledrl_bench.core.baseline import build_baseline
    from stabledrl_bench.experiments.runner import TrainJob

    with pytest.raises(UserError, match=r"^ref_model_sync_steps must be a positive integer, got 0$"):
        build_baseline("coupled_grpo", ref_model_sync_steps=0)
    with pytest.raises(UserError, match=r"^ref_model_mixup_alpha must be in \(0, 1\], got 1.5$"):
        build_baseline("grpo", sync_ref_model=True, ref_model_mixup_alpha=1.5)
    frozen = TrainJob(_config(small_models["full"], tmp_path, "grpo")).identity()["baseline_config"]
    assert "sync_ref_model" not in frozen and "ref_model_sync_steps" not in frozen  # earlier runs keep their keys
    synced = TrainJob(_config(small_models["full"], tmp_path, "coupled_grpo")).identity()["baseline_config"]
    assert (synced["sync_ref_model"], synced["ref_model_sync_steps"], synced["ref_model_mixup_alpha"]) == (
        True,
        64,
        0.6,
    )


# ----------------------------------------------------------------------------------------- checkpoint selection
def test_validation_keeps_the_best_checkpoint_resumes_and_leaves_training_alone(small_models, tmp_path, monkeypatch):
    """Validation after steps 1 and 2 scores 0.5 then 0.25 (scripted), so ``best/`` holds the step-1 weights, which
    the scorer was shown; the run trains exactly as one without validation, and stopped after step 1 and resumed
    it chooses the same."""
    from stabledrl_bench.training.trainer import VALIDATION_FILE
    from stabledrl_bench.training.validation import ValidationConfig, Validator

    shown: list[dict[str, torch.Tensor]] = []

    def scripted(self, dlm):
        shown.append({k: v.detach().clone() for k, v in dlm.model.state_dict().items()})
        return {"score": (0.5, 0.25)[len(shown) % 2 - 1], "cells": {"sudoku@16": 0.0}}

    monkeypatch.setattr(Validator, "score", scripted)
    one_step = small_budget(max_steps=2, num_iterations=1)
    validation = ValidationConfig(every=1, items=4, protocol="tiny")
    runs = {}
    for name, extra in (
        ("plain", {}),
        ("validated", {"validation": validation}),
        ("resumed", {"validation": validation}),
    ):
        config = _cheap(small_models["full"], tmp_path / name, "stabledrl", monkeypatch, budget=one_step, **extra)
        trainer = RLTrainer(config)
        _varied(trainer, monkeypatch)
        if name == "resumed":
            trainer.train(stop_after=1)
            trainer = RLTrainer(config)
            _varied(trainer, monkeypatch)
            trainer.train(resume=True)
        else:
            trainer.train()
        runs[name] = _params(tmp_path / name / "final")
    assert len(shown) == 4 and not (tmp_path / "plain" / "best").exists()
    assert all(torch.equal(runs["plain"][k], runs["validated"][k]) for k in runs["plain"])  # training untouched
    assert all(torch.equal(runs["resumed"][k], runs["validated"][k]) for k in runs["plain"])
    for name in ("validated", "resumed"):
        record = json.loads((tmp_path / name / VALIDATION_FILE).read_text())
        assert [entry["step"] for entry in record["history"]] == [1, 2] and record["best"]["step"] == 1
        assert record["best"]["score"] == 0.5 and (record["every"], record["items"], record["tasks"]) == (
            1,
            4,
            ["sudoku"],
        )
        best = _params(tmp_path / name / "best")
        assert all(torch.equal(best[k], shown[0][k]) for k in best) and not all(
            torch.equal(best[k], runs[name][k]) for k in best
        )


# JustGRPO on 4 micro-batches of one prompt each, devices = 2: rounds (0, 1) and (2, 3). Counts of completions with a
# non-zero advantage: 4, 0 | 2, 4, so valid_samples = 2 and 3, and the official loop sums K = 2 rounds.
JUSTGRPO_ADVANTAGES = ([1.0, -1.0, 0.5, -0.5], [0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, -2.0], [1.0, -1.0, 1.0, -1.0])
JUSTGRPO_ROUND_MEANS = (2.0, 2.0, 3.0, 3.0)


def test_justgrpo_combines_a_steps_micro_batches_as_its_official_loop(small_models, tmp_path, monkeypatch):
    """The first step's gradient is the official ``(1 / D) sum`` over rounds and devices of each device's loss scaled
    by its round's mean count (train.py lines 157-219, grpo.py lines 31-32), computed here one micro-batch at a time
    from the official formula at ratio 1: ``-(1 / (L (V + 1e-5))) sum_i A_i sum_t log pi(y_it)``."""
    from stabledrl_bench.core.baseline import training_estimator

    budget = dataclasses.replace(small_budget(), prompts_per_step=4)
    cfg = _config(small_models["full"], tmp_path, "justgrpo", budget=budget, baseline_options={"devices": 2})
    trainer = RLTrainer(cfg)
    designed = iter(JUSTGRPO_ADVANTAGES)

    def advantages(rewards, group_ids, correct=None, records=None):
        return torch.tensor(next(designed)), torch.ones_like(rewards, dtype=torch.bool)

    monkeypatch.setattr(trainer.baseline, "advantages", advantages)
    micro_batches, _ = trainer.rollout()
    assert [mb.context for mb in micro_batches] == [{"valid_samples": v, "rounds": 2} for v in JUSTGRPO_ROUND_MEANS]
    grad_norm = trainer.optimizer_step(micro_batches, 0)["grad_norm"]

    dlm = load_diffusion_lm(small_models["full"])  # the weights the trainer started from
    estimator = training_estimator(build_baseline("justgrpo"), dlm, block_length=budget.block_length)
    objective = torch.zeros(())
    for mb, valid in zip(micro_batches, JUSTGRPO_ROUND_MEANS, strict=True):
        est = estimator.evaluate(dlm, mb.batch, estimator.draw(mb.batch, torch.Generator().manual_seed(0)))
        per_completion = torch.zeros(len(mb.advantages)).index_add(
            0, est.row_to_seq, torch.where(est.token_mask, est.token_logp, 0.0).sum(dim=1)
        )
        canvas = mb.batch.completion_ids.shape[1]
        objective = objective - (mb.advantages * per_completion).sum() / (canvas * (valid + 1e-5)) / 2  # / D
    objective.backward()
    official = torch.cat([p.grad.flatten() for p in dlm.model.parameters() if p.grad is not None]).norm()
    assert math.isclose(grad_norm, float(official), rel_tol=1e-4), (grad_norm, float(official))


def test_justgrpo_refuses_a_step_its_devices_do_not_split(small_models, tmp_path):
    cfg = _config(small_models["full"], tmp_path, "justgrpo", baseline_options={"devices": 3})
    with pytest.raises(UserError, match="does not split into accumulation rounds of devices=3"):
        RLTrainer(cfg)
