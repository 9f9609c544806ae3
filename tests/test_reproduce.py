"""`reproduce` end to end (smoke preset), resumability, and the command line's one-line errors."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stabledrl_bench.cli import main
from stabledrl_bench.experiments.comparison import TABLE_BASELINES, Replicate, comparison
from stabledrl_bench.experiments.presets import presets
from stabledrl_bench.experiments.summary import training_summary
from stabledrl_bench.reporting.results import load_results
from stabledrl_bench.reporting.training import read_training, training_path


def _run(tmp_path: Path, table: str, *extra: str) -> int:
    """``reproduce`` (smoke preset) in this process, unless ``extra`` names ``--workers``: under the suite both cores
    are busy anyway, and each worker process would import torch and transformers again (about 5 s)."""
    workers = [] if "--workers" in extra else ["--workers", "1"]
    return main(
        [
            "reproduce", table, "--preset", "smoke",
            "--results", str(tmp_path / "results"),
            "--runs", str(tmp_path / "runs"),
            "--leaderboard", str(tmp_path / "leaderboard.md"),
            *workers,
            *extra,
        ]
    )  # fmt: skip


# table 1 in this process, table 2 (the block model) in two workers; the Ctrl-C test runs table 1 in workers
@pytest.mark.parametrize(("table", "workers"), [("table1", 1), ("table2", 2)])
def test_smoke_preset_trains_evaluates_and_writes_the_leaderboard(tmp_path, table, workers, capsys):
    assert _run(tmp_path, table, "--workers", str(workers)) == 0
    preset = presets(table)["smoke"]
    records = load_results(tmp_path / "results")
    baselines = {r["baseline"] for r in records}
    assert baselines == {"sft", *TABLE_BASELINES}
    per_row = len(preset.lengths) * len(preset.protocols)
    assert len(records) == per_row * (len(TABLE_BASELINES) + 1)
    rl = [r for r in records if r["baseline"] != "sft"]
    assert {r["budget_hash"] for r in rl} == {preset.budget.hash()}
    rules = {r["baseline"]: r["advantage"]["rule"] for r in rl}  # each method's advantage rule is on its rows
    assert rules == {**dict.fromkeys(TABLE_BASELINES, "group_mean"), "espo": "leave_one_out", "trado": "group_zscore"}
    assert all(r["metrics"]["n"] == preset.eval_limit * _repeats(r) for r in records)
    board = (tmp_path / "leaderboard.md").read_text()
    assert f"comparison `{table}-smoke`" in board
    assert "Published (not measured here)" in board
    assert "Change from the starting point** (`sft`" in board
    out = capsys.readouterr().out
    assert "preset 'smoke'" in out and "the paper preset needs" in out
    assert "vs the frozen start on the same ones" in out
    stages = 3 + 2 * len(TABLE_BASELINES)  # warm start, start eval, each baseline's run and eval, control
    if workers == 2:
        assert f"[stage 1/{stages} | " in out and "estimate after the first stage, 1 running] sudoku seed 0" in out
        # from the first stage on, with the workers: stage 2 starts once the warm start it needs has finished
        assert re.search(rf"\[stage 2/{stages} \| \S+ elapsed, ~\S+ left, 1 running\] sudoku seed 0", out)
        assert re.search(rf"\[stage 3/{stages} \| \S+ elapsed, ~\S+ left, 2 running\] sudoku seed 0", out)
        assert "workers: 2 processes side by side, 1 thread(s) each" in out
    else:
        assert f"[stage 1/{stages} | 0s elapsed, estimate after the first stage] sudoku seed 0" in out
        assert re.search(rf"\[stage 3/{stages} \| \S+ elapsed, ~\S+ left\] sudoku seed 0", out)
        assert "workers:" not in out
    assert "results: " in out and "rewritten only when named: --results results --leaderboard leaderboard.md" in out
    assert f"[stage {stages}/{stages} | " in out and "sudoku seed 0: frozen control (learning rate 0)" in out
    _check_frozen_control(tmp_path, table, preset)
    assert "**Training reward, " in board

    # A second run finds everything done: nothing is retrained or re-evaluated.
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "results").rglob("*.json")}
    assert _run(tmp_path, table) == 0
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "results").rglob("*.json")}
    assert before == after
    out = capsys.readouterr().out
    assert "warm start: reused" in out and out.count("trained, reused") == len(TABLE_BASELINES) + 1


def _check_frozen_control(tmp_path: Path, table: str, preset) -> None:
    """The control kept the start's weights exactly and drew the same first rollout as every RL run."""
    import pandas as pd
    from safetensors.torch import load_file

    for task in preset.default_tasks():
        runs = tmp_path / "runs" / f"{table}-smoke" / task / "s0"
        start, frozen = (load_file(runs / name / "final" / "model.safetensors") for name in ("sft", "frozen"))
        assert start.keys() == frozen.keys() and all(torch.equal(start[k], frozen[k]) for k in start)
        rewards = pd.read_csv(tmp_path / "results" / "training" / f"{table}-smoke__{task}.csv")
        assert set(rewards["run"]) == {"frozen", *TABLE_BASELINES}
        first = rewards[rewards["step"] == 1]["reward_mean"]
        assert len(first) == len(TABLE_BASELINES) + 1 and first.nunique() == 1
        assert (tmp_path / "results" / "training" / f"{table}-smoke__{task}.png").is_file()


def _repeats(record: dict) -> int:
    return record["settings"]["protocol"]["repeats"]


def test_interrupted_training_resumes(tmp_path, monkeypatch):
    """A run killed after its checkpoint resumes instead of starting over. With checkpoint selection on
    (``--eval-every``) its best checkpoint on the validation docs is evaluated beside its final one, both records
    say which they are, the board labels the two rows, and the resumed run keeps its choice."""
    from stabledrl_bench.training.checkpoint import latest_checkpoint
    from stabledrl_bench.training.trainer import RLTrainer

    calls = []
    original = RLTrainer.train

    def spy(self, *, resume=False, stop_after=None):
        calls.append((self.output_dir.name, latest_checkpoint(self.output_dir) is not None))
        return original(self, resume=resume, stop_after=stop_after)

    monkeypatch.setattr(RLTrainer, "train", spy)
    run_dir = tmp_path / "runs" / "table1-smoke" / "sudoku" / "s0" / "grpo"
    argv = ("--baselines", "grpo", "--eval-every", "2", "--limit", "4", "--workers", "1")  # in this process: the spy
    assert _run(tmp_path, "table1", *argv) == 0
    assert calls == [("grpo", False), ("frozen", False)]
    _check_selection(tmp_path, run_dir)
    # Simulate a crash after the last checkpoint: no final model, and the runner never wrote the run's summary.

    shutil.rmtree(run_dir / "final")
    (run_dir / "summary.json").unlink()
    assert _run(tmp_path, "table1", *argv) == 0
    assert calls == [("grpo", False), ("frozen", False), ("grpo", True)]  # the finished control is not rerun
    assert (run_dir / "final" / "config.json").is_file()
    _check_selection(tmp_path, run_dir)


def _check_selection(tmp_path: Path, run_dir: Path) -> None:
    """grpo's final and best checkpoints are evaluated at every length (the smoke run validates once, at its last
    step, on 4 generated puzzles at the 48-token canvas) and labelled; the control selects nothing."""
    validation = json.loads((run_dir / "validation.json").read_text())
    assert validation["best"]["step"] == 2 and validation["lengths"] == [48] and validation["items"] == 4
    records = [r for r in load_results(tmp_path / "results") if r["baseline"] == "grpo"]
    chosen = {r.get("selection"): r for r in records}
    assert sorted(r["selection"] for r in records) == ["best"] * 3 + ["final"] * 3
    assert chosen["best"]["validation"] == {
        **{k: validation[k] for k in ("every", "tasks", "lengths", "items", "protocol")},
        "step": 2,
        "score": validation["best"]["score"],
    }
    assert chosen["best"]["model"]["checkpoint"].endswith("grpo/best") and "validation" not in chosen["final"]
    board = (tmp_path / "leaderboard.md").read_text()
    assert "| grpo | final |" in board and "| grpo | best on validation (step 2) |" in board
    assert not (run_dir.parent / "frozen" / "best").exists()


def test_seeds_are_replicates_and_a_later_seed_adds_to_them(tmp_path, capsys):
    """A seed is a replicate: warm start, RL, control and evaluation per seed. ``--seeds 1`` after ``--seeds 0``
    (another runs folder, as in a fresh clone whose results/ holds seed 0) keeps seed 0's rollouts in the
    training-reward file; ``--seeds 0,1`` over both runs folders reuses every stage; the board pools the seeds in its
    cells and shows each seed's change from its own start over runs; training rewards are paired with the control of
    the same seed. (One test: each seed's runs cost minutes on 2 cores.)"""
    import pandas as pd

    argv = ("--baselines", "grpo", "--tasks", "sudoku")
    path = tmp_path / "results" / "training" / "table1-smoke__sudoku.csv"
    runs = tmp_path / "runs" / "table1-smoke" / "sudoku"
    assert _run(tmp_path, "table1", *argv, "--seeds", "0") == 0
    seed0 = pd.read_csv(path)
    (runs / "s0").rename(tmp_path / "s0")  # seed 0's runs are elsewhere: only its results remain
    assert _run(tmp_path, "table1", *argv, "--seeds", "1") == 0
    rewards = pd.read_csv(path)
    assert "(rollouts of seeds 0, 1 pooled)" in capsys.readouterr().out
    pd.testing.assert_frame_equal(rewards[rewards["seed"] == 0].reset_index(drop=True), seed0)
    assert set(rewards[rewards["seed"] == 1]["run"]) == {"grpo", "frozen"}

    # seed 0's warm start committed (`starts save`), and its copy in the runs folder gone: the committed start is
    # copied, not trained, and seed 0's RL runs and records, made from the same weights, are all reused
    committed = tmp_path / "starts" / "table1-smoke__sudoku__s0"
    (tmp_path / "s0").rename(runs / "s0")
    assert main(["starts", "save", str(runs / "s0" / "sft"), "--to", str(tmp_path / "starts")]) == 0
    trained = (runs / "s0" / "sft" / "final" / "model.safetensors").read_bytes()
    shutil.rmtree(runs / "s0" / "sft")
    assert _run(tmp_path, "table1", *argv, "--seeds", "0,1", "--starts", str(tmp_path / "starts")) == 0
    out = capsys.readouterr().out
    assert "warm start: copied from the committed start table1-smoke__sudoku__s0" in out
    assert (runs / "s0" / "sft" / "final" / "model.safetensors").read_bytes() == trained
    assert json.loads((runs / "s0" / "sft" / "warm_start.json").read_text())["committed"] == str(committed)
    assert out.count("warm start: reused") == 1 and out.count("trained, reused") == 4  # grpo and control per seed
    assert all((runs / f"s{seed}" / name / "final").is_dir() for seed in (0, 1) for name in ("sft", "grpo", "frozen"))
    records = load_results(tmp_path / "results")
    assert sorted({(r["baseline"], r["seed"]) for r in records}) == [("grpo", 0), ("grpo", 1), ("sft", 0), ("sft", 1)]
    board = (tmp_path / "leaderboard.md").read_text()
    assert "**Change from the start over runs**" in board and "| grpo | final | 2 |" in board
    assert "| Seeds |" in board and "| 0, 1 |" in board and "Per seed (seed: change)" in board
    rewards = pd.read_csv(path)
    assert sorted(rewards["seed"].unique()) == [0, 1]
    first = rewards[rewards["step"] == 1].set_index(["seed", "run"])["reward_mean"]
    for seed in (0, 1):  # step 1 is before any update: every run of a seed equals its control
        assert first[(seed, "grpo")] == first[(seed, "frozen")]


def test_a_task_outside_the_default_run_runs_when_named(tmp_path, capsys):
    """Countdown is in the tiny presets but not their default run; named, it gets its own warm start settings."""
    assert _run(tmp_path, "table1", "--tasks", "countdown", "--baselines", "grpo") == 0
    assert "tasks: countdown" in capsys.readouterr().out
    records = load_results(tmp_path / "results")
    assert {(r["task"], r["baseline"]) for r in records} == {("countdown", "sft"), ("countdown", "grpo")}
    spec = json.loads((tmp_path / "runs" / "table1-smoke" / "countdown" / "s0" / "sft" / "warm_start.json").read_text())
    sft = spec["spec"]["sft"]
    assert (sft["task"], sft["max_steps"], sft["generator_options"]["num_numbers"]) == ("countdown", 10, [3])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["reproduce", "table1", "--preset", "huge"], "unknown preset"),
        (["reproduce", "table1", "--preset", "smoke", "--seeds", "0,x"], "--seeds: expected comma-separated"),
        (["reproduce", "table1", "--preset", "paper"], "needs --model"),
        (["reproduce", "table1", "--preset", "smoke", "--baselines", "grpo,nope"], "unknown baseline"),
        (["reproduce", "table1", "--preset", "smoke", "--starts", "/no/such/dir"], "--starts /no/such/dir: no such"),
        (["eval", "--model", "/no/such/dir", "--task", "sudoku"], "model path does not exist"),
        (["eval", "--model", "tiny", "--task", "nope"], "unknown task"),
        (["train", "--config", "/no/such.yaml"], "config file not found"),
        (["leaderboard", "--results", "RESULTS"], "unreadable result file"),
    ],
)
def test_cli_errors_are_one_line(argv, message, tmp_path, capsys):
    if "RESULTS" in argv:
        bad = tmp_path / "results" / "c"
        bad.mkdir(parents=True)
        (bad / "x.json").write_text("{not json")
        argv = [a.replace("RESULTS", str(tmp_path / "results")) for a in argv] + ["--out", str(tmp_path / "lb.md")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert message in err


def test_list_commands(capsys):
    for what in ("baselines", "tasks", "protocols"):
        assert main(["list", what]) == 0
    out = capsys.readouterr().out
    assert "stabledrl" in out and "sudoku" in out and "tracerl-dynamic" in out


def test_grade_command(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text(
        json.dumps({"prediction": "<answer>3+4-5</answer>", "numbers": [3, 4, 5], "target": 2}) + "\n" + "{oops\n"
    )
    out = tmp_path / "out.jsonl"
    assert main(["grade", "--task", "countdown", "--input", str(path), "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["correct"] is True and rows[0]["score"] == 1.0
    assert "error" in rows[1]


def test_a_launch_the_budget_does_not_split_over_stops_before_the_warm_start(tmp_path, capsys, monkeypatch):
    """The smoke preset's 6 prompts per step (micro-batches of 3) on 4 processes: one line, and no SFT first."""
    from types import SimpleNamespace

    from stabledrl_bench.training import trainer

    monkeypatch.setattr(trainer, "process_state", lambda: SimpleNamespace(num_processes=4))
    assert _run(tmp_path, "table1") == 2
    err = capsys.readouterr().err.strip()
    split = "prompts_per_step=6 must split evenly over 4 process(es) in micro-batches of per_device_prompts=3"
    assert err == f"error: {split}"
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(
    os.environ.get("STABLEDRL_BF16_PRESET") is None,
    reason="opt-in: STABLEDRL_BF16_PRESET=smoke (minutes) or tiny (the tiny preset's budget)",
)
def test_opt_in_a_preset_in_bf16_beside_float32(tmp_path, capsys):
    """``reproduce table1`` under a preset (GRPO and StableDRL) in float32 and then, in the same program, in bf16
    mixed precision, each from its float32 warm start: every bf16 number finite, every ``final/`` bf16, every record
    written; prints both runs' first-step losses, mean rewards and accuracies side by side (the rollouts differ in
    bf16, so they are compared by eye, not by a tolerance)."""
    import dataclasses

    from stabledrl_bench.experiments.comparison import comparison
    from stabledrl_bench.experiments.reproduce import reproduce
    from stabledrl_bench.training.runlog import read_log

    name = os.environ["STABLEDRL_BF16_PRESET"]
    summary = {}
    for bf16 in (False, True):
        root = tmp_path / ("bf16" if bf16 else "float32")
        run = comparison("table1", preset=name, baselines="grpo,stabledrl", runs=str(root))
        reproduce(dataclasses.replace(run, preset=dataclasses.replace(run.preset, bf16=bf16)))
        for info in run.runs.rglob("run.json"):
            if info.parent.name in ("grpo", "stabledrl"):
                log = read_log(info.parent / "log.jsonl")
                assert json.loads(info.read_text())["mixed_precision"] == ("bf16" if bf16 else "no")
                assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in log)
                final = load_file(str(info.parent / "final" / "model.safetensors"))
                assert {t.dtype for t in final.values()} == {torch.bfloat16 if bf16 else torch.float32}
                key = (info.parent.parent.parent.name, info.parent.name, "bf16" if bf16 else "float32")
                summary[key] = (log[0]["loss"], sum(r["reward_mean"] for r in log) / len(log))
        for record in load_results(run.results):
            key = (record["task"], record["baseline"], record["length"], "bf16" if bf16 else "float32")
            summary[key] = record["metrics"]["accuracy"]
    with capsys.disabled():
        for key, value in sorted(summary.items(), key=str):
            print(key, value)


def test_training_rewards_of_an_earlier_invocation_survive_a_later_one_with_other_methods(tmp_path):
    """`--baselines spg` after `--baselines grpo` (same seed) must not drop grpo's rollouts from the csv, and a run
    read again replaces its earlier rows instead of adding to them."""

    def log(name: str, rewards: list[float]) -> None:
        path = Replicate(run, "sudoku", 0).runs / name / "log.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [{"step": i + 1, "phase_iteration": 0, "reward_mean": r} for i, r in enumerate(rewards)]
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    def summarize(baseline: str) -> dict[str, list[float]]:
        training_summary(
            comparison(
                "table1",
                preset="smoke",
                baselines=baseline,
                tasks="sudoku",
                seeds="0",
                runs=str(tmp_path / "runs"),
                results=str(tmp_path / "results"),
            ),
            "sudoku",
        )
        rows = read_training(training_path(tmp_path / "results", run.name, "sudoku"))
        return {name: list(group["reward_mean"]) for name, group in rows.groupby("run")}

    run = comparison("table1", preset="smoke", tasks="sudoku", seeds="0", runs=str(tmp_path / "runs"))
    log("frozen", [0.5, 0.5])
    log("grpo", [0.5, 0.75])
    assert summarize("grpo") == {"frozen": [0.5, 0.5], "grpo": [0.5, 0.75]}
    log("spg", [0.25, 0.5])
    log("grpo", [0.5, 1.0])  # not re-read by the `spg` invocation: its earlier rows stay as they were
    assert summarize("spg") == {"frozen": [0.5, 0.5], "grpo": [0.5, 0.75], "spg": [0.25, 0.5]}
    assert summarize("grpo,spg") == {"frozen": [0.5, 0.5], "grpo": [0.5, 1.0], "spg": [0.25, 0.5]}


# ------------------------------------------------------------------------------------------------ --workers
def _comparable(results: Path, runs: Path) -> dict[str, dict]:
    """Every record of a results folder by file stem, without what depends on when and where it was made (times,
    the runs folder's path, the command line): what must equal between two runs of the same comparison."""
    found = {}
    for record in load_results(results):
        stem = Path(record["_path"]).name.rsplit("-", 1)[0]  # the suffix hashes the checkpoint's path
        text = json.dumps(record).replace(str(runs), "RUNS")
        kept = json.loads(text)
        for drop in ("created", "environment", "samples_file", "_path"):
            kept.pop(drop)
        for drop in ("wall_time_s", "tokens_per_s"):
            kept["metrics"].pop(drop)
        found[stem] = kept
    return found


def test_workers_stop_on_ctrl_c_resume_and_make_the_records_of_one_process(tmp_path):
    """`reproduce --workers 2`, interrupted by Ctrl-C (SIGINT to the whole process group, as a terminal sends it)
    while two stages run, stops every worker and says how to go on; run again, it finishes, reusing what was done.
    Its records are those of `--workers 1` in one process: weights, completions (the samples' hash), metrics."""
    parallel = tmp_path / "parallel"
    common = ["reproduce", "table1", "--preset", "smoke", "--baselines", "grpo", "--limit", "8"]
    argv = [sys.executable, "-m", "stabledrl_bench", *common, "--runs", str(parallel), "--workers", "2"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        # as a terminal's foreground job gets it: a suite started in the background (`pytest &`) passes SIGINT on
        # ignored, and Python then never raises KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if "2 running]" in line:
            break
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 130, "".join(seen) + out + err
    assert "interrupted: re-run the same command to go on" in err
    deadline = time.monotonic() + 30  # the group is empty: no worker (nor multiprocessing's helper) is left
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("processes of the interrupted run are still alive")

    resumed = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "reused" in resumed.stdout and (parallel / "table1-smoke" / "logs").is_dir()

    one = tmp_path / "one"
    assert main([*common, "--runs", str(one), "--workers", "1"]) == 0
    ours, theirs = _comparable(parallel / "results", parallel), _comparable(one / "results", one)
    assert len(ours) == 6 and ours == theirs
