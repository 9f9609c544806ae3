"""A stress experiment from an installed package runs end to end with no edit to this repository: it is listed by
``stress --help``, its options come from its own dataclass and reach its run typed, it writes its record, and the
Stability section of the rebuilt leaderboard shows it (installed through a real entry point, as in
``tests/test_registry.py``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import install_plugin

from stabledrl_bench.cli import main
from stabledrl_bench.experiments.stress import stability_section
from stabledrl_bench.experiments.stress.options import EXPERIMENTS
from stabledrl_bench.experiments.stress.recheck import recheck

ECHO_PLUGIN = """
from dataclasses import dataclass
from pathlib import Path

from stabledrl_bench.errors import positive_int
from stabledrl_bench.experiments.stress.common import write_record
from stabledrl_bench.experiments.stress.options import Experiment, StressOptions, option, recorded_settings


@dataclass(frozen=True)
class EchoOptions:
    word: str = option("hello", "the word to repeat")
    times: int = option(2, "how many times", parse=positive_int)
    scale: float = option(0.5)


def run(stress: StressOptions, options: EchoOptions) -> Path:
    payload = {
        "title": "Echo experiment",
        "settings": recorded_settings("echo", options),
        "seeds": [0],
        "words": [options.word] * options.times,
        "scaled": options.scale * options.times,
    }
    return write_record(stress.results, "echo", payload)


ECHO = Experiment("echo", "a plugin experiment: one module, nothing else edited", EchoOptions, run)
"""


@pytest.fixture
def echo(plugin_dir: Path) -> Path:
    """The ``echo`` experiment installed as a package's entry point; returns the folder it is installed in."""
    module = "sdrl_test_plugin_echo"
    install_plugin(plugin_dir, EXPERIMENTS.group, "echo", f"{module}:ECHO", module, ECHO_PLUGIN)
    return plugin_dir


def test_a_plugin_experiment_is_listed_run_recorded_and_reported(echo: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        main(["stress", "--help"])
    assert done.value.code == 0
    assert re.search(r"^ +echo +a plugin experiment: one module, nothing else edited$", capsys.readouterr().out, re.M)
    results, board = echo / "results", echo / "leaderboard.md"
    assert main(["stress", "echo", "--results", str(results), "--leaderboard", str(board), "--times", "3"]) == 0
    record = json.loads((results / "stability" / "echo.json").read_text())
    assert record["settings"] == {"experiment": "echo", "word": "hello", "times": 3, "scale": 0.5}
    assert record["words"] == ["hello"] * 3 and record["scaled"] == 1.5  # typed values: an int and a float
    # No report code of its own: the generic block, listed among the commands after the built-ins.
    section = stability_section(results)
    assert "### Echo experiment" in section and "stress {lrsweep," in section and ",echo}" in section
    assert section in board.read_text()
    # No rederive: verify says its summary was not recomputed (a note, not a failure).
    assert recheck(results / "stability" / "echo.json") == (
        [],
        ["stress echo has no rederive: its summary was not recomputed"],
    )


def test_a_plugin_experiments_options_are_checked_when_parsed(echo: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["stress", "echo", "--results", str(echo / "results"), "--times", "0"]) == 2
    assert "--times: must be a positive integer, got '0'" in capsys.readouterr().err
    assert not (echo / "results").exists()
