"""Command line: ``python -m stabledrl_bench <command>`` (``--help`` lists them).

Every user-fixable problem (bad config, unknown name, missing path, budget mismatch, unreadable result) is
printed as one ``error: ...`` line with exit status 2. An interrupted command (Ctrl-C) says what re-running it does:
what it resumes and from where, or that it starts again (:func:`~stabledrl_bench.errors.on_interrupt`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

from stabledrl_bench.atomic import storage_failure
from stabledrl_bench.errors import (
    CommandParser,
    UserError,
    comma_list,
    count_int,
    memory_gib,
    positive_int,
    require_folder,
    rerun_notes,
    seed_int,
)


def _add_reproduce(sub) -> None:
    _comparison_options(
        sub.add_parser("reproduce", help="train every baseline under one budget, evaluate, write a leaderboard")
    )
    p = sub.add_parser(
        "platforms",
        help="run a comparison under this machine's kernels and under emulated other CPUs: do its verdicts hold?",
    )
    _comparison_options(p)
    p.add_argument(
        "--platforms",
        help="comma-separated platforms (default: native,avx2,scalar; also blas-sse42); see docs/platforms.md",
    )


def _comparison_options(p) -> None:
    """The options of one comparison (``reproduce`` and ``platforms``)."""
    p.add_argument("table", choices=("table1", "table2"), help="table1 (full attention) or table2 (block diffusion)")
    p.add_argument(
        "--preset",
        default="auto",
        help="auto (default), tiny, smoke, paper, or another of configs/presets/<table>.yaml",
    )
    p.add_argument("--model", help="local weights for the paper preset (LLaDA-8B-Instruct / SDAR-8B)")
    p.add_argument("--baselines", help="comma-separated subset of baselines (default: all of the table)")
    p.add_argument("--tasks", help="comma-separated subset of the preset's tasks")
    p.add_argument("--runs", default="runs", help="training runs folder (default: runs/)")
    # The repository's committed results/ and leaderboard.md are written only when named: a user's run goes to
    # its own folder, maintainers regenerate the committed files with `--results results --leaderboard leaderboard.md`.
    p.add_argument("--results", help="results folder (default: <runs>/results; the committed one: --results results)")
    p.add_argument(
        "--leaderboard",
        help="page written at the end (default: <runs>/leaderboard.md; committed: --leaderboard leaderboard.md)",
    )
    p.add_argument("--seeds", help="comma-separated training seeds, each a full replicate (default: the preset's)")
    p.add_argument("--limit", type=positive_int, help="evaluate only the first N docs per task (quick checks)")
    p.add_argument("--force", action="store_true", help="redo finished runs and evaluations instead of skipping")
    p.add_argument(
        "--pass-k",
        type=positive_int,
        metavar="N",
        help="also decode every test problem N times at --temperature for pass@k and maj@k (own leaderboard block)",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of --pass-k (default 1.0)")
    p.add_argument("--pass-k-lengths", help="comma-separated nominal lengths --pass-k decodes (default: every one)")
    p.add_argument(
        "--eval-every",
        type=positive_int,
        metavar="STEPS",
        help="checkpoint selection: validate every STEPS steps (never on test items) and evaluate each run's best "
        "checkpoint beside its final one, labelled in the leaderboard (default: off)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="run independent stages (methods, seeds, tasks, evaluations) side by side in N processes with the "
        "threads of their model's size each; records are the same as with 1 (default: as many as the cores hold)",
    )
    p.add_argument(
        "--train-starts",
        action="store_true",
        help="train every SFT warm start here instead of copying a committed one (results/starts) with its settings",
    )
    p.add_argument("--starts", metavar="DIR", help="committed warm starts to use (default: the repository's)")
    _add_skip_check(p)
    _add_trust(p)


def _add_skip_check(p) -> None:
    p.add_argument(
        "--skip-model-check",
        action="store_true",
        help="do not probe a loaded checkpoint's conventions before training (see check-model)",
    )


def _add_trust(p) -> None:
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let checkpoints run their own Python code (the published LLaDA/Dream/SDAR files); off by default",
    )


def _add_set(p) -> None:
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override any config field by its path, e.g. --set optim.learning_rate=1e-6 (repeatable)",
    )


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="RL-train one baseline on one task (config file + overrides)")
    p.add_argument("--config", help="YAML/JSON TrainConfig (see configs/)")
    p.add_argument("--baseline", help="the method to train (`list baselines`; default stabledrl)")
    p.add_argument("--task", help="the task to train on (`list tasks`; default countdown)")
    p.add_argument("--model", help="tiny, tiny-block, or a checkpoint folder")
    p.add_argument("--output-dir", help="run folder: log, checkpoints, final model (default runs/train)")
    p.add_argument("--seed", type=seed_int, help="seed of the data order, rollouts and masks (default 0)")
    p.add_argument("--max-steps", type=positive_int, help="override budget.max_steps")
    p.add_argument(
        "--resume",
        action="store_true",
        help="require a checkpoint to continue from (without it, a run with checkpoints resumes, a new one starts)",
    )
    p.add_argument("--stop-after", type=positive_int, help="stop (with a checkpoint) after this many optimizer steps")
    p.add_argument(
        "--log-with",
        metavar="TRACKERS",
        help="also log every step to these comma-separated trackers: tensorboard, wandb (config key log_with)",
    )
    _add_set(p)
    _add_skip_check(p)
    _add_trust(p)


def _add_sft(sub) -> None:
    p = sub.add_parser("sft", help="masked-diffusion SFT warm start")
    p.add_argument("--config", help="YAML/JSON SFTConfig")
    p.add_argument("--task", help="the task whose gold completions are learned (`list tasks`; default countdown)")
    p.add_argument("--model", help="tiny, tiny-block, or a checkpoint folder to start from (default tiny)")
    p.add_argument("--output-dir", help="run folder: log, checkpoints, final model (default runs/sft)")
    p.add_argument("--max-steps", type=positive_int, help="optimizer steps (default 400)")
    p.add_argument("--seed", type=seed_int, help="seed of the data order and masks (default 0)")
    _add_set(p)
    _add_trust(p)


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a checkpoint on a task and write a result record")
    p.add_argument("--model", required=True, help="checkpoint folder (or tiny / tiny-block)")
    p.add_argument("--task", required=True, help="the task whose test set is decoded (`list tasks`)")
    p.add_argument(
        "--protocol",
        default="d1",
        help="a protocol (`list protocols`), or <protocol>-n<N>-t<T>: N sampled decodes per problem at temperature "
        "T, reported as pass@k and maj@k (e.g. d1-n16-t1)",
    )
    p.add_argument("--length", type=positive_int, default=256, help="nominal generation length (128/256/512)")
    p.add_argument("--max-completion-length", type=positive_int, help="tokens actually decoded (default: --length)")
    p.add_argument("--limit", type=positive_int, help="evaluate only the first N problems (quick checks)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="prompts decoded together (default 16)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of sampled decoding (default 0)")
    p.add_argument("--baseline", default="base", help="what trained this checkpoint (base, sft or a baseline)")
    p.add_argument("--run", help="training run folder whose run.json gives the budget (RL checkpoints)")
    p.add_argument("--results", default="results", help="results folder the record goes to (default results/)")
    p.add_argument("--preset", default="custom", help="preset name the record is filed under (default custom)")
    p.add_argument("--comparison", help="group of runs sharing a budget (default: <table>-<preset>)")
    p.add_argument("--table", default="table1", choices=("table1", "table2"), help="the table the record is a row of")
    p.add_argument("--force", action="store_true", help="measure again even if a record of these weights exists")
    _add_trust(p)


def _add_sensitivity(sub) -> None:
    p = sub.add_parser(
        "sensitivity",
        help="score a checkpoint under variants of its protocol and print how much each choice moves the score",
    )
    p.add_argument("--record", help="a result record: its task, protocol, length and seed, its score shown beside")
    p.add_argument("--model", help="checkpoint folder (default: the record's; or tiny / tiny-block)")
    p.add_argument("--task", help="the task whose test set is decoded (default: the record's)")
    p.add_argument("--protocol", help="the base protocol (`list protocols`; default: the record's, else d1)")
    p.add_argument("--length", type=positive_int, help="tokens decoded (default: the record's, else 256)")
    p.add_argument("--temperature", type=float, default=0.7, help="temperature of the sampled variant (0.7)")
    p.add_argument("--limit", type=positive_int, help="score only the first N problems (quick checks)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="prompts decoded together (default 16)")
    p.add_argument("--seed", type=seed_int, help="seed of sampled decoding (default: the record's, else 0)")
    p.add_argument("--out", help="also write the report to OUT.md and OUT.json")
    _add_trust(p)


def _add_check_model(sub) -> None:
    p = sub.add_parser(
        "check-model", help="measure a checkpoint's conventions, and plan a whole table on GPUs (memory, disk, hours)"
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="checkpoint folder (or tiny / tiny-block): its conventions, then the plan")
    what.add_argument("--config", help="a model's config.json (LLaDA, Dream, SDAR): the plan only, without weights")
    what.add_argument("--shape", help="a published model by name, e.g. llada-8b or sdar-8b: the plan only")
    p.add_argument("--family", help="backend family instead of the one read from the config: tiny, llada, dream, sdar")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="load the weights in this dtype")
    p.add_argument("--device", help="e.g. cuda:0 (default: where the weights load, the CPU)")
    p.add_argument("--processes", type=positive_int, default=8, help="GPUs the plan is for (default 8)")
    p.add_argument("--preset", default="paper", help="the reproduce preset the plan is for (default paper)")
    p.add_argument("--table", choices=("table1", "table2"), help="default: table2 for block-diffusion models")
    p.add_argument("--baseline", default="stabledrl", help="the method planned in detail (default stabledrl)")
    p.add_argument(
        "--gpu-memory",
        type=memory_gib,
        metavar="SIZE",
        help="memory of one GPU, e.g. 80GiB or 141GB: say which launch config fits which run of the table",
    )
    p.add_argument(
        "--tflops", type=float, default=400.0, help="sustained TFLOP/s per GPU the time estimate assumes (400)"
    )
    p.add_argument("--json", action="store_true", help="print the measurements as JSON")
    _add_trust(p)


def _add_regress(sub) -> None:
    p = sub.add_parser(
        "regress",
        help="run the golden cases and compare every number with the committed references (docs/regression.md)",
    )
    p.add_argument(
        "--references",
        help="folder of references (default: the ones shipped with the package); a plugin keeps its own",
    )
    p.add_argument("--baselines", help="comma-separated methods: only their rl and forced cases (plugins included)")
    p.add_argument("--groups", help="comma-separated groups: rl, forced, sft, samplers, eval, graders (default: all)")
    p.add_argument(
        "--cases",
        metavar="PATTERNS",
        help="comma-separated case names or shell patterns, within the other selections: e.g. 'rl/grpo@*' or the "
        "failing case of the last run",
    )
    p.add_argument("--update", action="store_true", help="pin what this code produces as the references")
    p.add_argument("--reason", default="", help="with --update: why the numbers may change (recorded)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    p.add_argument("--verbose", action="store_true", help="print every differing value, not the first 12 per case")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument(
        "--invariance",
        nargs="?",
        const="all",
        metavar="NAMES",
        help="run the invariance classes instead (all, or comma-separated names; `--invariance list` lists them)",
    )
    p.add_argument(
        "--measure-tolerance",
        action="store_true",
        help="re-run the cases under emulated platforms and write the measured cross-platform tolerances",
    )


def _add_misc(sub) -> None:
    p = sub.add_parser("leaderboard", help="regenerate leaderboard.md from results/")
    p.add_argument("--results", default="results", help="results folder to read (default results/)")
    p.add_argument("--out", default="leaderboard.md", help="markdown page to write (default leaderboard.md)")
    p.add_argument("--plots", default="results/plots", help="folder for the PNG charts linked from the page")
    p = sub.add_parser(
        "verify", help="re-check every stored result (samples, grader, metrics, weights, commit) and stability summary"
    )
    p.add_argument("--results", default="results", help="results folder to check (default results/)")
    p.add_argument("--no-weights", action="store_true", help="load no checkpoint (no weight hashes, no re-decoding)")
    p.add_argument(
        "--redecode",
        type=count_int,
        metavar="N",
        help="decode N random prompts of each greedy record whose checkpoint is here again and compare "
        "(default 3; 0: consistency checks only)",  # verify.DEFAULT_REDECODE (not imported: a slow import)
    )
    p.add_argument(
        "--redecode-seed", type=seed_int, help="seed of the prompts --redecode draws (default: random, printed)"
    )
    p.add_argument(
        "--rerun",
        metavar="RECORD",
        help="instead: train and evaluate RECORD again from scratch with this code and compare weights and completions",
    )
    p.add_argument("--rerun-runs", metavar="DIR", help="with --rerun: a runs folder to reuse (default: a fresh one)")
    _add_trust(p)
    p = sub.add_parser("starts", help="list the committed SFT warm starts, or commit finished ones (starts save)")
    p.add_argument("action", nargs="?", choices=("list", "save"), default="list", help="list (default) or save")
    p.add_argument("folders", nargs="*", metavar="SFT_FOLDER", help="save: runs/<comparison>/<task>/s<seed>/sft")
    p.add_argument("--to", metavar="DIR", help="committed starts folder (default: the repository's results/starts)")
    p.add_argument("--note", help="save: what else is known of where the start came from (kept in its start.json)")
    p = sub.add_parser("list", help="list the entries of a registry (built-ins and installed plugins)")
    p.add_argument("what", choices=tuple(REGISTRIES), help="which registry")
    p = sub.add_parser("grade", help="grade a JSONL of predictions with the task's graders")
    p.add_argument("--task", required=True, help="whose graders and gold fields (gsm8k, math500, countdown, ...)")
    p.add_argument("--input", required=True, help="JSONL with 'prediction' and the task's gold fields")
    p.add_argument("--output", help="where to write graded JSONL (default: stdout)")
    # listed for --help only: main() hands everything after `stress` to the stress command's own parser
    sub.add_parser("stress", help="stability experiments of the paper on the tiny model (stress --help)")


# What ``--help`` says first (plain text: argparse prints descriptions as they are).
DESCRIPTION = (
    "Reinforcement learning on diffusion language models, every method under one budget: reproduce the paper's "
    "tables, train, evaluate, check a checkpoint, verify and show results."
)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m stabledrl_bench", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_reproduce,
        _add_train,
        _add_sft,
        _add_eval,
        _add_sensitivity,
        _add_check_model,
        _add_regress,
        _add_misc,
    ):
        add(sub)
    return parser


# ``list <what>``: the module holding each registry and the registry's name there (imported on demand).
REGISTRIES = {
    "baselines": ("stabledrl_bench.core.baseline", "BASELINES"),
    "estimators": ("stabledrl_bench.core.estimators", "ESTIMATORS"),
    "advantages": ("stabledrl_bench.core.advantages", "ADVANTAGES"),
    "rollouts": ("stabledrl_bench.core.rollouts", "ROLLOUTS"),
    "tasks": ("stabledrl_bench.tasks", "TASKS"),
    "reward-profiles": ("stabledrl_bench.tasks", "REWARD_PROFILES"),
    "protocols": ("stabledrl_bench.evaluation.protocols", "PROTOCOLS"),
    "model-families": ("stabledrl_bench.core.models.backends", "MODEL_FAMILIES"),
    "stress-experiments": ("stabledrl_bench.experiments.stress.options", "EXPERIMENTS"),
}


def _summary(entry: object) -> str:
    """One line about a registry entry: its ``description`` or ``help`` text, else the first line of its docstring."""
    own = [text for name in ("description", "help") if isinstance(text := getattr(entry, name, ""), str) and text]
    text = own[0] if own else (getattr(entry, "__doc__", "") or "").strip()
    return text.splitlines()[0] if text else ""


def _cmd_list(args) -> int:
    from importlib import import_module

    module, attribute = REGISTRIES[args.what]
    registry = getattr(import_module(module), attribute)
    for name, entry in registry.items():
        # a method's rollout scheme (its default options'), since a method is more than its loss
        scheme = f" [rollout: {entry().rollout().name}]" if args.what == "baselines" else ""
        print(f"{name:26s} {_summary(entry)}{scheme}")
    if args.what == "protocols":  # built on request, so never in the registry
        print(f"{'<protocol>-n<N>-t<T>':26s} any protocol above decoded N times at temperature T: pass@k and maj@k")
    return 0


def _cmd_starts(args) -> int:
    from stabledrl_bench.experiments.starts import STARTS_DIR, committed_starts, read_start, save_start

    root = Path(args.to) if args.to else STARTS_DIR
    if args.action == "save":
        if not args.folders:
            raise UserError("starts save: name the warm starts to commit (runs/<comparison>/<task>/s<seed>/sft)")
        for folder in args.folders:
            print(f"committed: {save_start(Path(folder), root, note=args.note)}")
        return 0
    for spec_hash, folder in committed_starts(root).items():
        record = read_start(folder)
        sft, trained = record["spec"]["sft"], record.get("trained") or {}
        where = _machine(trained) if trained else f"not recorded (saved on {_machine(record.get('saved') or {})})"
        print(
            f"{folder.name:36s} {sft['task']} seed {sft['seed']}, {sft['max_steps']} steps; settings {spec_hash}, "
            f"weights {record.get('weights_sha256', '?')[:12]}; trained on {where}"
        )
        if record.get("note"):
            print(f"{'':36s} {record['note']}")
    return 0


def _machine(environment: dict) -> str:
    """``AMD EPYC (AVX512) at 8e17389``: the CPU, its kernels and the code (provenance.code_label) of an environment."""
    from stabledrl_bench.reporting.provenance import code_label

    hardware = environment.get("hardware") or {}
    return f"{hardware.get('cpu') or '?'} ({hardware.get('capability') or '?'}) at {code_label(environment)}"


def _load_config(cls, args, flags: dict, defaults=None):
    """``--config`` file (if any; else ``defaults(overrides)``, settings chosen from what the command line names),
    then the flags, then ``--set key.path=value`` items on top; every mistake is a one-line UserError naming the
    field."""
    from stabledrl_bench.config import deep_merge, dotted_overrides

    given = {k: v for k, v in flags.items() if v is not None}
    overrides = deep_merge(given, dotted_overrides(args.set or []))
    if args.config:
        return cls.from_file(args.config, **overrides)
    base = defaults(overrides) if defaults is not None else {}
    return cls.from_mapping(deep_merge(base, overrides), where="command line")


def _train_defaults(overrides: dict) -> dict:
    """What ``train`` without ``--config`` starts from: a built-in tiny model trains under its tiny preset's settings
    (the StableDRL recipe's budget would take hours per step on a CPU), any other model under TrainConfig's
    defaults, whose budget is the StableDRL recipe's."""
    from stabledrl_bench.config import to_dict
    from stabledrl_bench.experiments.presets import tiny_model_settings
    from stabledrl_bench.training.config import TrainConfig

    found = tiny_model_settings(overrides.get("model", TrainConfig.model), overrides.get("task", TrainConfig.task))
    return {} if found is None else to_dict(found)


def _say_train_defaults(cfg) -> None:
    """One line on where a config-less ``train`` took its settings from, and the budget it runs."""
    from stabledrl_bench.experiments.presets import TINY_MODEL_PRESETS

    table = TINY_MODEL_PRESETS.get(cfg.model)
    settings = f"the tiny preset of configs/presets/{table}.yaml" if table else "the StableDRL recipe's budget"
    b = cfg.budget
    print(
        f"train: no --config, so {cfg.model} trains under {settings}: {b.max_steps} steps of {b.prompts_per_step} "
        f"prompts x {b.num_generations} completions on a {b.max_completion_length}-token canvas (--set key=value or "
        "a --config file changes any setting)"
    )


def _cmd_train(args) -> int:
    from stabledrl_bench.training.config import TRACKERS, TrainConfig
    from stabledrl_bench.training.trainer import RLTrainer

    fields = ("baseline", "task", "model", "output_dir", "seed")
    flags = {name: getattr(args, name) for name in fields}
    if args.log_with:
        flags["log_with"] = comma_list(args.log_with, "--log-with", choices=TRACKERS, what="tracker")
    cfg = _load_config(TrainConfig, args, flags, defaults=_train_defaults)
    if args.skip_model_check:
        cfg.check_model = False
    if args.max_steps is not None:
        cfg.budget = dataclasses.replace(cfg.budget, max_steps=args.max_steps)
    if not args.config and os.environ.get("RANK", "0") == "0":
        _say_train_defaults(cfg)
    final = RLTrainer(cfg).train(resume=True if args.resume else None, stop_after=args.stop_after)
    if os.environ.get("RANK", "0") == "0":
        print(f"final model: {final}")
    return 0


def _cmd_sft(args) -> int:
    from stabledrl_bench.training.sft import SFTConfig, run_sft

    fields = ("task", "model", "output_dir", "max_steps", "seed")
    cfg = _load_config(SFTConfig, args, {name: getattr(args, name) for name in fields})
    print(f"final model: {run_sft(cfg)}")
    return 0


def _cmd_eval(args) -> int:
    from stabledrl_bench.core.baseline import BASELINES
    from stabledrl_bench.core.models.backends import load_model_spec
    from stabledrl_bench.evaluation.native import evaluate_and_record, model_record
    from stabledrl_bench.evaluation.protocols import get_protocol
    from stabledrl_bench.reporting.naming import ResultKey
    from stabledrl_bench.reporting.schema import TABLE1_LENGTHS
    from stabledrl_bench.tasks import get_task

    # Everything cheap is checked before the model loads (any registered task is a column of either table).
    get_task(args.task)
    protocol = get_protocol(args.protocol)
    require_folder(args.results, "--results")
    if args.table == "table1" and args.length not in TABLE1_LENGTHS:
        raise UserError(
            f"--length {args.length}: table1 reports lengths {TABLE1_LENGTHS}; give the nominal length and the "
            "tokens really decoded with --max-completion-length"
        )
    if args.baseline not in ("base", "sft"):
        BASELINES.get(args.baseline)
        if not args.run:
            raise UserError(
                f"--baseline {args.baseline}: RL checkpoints need --run <training run folder> for the budget"
            )
    budget, advantage = _run_training(Path(args.run)) if args.run else (None, None)
    dlm = load_model_spec(args.model, seed=args.seed)
    canvas = args.max_completion_length or args.length
    positions = dlm.max_positions
    if positions is not None and canvas >= positions:  # before any decoding, not deep inside it
        raise UserError(f"--max-completion-length {canvas} does not fit the model's {positions} positions")
    key = ResultKey(
        comparison=args.comparison or f"{args.table}-{args.preset}",
        table=args.table,
        preset=args.preset,
        baseline=args.baseline,
        task=args.task,
        length=args.length,
        sampling=None if args.table == "table1" else protocol.sampling,
        protocol=args.protocol,
        seed=args.seed,
        model=model_record(dlm, str(args.model)),
    )
    recorded = evaluate_and_record(
        dlm,
        results_dir=args.results,
        key=key.to_dict(),
        max_completion_length=args.max_completion_length or args.length,
        budget=budget,
        advantage=advantage,
        limit=args.limit,
        batch_size=args.batch_size,
        skip_existing=not args.force,
    )
    record = json.loads(recorded.path.read_text())
    how = f"reused ({recorded.note})" if recorded.reused else "measured"
    metrics = record["metrics"]
    sampled = "".join(f", {name} {100 * value:.1f}%" for name, value in metrics.items() if "@" in name)
    print(f"{args.task}@{args.length}: accuracy {100 * metrics['accuracy']:.1f}%{sampled} {how} -> {recorded.path}")
    return 0


def _cmd_sensitivity(args) -> int:
    from stabledrl_bench.atomic import atomic_write_text
    from stabledrl_bench.core.models.backends import load_model_spec
    from stabledrl_bench.evaluation.native import weights_sha256
    from stabledrl_bench.evaluation.protocols import get_protocol
    from stabledrl_bench.evaluation.sensitivity import format_report, report_record, run_sensitivity
    from stabledrl_bench.reporting.results import read_result
    from stabledrl_bench.tasks import get_task

    record = read_result(Path(args.record)) if args.record else {}
    model = args.model or record.get("model", {}).get("checkpoint")
    task = args.task or record.get("task")
    if not model or not task:
        raise UserError("sensitivity needs --model and --task, or a --record that names them")
    get_task(task)
    protocol = get_protocol(args.protocol or record.get("protocol") or "d1")
    canvas = args.length or record.get("max_completion_length") or 256
    seed = record.get("seed", 0) if args.seed is None else args.seed
    if args.out:
        require_folder(Path(args.out).parent, "--out")
    dlm = load_model_spec(model, seed=seed)
    if record and weights_sha256(dlm.model) != record["model"]["weights_sha256"]:
        raise UserError(f"{model} does not hold the weights record {args.record} measured (their sha256 differ)")
    scores, refused = run_sensitivity(
        dlm, task, protocol, canvas=canvas, temperature=args.temperature, limit=args.limit,
        batch_size=args.batch_size, seed=seed,
    )  # fmt: skip
    what = f"{model} on {task} ({canvas} tokens{f', first {args.limit} problems' if args.limit else ''})"
    report = format_report(scores, refused, what=what)
    if record:
        field = "d1_accuracy" if get_task(task).headline_field == "score" else "accuracy"
        metrics = record["metrics"]
        report += f"\nThe record's own score: {100 * metrics[field]:.1f} over its {metrics['n']} decodes.\n"
    print(report, end="")
    if args.out:
        about = {"model": str(model), "task": task, "protocol": protocol.name, "canvas": canvas, "seed": seed}
        atomic_write_text(Path(f"{args.out}.md"), report)
        atomic_write_text(Path(f"{args.out}.json"), json.dumps(report_record(scores, **about), indent=1) + "\n")
        print(f"report: {args.out}.md, {args.out}.json")
    return 0


def _cmd_check_model(args) -> int:
    import torch

    from stabledrl_bench.core.baseline import BASELINES
    from stabledrl_bench.core.models.backends import load_model_spec
    from stabledrl_bench.core.models.probes import model_facts, run_probes
    from stabledrl_bench.experiments.plan import Shape, format_plan, format_table_plan, plan, table_plan
    from stabledrl_bench.experiments.presets import presets

    if not (args.tflops > 0 and math.isfinite(args.tflops)):
        raise UserError(f"--tflops must be a positive number, got {args.tflops}")
    BASELINES.get(args.baseline)  # an unknown name fails before the model loads
    facts: dict = {}
    probes: list = []
    if args.model is None:  # a shape without weights: the plan only
        shape = Shape.from_config(args.config) if args.config else Shape.named(args.shape)
        facts = {"parameters": f"{shape.parameters:,}", "layers": shape.layers, "hidden": shape.hidden}
        facts |= {"vocabulary": shape.vocab, "attention": shape.attention}
    else:
        dtype = getattr(torch, args.dtype) if args.dtype else None
        if args.device and str(args.device).startswith("cuda") and not torch.cuda.is_available():
            raise UserError(f"--device {args.device}: this machine has no CUDA device")
        dlm = load_model_spec(args.model, family=args.family, dtype=dtype, device=args.device)
        facts, probes = model_facts(dlm), run_probes(dlm, checkpointing=True)
        blocks_found = next(p.passed for p in probes if p.name == "decoder blocks")
        shape = Shape.of(dlm) if blocks_found else None
    attention = shape.attention if shape is not None else "full"
    table = args.table or ("table2" if attention == "block" else "table1")
    available = presets(table)
    if args.preset not in available:
        raise UserError(f"--preset {args.preset!r}: {table} has {', '.join(available)}")
    report = whole = None
    if shape is not None:
        preset, gpus = available[args.preset], {"processes": args.processes, "tflops": args.tflops}
        report = plan(shape, preset, baseline=args.baseline, **gpus)
        whole = table_plan(shape, preset, gpu_memory=args.gpu_memory, **gpus)
    source = args.model or args.config or args.shape
    if args.json:
        found = {"model": source, "facts": facts, "probes": [p.to_dict() for p in probes], "plan": report}
        print(json.dumps(found | {"table": whole}, indent=2))
    else:
        print(f"check-model {source}" + ("" if args.model else " (no weights: the plan only)"))
        for key, value in facts.items():
            print(f"  {key:20s} {value}")
        for probe in probes:
            print(f"  [{probe.status:4s}] {probe.name:30s} {probe.measured}")
            if probe.meaning:
                print(f"  {'':6s} {'':30s} -> {probe.meaning}")
        if report is not None:
            print(f"  {table} preset {args.preset!r} on {args.processes} GPU(s):")
            print("\n".join("  " + line for line in [*format_plan(report), *format_table_plan(whole)]))
    failed = [p.name for p in probes if not p.passed]
    if failed:
        raise UserError(f"check-model: {len(failed)} convention(s) failed: {', '.join(failed)}")
    return 0


def _run_training(run: Path) -> tuple[dict, dict | None]:
    """The budget recorded in a training run folder's ``run.json``, checked like a recipe's, and its advantage rule
    (None in run folders written before it was recorded): both go into the records of its checkpoint."""
    from stabledrl_bench.config import from_dict, parse_json
    from stabledrl_bench.core.budget import Budget

    run_json = run / "run.json"
    if not run_json.is_file():
        raise UserError(f"--run {run}: no run.json (not a training run folder)")
    try:
        info = parse_json(run_json.read_text(encoding="utf-8"), f"--run {run}: run.json")
    except UnicodeDecodeError as exc:
        raise UserError(f"--run {run}: run.json is not UTF-8 text ({exc.reason})") from exc
    if not isinstance(info, dict) or not isinstance(info.get("budget"), dict):
        raise UserError(f"--run {run}: run.json records no budget (not written by this harness's trainer?)")
    advantage = info.get("advantage")
    if advantage is not None and not (isinstance(advantage, dict) and isinstance(advantage.get("rule"), str)):
        raise UserError(f"--run {run}: run.json records no readable advantage rule ({advantage!r})")
    return from_dict(Budget, info["budget"], where=f"--run {run}: run.json budget").to_dict(), advantage


def _cmd_leaderboard(args) -> int:
    from stabledrl_bench.experiments.stress import stability_section
    from stabledrl_bench.reporting.leaderboard import write_leaderboard

    if Path(args.out).is_dir():
        raise UserError(f"--out {args.out} is a directory; give the markdown file to write")
    if Path(args.results).exists() and not Path(args.results).is_dir():
        raise UserError(f"--results {args.results} is a file; give the results folder")

    path = write_leaderboard(args.results, args.out, plots_dir=args.plots, extra_sections=[stability_section])
    print(f"wrote {path}")
    return 0


def _cmd_verify(args) -> int:
    if args.rerun:
        from stabledrl_bench.experiments.rerun import rerun

        return rerun(Path(args.rerun), Path(args.rerun_runs) if args.rerun_runs else None)
    from stabledrl_bench.experiments.verify import verify_results

    redecode = 0 if args.no_weights else args.redecode  # None: verify's default
    summary = verify_results(
        args.results,
        weights=not args.no_weights,
        redecode_seed=args.redecode_seed,
        **({} if redecode is None else {"redecode": redecode}),
    )
    counted = f"{summary['records']} result records and {summary['stability']} stability records"
    unproven = _consistency_only(summary["consistency_only"])
    if summary["failed"]:
        raise UserError(f"verify: {summary['failed']} of {counted} do not add up (above){unproven}")
    print(f"verify: all {counted} add up{unproven}")
    return 0


def _consistency_only(records: list, shown: int = 10) -> str:
    """The summary's clause naming the records checked for consistency only (not re-decoded), grouped by why."""
    if not records:
        return ""
    by_reason: dict[str, list[str]] = {}
    for path, reason in records:
        by_reason.setdefault(reason, []).append(str(path))
    groups = []
    for reason, paths in by_reason.items():
        more = f" (+{len(paths) - shown} more)" if len(paths) > shown else ""
        groups.append(f"{len(paths)} {reason}: {', '.join(paths[:shown])}{more}")
    return f"; checked for consistency only (not re-decoded): {'; '.join(groups)}"


def _cmd_grade(args) -> int:
    from stabledrl_bench.tasks.grade_file import main as grade_main

    argv = ["--task", args.task, "--input", args.input] + (["--output", args.output] if args.output else [])
    return grade_main(argv)


def _cmd_regress(args) -> int:
    from stabledrl_bench.regression.command import command

    return command(args)


def _cmd_reproduce(args) -> int:
    from stabledrl_bench.experiments.reproduce import reproduce

    reproduce(_comparison(args))
    return 0


def _cmd_platforms(args) -> int:
    from stabledrl_bench.experiments.platforms import DEFAULT_PLATFORMS, PLATFORMS, run_study

    run = _comparison(args)
    names = comma_list(args.platforms, "--platforms", choices=PLATFORMS, what="platform") if args.platforms else None
    run_study(run, _reproduce_argv(args), names or list(DEFAULT_PLATFORMS))
    return 0


# reproduce's options that a platform study hands on to each platform's `reproduce` (its folders it sets itself)
HANDED_ON = ("preset", "model", "baselines", "tasks", "seeds", "limit", "pass_k", "temperature", "pass_k_lengths")
HANDED_ON += ("eval_every", "workers")
HANDED_ON_FLAGS = ("force", "skip_model_check", "trust_remote_code")


def _reproduce_argv(args) -> list[str]:
    argv = [args.table]
    for name in HANDED_ON:
        if getattr(args, name) is not None:
            argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return argv + [f"--{name.replace('_', '-')}" for name in HANDED_ON_FLAGS if getattr(args, name)]


def _comparison(args):
    from stabledrl_bench.experiments.comparison import comparison

    require_folder(args.runs, "--runs")
    run = comparison(
        args.table,
        preset=args.preset,
        model=args.model,
        baselines=args.baselines,
        tasks=args.tasks,
        seeds=args.seeds,
        runs=args.runs,
        results=args.results,
        leaderboard=args.leaderboard,
        limit=args.limit,
        force=args.force,
        check_model=not args.skip_model_check,
        pass_k=args.pass_k,
        temperature=args.temperature,
        pass_k_lengths=args.pass_k_lengths,
        eval_every=args.eval_every,
        workers=args.workers,
        starts=args.starts,
        train_starts=args.train_starts,
    )
    require_folder(run.results, "--results")
    return run


COMMANDS = {
    "list": _cmd_list,
    "train": _cmd_train,
    "sft": _cmd_sft,
    "eval": _cmd_eval,
    "sensitivity": _cmd_sensitivity,
    "check-model": _cmd_check_model,
    "verify": _cmd_verify,
    "leaderboard": _cmd_leaderboard,
    "grade": _cmd_grade,
    "reproduce": _cmd_reproduce,
    "platforms": _cmd_platforms,
    "regress": _cmd_regress,
    "starts": _cmd_starts,
}


def _close_progress_bars() -> None:
    """Finish any open tqdm bar, so that an error line starts on a line of its own."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


@contextlib.contextmanager
def _quiet_unless_main():
    """Under ``accelerate launch`` only the main process prints (the others run the same lines); errors still show."""
    from stabledrl_bench.processes import is_main_process, launched

    if not launched() or is_main_process():
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["stress"]:
            from stabledrl_bench.experiments.stress import main as stress_main

            return stress_main(argv[1:])
        args = build_parser().parse_args(argv)
        if getattr(args, "trust_remote_code", False):
            from stabledrl_bench.core.models.backends import REMOTE_CODE_ENV

            os.environ[REMOTE_CODE_ENV] = "1"  # this process and the ones it starts (accelerate, workers)
        with _quiet_unless_main():
            return COMMANDS[args.command](args)
    except UserError as exc:
        _close_progress_bars()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        reason = storage_failure(exc)  # whichever library raised it (atomic.storage_failure)
        if reason is None:
            raise  # a bug, not the machine: keep the traceback
        _close_progress_bars()
        where = getattr(exc, "filename", None) or f"a write ({type(exc).__name__})"
        print(f"error: {where}: {reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        _close_progress_bars()
        notes = rerun_notes(exc) or ["nothing was left half-written; re-running the command starts it again"]
        print(f"interrupted: {'; '.join(notes)}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
