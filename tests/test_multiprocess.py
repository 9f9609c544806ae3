"""Every shipped accelerate config on 2 CPU processes (gloo) gives what one process gives.

The GPU path is DDP, FSDP2 or DeepSpeed ZeRO-2 over N processes; here each shipped config is launched with
``--num_processes 2 --mixed_precision no`` on the CPU (FSDP and DeepSpeed rehearsed there, see
``stabledrl_bench/processes.py``). The same scenarios run once in this process (``multiprocess_scenarios.py``):

* training, with activation checkpointing, for each family's calling convention: the losses and gradient norms
  of every step equal one process's within 1e-5 -- with a reference model mixed with the policy (GRPO with TRL's
  reference sync) and a validation of its checkpoints after each rollout phase, a process that drops every group
  (TraDo), pad-free batches whose number of forward passes differs between processes (LLaDA's Hub file), Dream's
  shifted logits and two micro-batches per process;
* every process rolls out with the same weights and makes the same padding decision, also with FSDP's
  RAM-efficient loading, where the processes other than rank 0 start from uninitialised memory;
* a run stopped after one rollout phase and resumed ends with the uninterrupted run's weights, bit for bit, and
  the same validation history and best step;
* evaluation: each process decodes a share, one record is written, equal to one process's (greedy and sampled);
* the documented command, ``reproduce table1`` (smoke preset), trains, evaluates, and when run again reuses
  everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from multiprocess_scenarios import (
    ANCHORED,
    CONFIGS,
    EVALUATIONS,
    ROOT,
    SCENARIOS,
    assert_same_training,
    build_models,
    launch,
    run_on_one_process,
    run_on_two_processes,
)
from safetensors.torch import load_file


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    return build_models(tmp_path_factory.mktemp("conventions"))


@pytest.fixture(scope="module")
def single(models, tmp_path_factory) -> dict:
    """The scenarios on this one process."""
    return run_on_one_process(models, tmp_path_factory.mktemp("one-process"))


@pytest.fixture(scope="module", params=list(CONFIGS))
def launched(request, models, tmp_path_factory) -> tuple[str, dict, Path]:
    """The scenarios under one shipped config on 2 processes: (config, report, output folder)."""
    out = tmp_path_factory.mktemp(request.param)
    return request.param, run_on_two_processes(request.param, models, out), out


def test_every_shipped_config_is_launched_here():
    assert sorted(p.stem for p in (ROOT / "configs" / "accelerate").glob("*.yaml")) == sorted(CONFIGS)


def test_each_config_runs_its_own_backend_on_two_processes(launched):
    config, report, out = launched
    assert report["world_size"] == 2
    for name in SCENARIOS:
        info = json.loads((out / name / "run.json").read_text())
        assert (info["distributed"], info["world_size"]) == (CONFIGS[config], 2)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_training_equals_one_process(launched, single, scenario):
    _, report, _ = launched
    assert_same_training(report[scenario], single[scenario], scenario)


def test_one_process_drops_every_group_of_its_trado_rollouts(launched):
    _, report, _ = launched
    # one of the two prompts has only wrong answers: the process that draws it drops its whole micro-batch
    assert [r["kept_fraction"] for r in report["trado-sdar"]["log"] if "kept_fraction" in r] == [0.5, 0.5]


def test_the_shared_anchor_is_active_under_every_wrapper(launched):
    config, report, _ = launched
    for scenario in ANCHORED:  # 0 while the policy is the reference, then positive (equal to 1 process: above)
        values = [r["anchor_kl"] for r in report[scenario]["log"]]
        assert values[0] == 0.0 and max(values) > 0, (config, scenario, values)


def test_every_process_rolls_out_with_the_same_weights_and_padding(launched):
    _, report, _ = launched
    for scenario in SCENARIOS:
        processes = report[scenario]["processes"]
        assert len(processes) == 2 and processes[0] == processes[1], scenario
    assert report["stabledrl-llada-hub"]["processes"][0]["pad_free"]  # the mask-ignoring file is detected


def test_ram_efficient_loading_is_exercised_only_under_fsdp(launched):
    config, report, _ = launched
    # transformers 4.5x leaves the weights of every process but rank 0 uninitialised (the run above synced them);
    # transformers 5 reads them on every process
    skipped = config == "fsdp" and int(transformers.__version__.split(".")[0]) < 5
    assert report["rank0_weights"] == [True, not skipped]


def test_a_resumed_run_ends_with_the_uninterrupted_weights(launched):
    _, report, out = launched
    assert report["resume"]["log"] == report["grpo-native"]["log"]
    assert report["resume"]["validation"] == report["grpo-native"]["validation"]  # the same history and choice
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


# ------------------------------------------------------------------------------------------ the documented command
REPRODUCE = ["reproduce", "table1", "--preset", "smoke", "--baselines", "grpo,trado"]


def _reproduce_args(root: Path) -> list[str]:
    return [
        *REPRODUCE,
        "--results",
        str(root / "results"),
        "--runs",
        str(root / "runs"),
        "--leaderboard",
        str(root / "lb.md"),
    ]


def _records(results: Path) -> dict[tuple, dict]:
    found = {}
    for path in results.rglob("*.json"):
        if path.parent.name != "training":
            record = json.loads(path.read_text())
            found[(record["baseline"], record["task"], record["length"])] = record
    return found


@pytest.fixture(scope="module")
def reproduced_once(tmp_path_factory) -> Path:
    """``reproduce table1 --preset smoke`` (two baselines) on one process, in a fresh interpreter."""
    root = tmp_path_factory.mktemp("reproduce-one")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "stabledrl_bench", *_reproduce_args(root)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.mark.parametrize("config", list(CONFIGS))
def test_the_documented_launch_trains_evaluates_and_resumes_like_one_process(config, reproduced_once, tmp_path):
    proc = launch(config, "-m", "stabledrl_bench", *_reproduce_args(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("leaderboard:") == 1  # one process prints, one process writes
    ours, theirs = _records(tmp_path / "results"), _records(reproduced_once / "results")
    assert ours.keys() == theirs.keys() and len(ours) == 9  # the start, grpo and trado at three lengths
    for key, record in ours.items():
        # the SFT warm start sums its batch in two halves, so weights agree to rounding, not bit for bit
        assert record["samples_sha256"] == theirs[key]["samples_sha256"], key
        assert record["metrics"]["accuracy"] == theirs[key]["metrics"]["accuracy"], key
    training = "results/training/table1-smoke__sudoku.csv"
    assert (tmp_path / training).read_text() == (reproduced_once / training).read_text()
    # the same command again: every run and record is reused, nothing trains or decodes again
    again = launch(config, "-m", "stabledrl_bench", *_reproduce_args(tmp_path))
    assert again.returncode == 0, again.stderr[-4000:]
    assert "measured (" not in again.stdout and again.stdout.count("reused") >= 9
