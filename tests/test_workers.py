"""The worker pool and the stage scheduler: the same results as one process, inputs before the stages that need
them, one thread each, errors named, and Ctrl-C stopping every job through its own interrupt path."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import worker_jobs

from stabledrl_bench.errors import UserError, rerun_notes
from stabledrl_bench.experiments.workers import Progress, Stage, critical_path, run_graph


class Recorder(Progress):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, int]] = []

    def begin(self, key: str, running: int) -> None:
        self.events.append(("begin", key, running))

    def end(self, key: str, result) -> None:
        self.events.append(("end", key, result))


def _diamond(tmp_path: Path) -> list[Stage]:
    """a -> (b, c) -> d, listed with d first: the scheduler waits for the inputs, not for the listing."""
    return [
        Stage("d", worker_jobs.add, (1000,), after=("b", "c"), log=tmp_path / "d.log"),
        Stage("a", worker_jobs.add, (1,), log=tmp_path / "a.log"),
        Stage("b", worker_jobs.add, (10,), after=("a",), log=tmp_path / "b.log"),
        Stage("c", worker_jobs.add, (100,), after=("a",), log=tmp_path / "c.log"),
    ]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_graph_gives_the_same_results_on_one_or_several_workers(tmp_path: Path, workers: int, capsys) -> None:
    progress = Recorder()
    results = run_graph(_diamond(tmp_path), workers, threads=1, progress=progress)
    assert results == {"a": 1, "b": 11, "c": 101, "d": 1112}
    began = [key for kind, key, _ in progress.events if kind == "begin"]
    ended = [key for kind, key, _ in progress.events if kind == "end"]
    assert began.index("d") > max(ended.index("b"), ended.index("c")) and began[0] == "a"
    out = capsys.readouterr().out
    if workers == 1:  # here, printing to the terminal
        assert "adding 1000 to [11, 101]" in out and not (tmp_path / "d.log").exists()
    else:  # in a worker, printing to the stage's log
        assert "adding" not in out and (tmp_path / "d.log").read_text() == "adding 1000 to [11, 101]\n"
        assert max(running for kind, _, running in progress.events if kind == "begin") == 2
    assert not multiprocessing.active_children()


def test_a_worker_runs_at_the_thread_count_it_was_given() -> None:
    stages = [Stage(str(i), worker_jobs.threads) for i in range(2)]
    assert set(run_graph(stages, 2, threads=1).values()) == {1}


def test_bad_graphs_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown: \\['x'\\]"):
        run_graph([Stage("a", worker_jobs.add, (1,), after=("x",))], 1, threads=1)
    with pytest.raises(ValueError, match="wait for each other"):
        run_graph(
            [Stage("a", worker_jobs.add, (1,), after=("b",)), Stage("b", worker_jobs.add, (1,), after=("a",))], 1, 1
        )


def test_a_failing_job_is_named_and_stops_the_run(tmp_path: Path) -> None:
    slow = Stage("slow", worker_jobs.wait_for_stop, (str(tmp_path),))
    with pytest.raises(UserError, match=r"^bad input$"):  # a user's error stays one clear line
        run_graph([slow, Stage("refuse", worker_jobs.refuse, ("bad input", str(tmp_path)))], 2, threads=1)
    assert list(tmp_path.glob("cleaned-*"))  # the other job was stopped through its interrupt path
    with pytest.raises(RuntimeError, match=r"crash failed \(its output: .*crash.log\): a bug in a job"):
        run_graph([Stage("crash", worker_jobs.crash, log=tmp_path / "crash.log"), slow], 2, threads=1)
    with pytest.raises(RuntimeError, match="the worker running die died"):
        run_graph([Stage("die", worker_jobs.die), Stage("other", worker_jobs.add, (1,))], 2, threads=1)
    assert not multiprocessing.active_children()


def test_ctrl_c_stops_every_job_through_its_interrupt_path(tmp_path: Path) -> None:
    """Ctrl-C reaches the scheduler (the workers ignore the terminal's SIGINT): each running job is interrupted
    inside (its cleanup runs, its note on resuming comes back), and no worker is left."""
    stages = [Stage(f"wait{i}", worker_jobs.wait_for_stop, (str(tmp_path),)) for i in range(2)]

    def ctrl_c() -> None:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    # a suite started in the background (`pytest &`) inherits SIGINT ignored: Python's own handler, as in a terminal
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            run_graph(stages, 2, threads=1)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert rerun_notes(caught.value) == ["the waiting job resumes"]
    assert len(list(tmp_path.glob("cleaned-*"))) == 2
    assert not multiprocessing.active_children()


PARENT = """
import sys, time
sys.path.insert(0, sys.argv[2])
import worker_jobs
from stabledrl_bench.experiments.workers import WorkerPool
pool = WorkerPool(1, 1)
pool.submit("wait", worker_jobs.wait_for_stop, (sys.argv[1],), __import__("pathlib").Path("/dev/null"))
print(pool._processes[0].pid, flush=True)
time.sleep(600)
"""


def test_a_parent_killed_without_ctrl_c_takes_its_workers_with_it(tmp_path: Path) -> None:
    """A parent killed outright (SIGKILL: no chance to stop its jobs) leaves no worker running: the job is
    interrupted through its own path (its cleanup runs) and the worker ends."""
    import subprocess
    import sys

    tests = str(Path(__file__).parent)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path), tests], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("started-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob("started-*")), "the job never started"
    parent.kill()
    parent.wait()
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(worker, signal.SIGKILL)
        raise AssertionError("the worker outlived its parent")
    assert list(tmp_path.glob("cleaned-*")), "the job was not interrupted through its own path"


def test_stages_that_others_wait_for_start_first(tmp_path: Path) -> None:
    """Three independent stages listed first, then a stage three others need: on two workers the needed one starts
    at once (a later seed's warm start is not left until every earlier evaluation has run)."""
    stages = [Stage(f"leaf{i}", worker_jobs.add, (i,)) for i in range(3)]
    stages += [Stage("start", worker_jobs.add, (10,))]
    stages += [Stage(f"after{i}", worker_jobs.add, (i,), after=("start",)) for i in range(3)]
    progress = Recorder()
    run_graph(stages, 2, threads=1, progress=progress)
    began = [key for kind, key, _ in progress.events if kind == "begin"]
    assert began[0] == "start" and began[1] == "leaf0"


def test_the_critical_path_is_a_stages_work_plus_the_longest_chain_that_needs_it() -> None:
    after = {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c"), "e": ()}
    work = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 3.0, "e": 4.0}
    # by hand: d = 3; b = 5 + 3; c = 2 + 3; a = 1 + max(8, 5); e = 4 (nothing needs it)
    assert critical_path(after, work) == {"a": 9.0, "b": 8.0, "c": 5.0, "d": 3.0, "e": 4.0}


def test_long_stages_start_before_short_ones_listed_before_them() -> None:
    """A short evaluation listed first, then a long stage nothing waits for (a frozen control) and a training an
    evaluation waits for: on two workers the two long chains start first, the short stage last, so no long stage is
    left to run alone at the end."""
    stages = [
        Stage("eval-start", worker_jobs.add, (1,), work=1.0),
        Stage("control", worker_jobs.add, (2,), work=3.0),
        Stage("train", worker_jobs.add, (3,), work=2.0),
        Stage("eval-train", worker_jobs.add, (4,), after=("train",), work=1.0),
    ]
    progress = Recorder()
    run_graph(stages, 2, threads=1, progress=progress)
    began = [key for kind, key, _ in progress.events if kind == "begin"]
    assert began[:2] == ["control", "train"] and began[2] == "eval-start"
