"""``check-model``'s cluster plan: every number is the arithmetic its docstring states, checked by hand here."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import SMALL

from stabledrl_bench.cli import main
from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.experiments.plan import LOGITS_ROW, SHAPES, GiB, Shape, plan, sampling_forwards, table_plan
from stabledrl_bench.experiments.presets import presets
from stabledrl_bench.tasks import get_task


@pytest.fixture(scope="module")
def dlm():
    return build_tiny(**SMALL)


@pytest.fixture(scope="module")
def shape(dlm):
    return Shape.of(dlm)


def test_memory_disk_and_time_by_hand(dlm, shape):
    preset = presets("table1")["paper"]  # StableDRL's budget: 32 x 16 completions, canvas 256, mu 2, bf16, ckpt
    b = preset.budget
    p = sum(t.numel() for t in dlm.model.parameters())
    report = plan(shape, preset, processes=8, baseline="stabledrl", tflops=100.0)
    memory = report["memory per GPU (GiB)"]
    state = ("weights (fp32 masters)", "gradients", "AdamW moments (fp32)")
    assert [memory["ddp"][row] for row in state] == pytest.approx([4 * p / GiB, 4 * p / GiB, 8 * p / GiB])
    # DDP's gradients are views into its all-reduce buckets (gradient_as_bucket_view): no second copy
    assert not any("bucket" in row for row in memory["ddp"])
    assert sum(memory["fsdp"][row] for row in state) == pytest.approx(16 * p / 8 / GiB)
    assert sum(memory["deepspeed_zero2"][row] for row in state) == pytest.approx((2 * p + 14 * p / 8) / GiB)
    layers = SMALL["num_hidden_layers"]
    # the block computing, the one prefetched and part of a third, with or without checkpointing
    assert memory["fsdp"]["FSDP gathered blocks (unsharded)"] == pytest.approx(2.8 * 2 * p / layers / GiB)
    no_checkpointing = dataclasses.replace(preset, gradient_checkpointing=False)
    report_off = plan(shape, no_checkpointing, processes=8, baseline="stabledrl", tflops=100.0)
    gathered_off = report_off["memory per GPU (GiB)"]["fsdp"]["FSDP gathered blocks (unsharded)"]
    assert gathered_off == pytest.approx(2.8 * 2 * p / layers / GiB)
    assert memory["fsdp"]["rollout replica (unsharded)"] == pytest.approx(2 * p / GiB)
    assert memory["ddp"]["rollout replica (unsharded)"] == 0
    assert memory["fsdp"]["reference model"] == 0  # StableDRL has no reference model
    # one micro-batch: 1 prompt x 16 completions, SPG's bound with 2 Monte-Carlo rows each, 256 + 256 tokens
    rows, tokens, hidden, mlp = 16 * 2, 512, SMALL["hidden_size"], SMALL["intermediate_size"]
    assert shape.mlp == mlp
    per_layer = 2 * (11 * hidden + 4 * mlp) * rows * tokens  # bf16 values saved per block
    outside = 2 * 3 * hidden * rows * tokens  # the embedding output, the final norm's input and output
    assert memory["ddp"]["activations, checkpointing off"] == pytest.approx((layers * per_layer + outside) / GiB)
    assert memory["ddp"]["activations, checkpointing on"] == pytest.approx(
        (layers * 2 * rows * tokens * hidden + per_layer + outside) / GiB
    )
    # bf16 logits of all 512 positions and the copy of the 256 scored ones kept for the backward pass (2 bytes each),
    # and one piece's float32 log-softmax, incoming gradient and log-softmax gradient (3 x 4 bytes); at this small
    # vocabulary all 32 rows x 256 scored positions fit in one piece (32 x 256 x V values <= 2^24)
    assert rows * 256 * dlm.vocab_size <= 2**24
    logits = rows * (512 + 256) * dlm.vocab_size * 2 + 3 * 4 * rows * 256 * dlm.vocab_size
    assert memory["ddp"][LOGITS_ROW] == pytest.approx(logits / GiB)
    assert report["disk (GiB)"]["checkpoint (fp32 weights + AdamW, all shards)"] == pytest.approx(12 * p / GiB)
    # FLOPs: sampling 128 forwards of every completion, the old-policy estimate, mu x (forward + backward with
    # recomputation: 1 + 3), over 8 GPUs at 100 TFLOP/s
    forward = 2 * p * tokens * b.prompts_per_step * b.num_generations
    flops = forward * 128 + forward * 2 + 2 * (forward * 2 * 4)
    assert report["time (estimate)"]["seconds per rollout phase"] == pytest.approx(flops / (8 * 100e12))
    assert report["time (estimate)"]["hours per run"] == pytest.approx(flops / 8e14 * 1000 / 3600)


def test_a_baseline_with_a_reference_model_pays_for_it(dlm, shape):
    p = sum(t.numel() for t in dlm.model.parameters())
    memory = plan(shape, presets("table1")["paper"], processes=4, baseline="grpo", tflops=100.0)["memory per GPU (GiB)"]
    assert memory["fsdp"]["reference model"] == pytest.approx(4 * p / 4 / GiB)  # sharded, as loaded
    assert memory["ddp"]["reference model"] == pytest.approx(2 * p / GiB)  # bf16 on every GPU


def test_check_model_prints_the_new_probes_and_the_plan(capsys):
    assert main(["check-model", "--model", "tiny", "--processes", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    probes = {p["name"]: p["status"] for p in report["probes"]}
    assert probes["decoder blocks"] == probes["activation checkpointing"] == "pass"
    assert report["plan"]["assumptions"]["processes"] == 2
    assert set(report["plan"]["memory per GPU (GiB)"]) == {"ddp", "fsdp", "deepspeed_zero2"}


def test_the_whole_table_by_hand(shape):
    """Every baseline and the frozen control on every task, each checkpoint evaluated at the three lengths, the disk
    all runs hold at the end, and which launch config fits a GPU of a given memory."""
    preset = presets("table1")["paper"]
    one = {name: plan(shape, preset, processes=8, baseline=name, tflops=100.0) for name in ("grpo", "trado")}
    report = table_plan(shape, preset, processes=8, tflops=100.0, gpu_memory=1.0)
    assert list(report["methods"]) == ["grpo", "spg", "espo", "trado", "stabledrl", "frozen control"]
    assert report["methods"]["frozen control"] == report["methods"]["grpo"]  # GRPO at learning rate 0
    assert report["methods"]["trado"]["hours per run"] == one["trado"]["time (estimate)"]["hours per run"]
    p, tasks = shape.parameters, ("gsm8k", "math500", "countdown", "sudoku")
    # 24 runs (5 baselines and the control on 4 tasks), each keeping 2 fp32 checkpoints (12 p bytes) and a bf16 final
    disk = report["disk at the peak (GiB)"]
    assert disk["runs"] == 24 and disk["total"] == pytest.approx(24 * (2 * 12 * p + 2 * p) / GiB)
    assert disk["total with keep_checkpoints 1"] == pytest.approx(24 * (12 * p + 2 * p) / GiB)
    # evaluation: each problem decoded at 128/256/512 tokens in length/2 steps (d1), a forward over prompt + canvas each
    problems = len(get_task("gsm8k").eval_docs())
    forwards = sum(problems * (n // 2) * (256 + n) for n in (128, 256, 512))
    assert report["evaluation hours per checkpoint"]["gsm8k"] == pytest.approx(forwards * 2 * p / 8e14 / 3600)
    assert report["evaluation"]["test problems"] == {task: len(get_task(task).eval_docs()) for task in tasks}
    assert report["hours (all runs and evaluations, one after another)"] == pytest.approx(
        4 * sum(m["hours per run"] for m in report["methods"].values())
        + 6 * sum(report["evaluation hours per checkpoint"].values())
    )
    grpo_ddp = one["grpo"]["memory per GPU (GiB)"]["ddp"]["total with the preset's checkpointing"]
    assert report["methods"]["grpo"]["memory per GPU (GiB)"]["ddp"] == grpo_ddp
    fits = report["fits (GiB per GPU)"]
    assert fits["ddp"]["grpo"] is (grpo_ddp <= 1.0) and fits["gpu memory"] == 1.0


def test_check_model_plans_a_published_shape_without_weights(tmp_path, capsys):
    """`--shape` (and `--config`, the same fields in a config.json) build LLaDA-8B on the meta device: 8.0B
    parameters; the whole table, the peak disk docs/gpu.md quotes, and a fit verdict for 80 GiB GPUs."""
    assert main(["check-model", "--shape", "llada-8b", "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "disk at the peak: 24 runs keeping 2 checkpoints and a final model each need 4.5 TiB, or 2.4 TiB" in out
    assert "ddp.yaml on 80 GiB GPUs: does not fit: grpo, spg, espo, trado, stabledrl, frozen control" in out
    assert "fsdp.yaml on 80 GiB GPUs: does not fit: trado" in out
    family, fields = SHAPES["llada-8b"]
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": family, "architectures": ["LLaDAModelLM"], **fields}))
    assert main(["check-model", "--config", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert 8.0e9 < report["plan"]["shape"]["parameters"] < 8.05e9 and report["plan"]["shape"]["layers"] == 32
    assert report["table"]["disk at the peak (GiB)"]["runs"] == 24 and report["probes"] == []
    config.write_text(json.dumps({"model_type": "gpt2"}))
    assert main(["check-model", "--config", str(config)]) == 2
    assert "model_type 'gpt2'; the plan knows llada, dream, sdar" in capsys.readouterr().err


def test_the_published_shapes_carry_what_the_activation_and_sampling_counts_need():
    """SDAR-8B (Qwen3's block): MLP width, per-head query/key norms over 32 + 8 heads of 128, block 4; its sampling
    with the key cache costs (prompt + canvas + steps x block) tokens, full attention steps x (prompt + canvas)."""
    sdar, llada = Shape.named("sdar-8b"), Shape.named("llada-8b")
    assert (sdar.mlp, sdar.qk_norm, sdar.block) == (12288, 32 * 128 + 8 * 128, 4)
    assert (llada.mlp, llada.qk_norm, llada.block) == (12288, 0, 0)
    assert sdar.block_activation_values() == 11 * 4096 + 4 * 12288 + 2 * 5120
    budget = presets("table2")["paper"].budget
    tokens = budget.max_prompt_length + budget.max_completion_length
    assert sampling_forwards(budget, 4) == pytest.approx((tokens + budget.diffusion_steps * 4) / tokens)
    assert sampling_forwards(budget) == budget.diffusion_steps
