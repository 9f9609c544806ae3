"""What a new user meets first: Ctrl-C and re-running, `train` without a config, the results a `reproduce` writes,
help text on every option, and a command line that answers `--help` without loading the model stack."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import small_budget

from stabledrl_bench.cli import build_parser, main
from stabledrl_bench.experiments.presets import presets
from stabledrl_bench.training import trainer as trainer_module
from stabledrl_bench.training.runlog import read_log


# ------------------------------------------------------------------------------------------------- Ctrl-C
def _config(tmp_path: Path, checkpoint: Path, steps: int) -> Path:
    """A config of the smallest real run: 2 x 4 completions on a 16-token canvas, mu 2, ``steps`` optimizer steps."""
    budget = small_budget(max_steps=steps).to_dict()
    config = {"baseline": "grpo", "task": "sudoku", "model": str(checkpoint), "protocol": "tiny", "budget": budget}
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(config | {"progress": False}))
    return path


def _interrupt_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Ctrl-C while the optimizer step after ``step`` runs (as a SIGINT raises KeyboardInterrupt there)."""
    original = trainer_module.RLTrainer.optimizer_step

    def optimizer_step(self, micro_batches, iteration):
        if self.step == step:
            raise KeyboardInterrupt
        return original(self, micro_batches, iteration)

    monkeypatch.setattr(trainer_module.RLTrainer, "optimizer_step", optimizer_step)


def test_ctrl_c_says_what_a_rerun_resumes_and_the_rerun_says_from_where(small_checkpoint, tmp_path, capsys) -> None:
    """A run checkpoints by default; Ctrl-C names the step a re-run resumes from (or that it starts again), the
    re-run says where it resumes, and the log of an attempt that saved nothing is kept, not overwritten."""
    out = tmp_path / "run"
    argv = ["train", "--config", str(_config(tmp_path, small_checkpoint, 6)), "--output-dir", str(out)]
    with pytest.MonkeyPatch.context() as patch:  # before the first checkpoint (every 2 steps: a tenth, in phases)
        _interrupt_at(patch, 1)
        assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"interrupted: grpo on sudoku ({out}) saved no checkpoint yet (one every 2 steps)")
    assert err[-1].endswith("so re-running the same command starts it again from step 0")
    with pytest.MonkeyPatch.context() as patch:  # after the checkpoint of step 4
        _interrupt_at(patch, 4)
        assert main(argv) == 130
    captured = capsys.readouterr()
    assert f"held the log of an earlier run that saved nothing to resume; kept as {out / 'log.1.jsonl'}" in captured.out
    assert [r["step"] for r in read_log(out / "log.1.jsonl")] == [1]
    assert captured.err.strip().splitlines()[-1] == (
        f"interrupted: re-running the same command resumes grpo on sudoku ({out}) from step 4 of 6 (its last "
        f"checkpoint, {out / 'checkpoints' / 'step_000004'})"
    )
    assert main(argv) == 0
    resumed = f"grpo on sudoku: resuming from step 4 of 6 ({out / 'checkpoints' / 'step_000004'})"
    assert resumed in capsys.readouterr().out
    assert [r["step"] for r in read_log(out / "log.jsonl")] == [1, 2, 3, 4, 5, 6]
    info = json.loads((out / "run.json").read_text())
    assert info["advantage"] == {"rule": "group_mean", "options": {}}  # what the method compares (item e)


def test_a_command_without_saved_work_says_it_starts_again(monkeypatch, capsys) -> None:
    import stabledrl_bench.cli as cli

    def interrupted(args) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "leaderboard", interrupted)
    assert main(["leaderboard"]) == 130
    assert capsys.readouterr().err == (
        "interrupted: nothing was left half-written; re-running the command starts it again\n"
    )


# --------------------------------------------------------------------------------------- train without --config
class _Recorder:
    """Stands in for the trainer: keeps the config `train` built, trains nothing."""

    configs: ClassVar[list] = []

    def __init__(self, cfg) -> None:
        self.configs.append(cfg)

    def train(self, **kwargs) -> Path:
        return Path("final")


@pytest.mark.parametrize(("model", "table"), [("tiny", "table1"), ("tiny-block", "table2")])
def test_train_without_a_config_takes_a_tiny_models_budget_from_its_preset(model, table, monkeypatch, capsys) -> None:
    monkeypatch.setattr(trainer_module, "RLTrainer", _Recorder)
    _Recorder.configs = []
    assert main(["train", "--model", model, "--task", "sudoku", "--set", "budget.max_steps=4"]) == 0
    cfg, preset = _Recorder.configs[0], presets(table)["tiny"]
    assert cfg.budget.to_dict() == {**preset.budget.to_dict(), "max_steps": 4}  # --set still applies on top
    assert (cfg.protocol, cfg.train_split, cfg.optim.learning_rate) == ("tiny", "generated", 2e-5)
    said = f"so {model} trains under the tiny preset of configs/presets/{table}.yaml: 4 steps of 6 prompts x 8"
    assert said in capsys.readouterr().out


def test_train_of_a_checkpoint_without_a_config_says_whose_budget_it_takes(small_checkpoint, monkeypatch, capsys):
    monkeypatch.setattr(trainer_module, "RLTrainer", _Recorder)
    _Recorder.configs = []
    assert main(["train", "--model", str(small_checkpoint), "--log-with", "tensorboard"]) == 0
    assert _Recorder.configs[0].budget.max_steps == 2000 and _Recorder.configs[0].log_with == ["tensorboard"]
    assert "trains under the StableDRL recipe's budget: 2000 steps of 32 prompts x 16" in capsys.readouterr().out


def test_trackers_are_a_flag_and_a_string_for_a_list_gets_a_hint(capsys) -> None:
    assert main(["train", "--log-with", "tensorboard,nope"]) == 2
    assert "--log-with: unknown tracker(s) nope; choose from tensorboard, wandb" in capsys.readouterr().err
    assert main(["train", "--set", "log_with=tensorboard"]) == 2
    assert "log_with: expected a list, got str (a list is written [tensorboard])" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ reproduce's results
def test_reproduce_writes_under_its_runs_folder_unless_told(monkeypatch, tmp_path) -> None:
    """The committed results/ and leaderboard.md are what this command wrote for the maintainers: a user's run goes
    to its own folder, and only naming them rewrites them."""
    import stabledrl_bench.experiments.reproduce as reproduce_module

    seen = []
    monkeypatch.setattr(reproduce_module, "reproduce", seen.append)
    runs = tmp_path / "mine"
    assert main(["reproduce", "table1", "--preset", "smoke", "--runs", str(runs)]) == 0
    assert (seen[0].results, seen[0].leaderboard) == (runs / "results", runs / "leaderboard.md")
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "table1", "--preset", "smoke", "--results", "results", "--leaderboard", "lb.md"]) == 0
    assert (seen[1].results, seen[1].leaderboard) == (Path("results"), Path("lb.md"))


# ---------------------------------------------------------------------------------------------------- --help
def _parsers(parser: argparse.ArgumentParser, name: str = ""):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}".strip())


def test_every_option_of_every_command_says_what_it_does() -> None:
    from stabledrl_bench.experiments.stress.cli import build_parser as stress_parser

    commands = [*_parsers(build_parser()), *((f"stress {n}".strip(), p) for n, p in _parsers(stress_parser()))]
    silent = [
        f"{name}: {'/'.join(action.option_strings) or action.dest}"
        for name, parser in commands
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction) and not action.help
    ]
    assert not silent
    assert not [name for name, parser in commands if "``" in (parser.description or "")]  # plain text, not RST


def test_stress_help_names_every_experiment(capsys) -> None:
    from stabledrl_bench.experiments.stress.options import EXPERIMENTS

    with pytest.raises(SystemExit):
        main(["stress", "--help"])
    text = capsys.readouterr().out
    lists = [set(found.split(",")) for found in re.findall(r"\{([\w,-]+)\}", text)]
    assert lists and all(names == {*EXPERIMENTS.entries(), "rederive", "all"} for names in lists)


def test_listing_and_stress_help_load_neither_transformers_nor_pandas() -> None:
    """What makes `list baselines` and `stress --help` take seconds: importing the model stack (transformers) and
    pandas. One process checks both (a subprocess: this one has imported everything already)."""
    code = (
        "import sys, contextlib, io\n"
        "from stabledrl_bench.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['list', 'baselines']) == 0\n"
        "    listed = sorted(m for m in ('transformers', 'pandas') if m in sys.modules)\n"
        "    from stabledrl_bench.experiments.stress.cli import build_parser\n"
        "    build_parser()\n"
        "print(listed, 'transformers' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[] False"
