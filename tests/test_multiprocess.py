"""Every shipped accelerate config on 2 CPU processes (gloo) gives what one process gives.

The GPU path is DDP, FSDP2 or DeepSpeed ZeRO-2 over N processes; here each shipped config is launched with
``--num_processes 2 --mixed_precision no`` on the CPU (FSDP and DeepSpeed rehearsed there, see
``stabledrl_bench/processes.py``). The same scenarios run once in this process (``multiprocess_scenarios.py``):

* training, with activation checkpointing, for each family's calling convention: the losses and gradient norms
  of every step equal one process's within 1e-5 -- with a reference model (GRPO), a process that drops every group
  (TraDo), pad-free batches whose number of forward passes differs between processes (LLaDA's Hub file), Dream's
  shifted logits and two micro-batches per process;
* every process rolls out with the same weights and makes the same padding decision, also with FSDP's
  RAM-efficient loading, where the processes other than rank 0 start from uninitialised memory;
* a run stopped after one rollout phase and resumed ends with the uninterrupted run's weights, bit for bit;
* evaluation: each process decodes a share, one record is written, equal to one process's (greedy and sampled);
* the documented command, ``reproduce table1`` (smoke preset), trains, evaluates, and when run again reuses
  everything.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from multiprocess_scenarios import EVALUATIONS, SCENARIOS, build_models, patch_task, run_evaluation, run_training
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
# config file -> accelerate's name for what runs on CPU processes
CONFIGS = {"ddp": "MULTI_CPU", "fsdp": "FSDP", "deepspeed_zero2": "DEEPSPEED"}


def launch(config: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file configs/accelerate/<config>.yaml`` on 2 CPU processes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "configs" / "accelerate" / f"{config}.yaml"),
        "--num_processes",
        "2",
        "--mixed_precision",
        "no",
        "--main_process_port",
        "0",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    return build_models(tmp_path_factory.mktemp("conventions"))


@pytest.fixture(scope="module")
def single(models, tmp_path_factory) -> dict:
    """The scenarios on this one process."""
    out = tmp_path_factory.mktemp("one-process")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch_task(patch.setattr)
            report = {name: run_training(name, models, out / name) for name in SCENARIOS}
            report.update({name: run_evaluation(name, models, out / f"results-{name}") for name in EVALUATIONS})
    finally:
        torch.set_num_threads(threads)
    return report


@pytest.fixture(scope="module", params=list(CONFIGS))
def launched(request, models, tmp_path_factory) -> tuple[str, dict, Path]:
    """The scenarios under one shipped config on 2 processes: (config, report, output folder)."""
    out = tmp_path_factory.mktemp(request.param)
    models_json = out / "models.json"
    models_json.write_text(json.dumps(models))
    proc = launch(request.param, str(ROOT / "tests" / "multiprocess_worker.py"), str(models_json), str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return request.param, json.loads((out / "report.json").read_text()), out


def test_every_shipped_config_is_launched_here():
    assert sorted(p.stem for p in (ROOT / "configs" / "accelerate").glob("*.yaml")) == sorted(CONFIGS)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)


def test_each_config_runs_its_own_backend_on_two_processes(launched):
    config, report, out = launched
    assert report["world_size"] == 2
    for name in SCENARIOS:
        info = json.loads((out / name / "run.json").read_text())
        assert (info["distributed"], info["world_size"]) == (CONFIGS[config], 2)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_training_equals_one_process(launched, single, scenario):
    _, report, _ = launched
    ours, theirs = report[scenario]["log"], single[scenario]["log"]
    assert len(ours) == len(theirs) == 4
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True), start=1):
        for key in ("loss", "grad_norm", "reward_mean", "kept_fraction"):
            if key in b:
                assert _close(a[key], b[key]), (scenario, step, key, a[key], b[key])


def test_one_process_drops_every_group_of_its_trado_rollouts(launched):
    _, report, _ = launched
    # one of the two prompts has only wrong answers: the process that draws it drops its whole micro-batch
    assert [r["kept_fraction"] for r in report["trado-sdar"]["log"] if "kept_fraction" in r] == [0.5, 0.5]


def test_every_process_rolls_out_with_the_same_weights_and_padding(launched):
    _, report, _ = launched
    for scenario in SCENARIOS:
        processes = report[scenario]["processes"]
        assert len(processes) == 2 and processes[0] == processes[1], scenario
    assert report["stabledrl-llada-hub"]["processes"][0]["pad_free"]  # the mask-ignoring file is detected


def test_ram_efficient_loading_is_exercised_only_under_fsdp(launched):
    config, report, _ = launched
    # transformers leaves the weights of every process but rank 0 uninitialised; the run above synced them
    assert report["rank0_weights"] == ([True, False] if config == "fsdp" else [True, True])


def test_a_resumed_run_ends_with_the_uninterrupted_weights(launched):
    _, report, out = launched
    assert report["resume"]["log"] == report["grpo-native"]["log"]
    resumed, uninterrupted = (
        load_file(str(out / run / "final" / "model.safetensors")) for run in ("resume", "grpo-native")
    )
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[name], uninterrupted[name]) for name in resumed)


@pytest.mark.parametrize("evaluation", list(EVALUATIONS))
def test_evaluation_equals_one_process_and_writes_one_record(launched, single, evaluation):
    _, report, _ = launched
    assert report[evaluation] == single[evaluation]
    assert len(report[evaluation]["files"]) == 1
