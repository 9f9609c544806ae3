"""``check-model``'s cluster plan: every number is the arithmetic its docstring states, checked by hand here."""

from __future__ import annotations

import json

import pytest
from conftest import SMALL

from stabledrl_bench.cli import main
from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.experiments.plan import GiB, plan
from stabledrl_bench.experiments.presets import presets


@pytest.fixture(scope="module")
def dlm():
    return build_tiny(**SMALL)


def test_memory_disk_and_time_by_hand(dlm):
    preset = presets("table1")["paper"]  # StableDRL's budget: 32 x 16 completions, canvas 256, mu 2, bf16, ckpt
    b = preset.budget
    p = sum(t.numel() for t in dlm.model.parameters())
    report = plan(dlm, preset, processes=8, baseline="stabledrl", tflops=100.0)
    memory = report["memory per GPU (GiB)"]
    assert memory["ddp"]["weights, gradients, AdamW"] == pytest.approx(16 * p / GiB)
    assert memory["fsdp"]["weights, gradients, AdamW"] == pytest.approx(16 * p / 8 / GiB)
    assert memory["deepspeed_zero2"]["weights, gradients, AdamW"] == pytest.approx((2 * p + 14 * p / 8) / GiB)
    assert memory["fsdp"]["rollout replica (unsharded)"] == pytest.approx(2 * p / GiB)
    assert memory["ddp"]["rollout replica (unsharded)"] == 0
    assert memory["fsdp"]["reference model"] == 0  # StableDRL has no reference model
    # one micro-batch: 1 prompt x 16 completions, SPG's bound with 2 Monte-Carlo rows each, 256 + 256 tokens
    rows, tokens, hidden, layers = 16 * 2, 512, SMALL["hidden_size"], SMALL["num_hidden_layers"]
    per_layer = 34 * rows * tokens * hidden
    assert memory["ddp"]["activations, checkpointing off"] == pytest.approx(layers * per_layer / GiB)
    assert memory["ddp"]["activations, checkpointing on"] == pytest.approx(
        (layers * 2 * rows * tokens * hidden + per_layer) / GiB
    )
    assert memory["ddp"]["logits (16-bit, fp32 log-probs and grad)"] == pytest.approx(
        rows * 256 * dlm.vocab_size * 10 / GiB
    )
    assert report["disk (GiB)"]["checkpoint (fp32 weights + AdamW, all shards)"] == pytest.approx(12 * p / GiB)
    # FLOPs: sampling 128 forwards of every completion, the old-policy estimate, mu x (forward + backward with
    # recomputation: 1 + 3), over 8 GPUs at 100 TFLOP/s
    forward = 2 * p * tokens * b.prompts_per_step * b.num_generations
    flops = forward * 128 + forward * 2 + 2 * (forward * 2 * 4)
    assert report["time (estimate)"]["seconds per rollout phase"] == pytest.approx(flops / (8 * 100e12))
    assert report["time (estimate)"]["hours per run"] == pytest.approx(flops / 8e14 * 1000 / 3600)


def test_a_baseline_with_a_reference_model_pays_for_it(dlm):
    p = sum(t.numel() for t in dlm.model.parameters())
    memory = plan(dlm, presets("table1")["paper"], processes=4, baseline="grpo", tflops=100.0)["memory per GPU (GiB)"]
    assert memory["fsdp"]["reference model"] == pytest.approx(4 * p / 4 / GiB)  # sharded, as loaded
    assert memory["ddp"]["reference model"] == pytest.approx(2 * p / GiB)  # bf16 on every GPU


def test_check_model_prints_the_new_probes_and_the_plan(capsys):
    assert main(["check-model", "--model", "tiny", "--processes", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    probes = {p["name"]: p["status"] for p in report["probes"]}
    assert probes["decoder blocks"] == probes["activation checkpointing"] == "pass"
    assert report["plan"]["assumptions"]["processes"] == 2
    assert set(report["plan"]["memory per GPU (GiB)"]) == {"ddp", "fsdp", "deepspeed_zero2"}
