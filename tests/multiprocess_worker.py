"""Run the multi-process scenarios under ``accelerate launch`` and write what they measured (rank 0) as JSON.

    accelerate launch --config_file configs/accelerate/<x>.yaml --num_processes 2 --mixed_precision no \\
        tests/multiprocess_worker.py MODELS_JSON OUT_DIR [SCENARIO ...]

``tests/test_multiprocess.py`` launches it for every shipped config and compares the report with the same
scenarios run on one process. ``resume:<scenario>`` stops a scenario after one rollout phase and resumes it
(``resume``: ``resume:grpo-native``); ``unshared:<scenario>`` trains it into a relative folder, which on a
multi-node launch is each node's own, and records the refusal. Under ``--mixed_precision bf16`` the scenarios
train in bf16 mixed precision, as the launch says. Besides the training logs it records, per process, what must
agree everywhere: the pad-free decision (probed on weights synced from rank 0 under RAM-efficient loading) and a
digest of the weights the rollouts ran on.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from multiprocess_scenarios import EVALUATIONS, SCENARIOS, patch_task, run_evaluation, run_training


def main(models_json: str, out_dir: str, names: list[str]) -> None:
    import torch
    from accelerate.utils import gather_object

    from stabledrl_bench.errors import UserError
    from stabledrl_bench.processes import process_state

    torch.set_num_threads(1)
    patch_task(setattr)
    models = json.loads(Path(models_json).read_text())
    out = Path(out_dir)
    state = process_state()
    report: dict[str, object] = {"world_size": state.num_processes}
    # DeepSpeed's shared-memory CPU collective, which it compiles when its process group starts unless told not to
    report["deepspeed_cpu_kernel"] = hasattr(torch.ops.deepspeed, "inference_all_reduce_")
    report["rank0_weights"] = gather_object([_loads_real_weights(models["native"])])
    bf16 = os.environ.get("ACCELERATE_MIXED_PRECISION") == "bf16"  # what --mixed_precision says
    probe = lambda trainer: _facts(trainer, gather_object)  # noqa: E731
    for name in names or [*SCENARIOS, "resume", *EVALUATIONS]:
        if name.startswith("resume"):  # stopped after one phase, then resumed (checked against uninterrupted)
            scenario = name.partition(":")[2] or "grpo-native"
            run_training(scenario, models, out / name, stop_after=2, bf16=bf16)
            report[name] = run_training(scenario, models, out / name, resume=True, bf16=bf16)
            continue
        if name.startswith("unshared:"):  # a relative output folder: each node's own working folder
            try:
                run_training(name.partition(":")[2], models, Path(name.replace(":", "-")), bf16=bf16)
            except UserError as exc:
                report[name] = str(exc)
            continue
        if name in EVALUATIONS:
            report[name] = run_evaluation(name, models, out / f"results-{name}")
            continue
        report[name] = run_training(name, models, out / name, probe=probe, bf16=bf16)
    if state.is_main_process:
        (out / "report.json").write_text(json.dumps(report, indent=1))


def _loads_real_weights(path: str) -> bool:
    """Whether this process gets the checkpoint's weights from a load that lets transformers skip them on every
    process but the first (FSDP's RAM-efficient loading); the trainer syncs them from rank 0 when sharding."""
    import torch
    from safetensors.torch import load_file

    from stabledrl_bench.core.models.backends import load_model_spec

    saved = load_file(str(Path(path) / "model.safetensors"))
    loaded = load_model_spec(path, rank0_weights=True).model.state_dict()
    return all(torch.equal(loaded[name], tensor) for name, tensor in saved.items())


def _facts(trainer, gather_object) -> list[dict[str, object]]:
    """Every process's pad-free flag and rollout-weights digest (they must all be equal)."""
    import hashlib

    if trainer.replica is not None:
        trainer.replica.refresh(trainer.train_dlm.model)
    digest = hashlib.sha256()
    for name, tensor in sorted(trainer.dlm.model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().float().cpu().numpy().tobytes())
    return gather_object([{"pad_free": trainer.train_dlm.pad_free, "weights": digest.hexdigest()}])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
