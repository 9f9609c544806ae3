"""The committed inputs of every golden case: two small warm-started models and one fixed rollout batch for each.

Why the inputs are committed instead of rebuilt from a seed: weights drawn from a seed depend on the platform's
random-number kernels (torch's vectorised normal sampler follows the CPU's instruction set), and a regression check
must start every platform from the same bytes. The models are the tiny network (:mod:`stabledrl_bench.core.models.tiny`)
at 27k parameters, one with full and one with block attention, warm-started by 1000 SFT steps on 4x4 Sudoku so that
their completions already have the answer format and the real reward varies between completions (a random model
earns 0 everywhere, and every group advantage would be 0). The convention emulations of the published families
(LLaDA's two files, Dream, SDAR's two) are these same weights saved under another ``convention``.

``python -m stabledrl_bench.regression.fixtures`` rebuilds them (and says how they were made in ``README.md`` beside
them). Do it only when the inputs must change: every reference is then re-pinned (``regress --update``).
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from stabledrl_bench.core.budget import Budget
from stabledrl_bench.core.estimators import SequenceBatch
from stabledrl_bench.processes import keyed_generator
from stabledrl_bench.training.optim import OptimConfig

FIXTURES = Path(__file__).resolve().parent / "golden" / "fixtures"
SHAPE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
BLOCK_SIZE = 4
TASK, PROTOCOL, SPLIT = "sudoku", "tiny", "train"
CANVAS = 40  # the tiny-protocol Sudoku answer (33 characters) and its EOS fit

# Every model a golden case runs: the native tiny model of each attention, and each family's emulated convention.
MODELS: dict[str, tuple[str, str]] = {
    "tiny-full": ("full", "native"),
    "tiny-block": ("block", "native"),
    "llada-hub": ("full", "llada-hub"),
    "llada": ("full", "llada"),
    "dream": ("full", "dream"),
    "sdar-chat": ("block", "sdar-chat"),
    "sdar-trado": ("block", "sdar-trado"),
}

# The golden RL budget: two rollout phases of 2 prompts x 4 completions, two inner iterations each (4 optimizer
# steps), sampled at temperature 0.9 on the 40-token canvas. Small enough for all methods on every model in about a
# minute, large enough that the second rollout comes from trained weights (so the optimizer step is pinned too).
GOLDEN_BUDGET = Budget(
    max_steps=4,
    prompts_per_step=2,
    num_generations=4,
    num_iterations=2,
    max_completion_length=CANVAS,
    diffusion_steps=20,
    block_length=8,
    temperature=0.9,
    max_prompt_length=32,
)
GOLDEN_OPTIM = OptimConfig(learning_rate=1e-3, lr_scheduler_type="linear", max_grad_norm=1.0)


def model_dir(attention: str) -> Path:
    """The committed warm-started model of ``attention`` ("full" or "block")."""
    return FIXTURES / f"model-{attention}"


def materialise(model: str, workdir: Path) -> Path:
    """A folder holding golden model ``model`` (a key of :data:`MODELS`): the committed folder for the native
    models, a copy with the emulated ``convention`` in its config (same weights) for the others."""
    attention, convention = MODELS[model]
    source = model_dir(attention)
    if convention == "native":
        return source
    target = workdir / "models" / model
    if not (target / "config.json").is_file():
        staging = workdir / "models" / f".{model}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source, staging)
        config = json.loads((staging / "config.json").read_text())
        config["convention"] = convention
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        staging.rename(target)
    return target


@dataclass
class FixedRollouts:
    """One committed rollout batch: what the teacher-forced cases feed to every estimator and loss."""

    batch: SequenceBatch
    rewards: torch.Tensor  # [B] the task's d1 reward (Sudoku cell accuracy) of each completion
    correct: torch.Tensor  # [B] 1.0 where the cell accuracy is >= 0.5 (so every group has both verdicts)
    group_ids: torch.Tensor  # [B] the prompt each completion belongs to


ROLLOUTS_FILE = "rollouts.json"


def fixed_rollouts(attention: str) -> FixedRollouts:
    """The committed rollouts of the ``attention`` model."""
    data = json.loads((FIXTURES / ROLLOUTS_FILE).read_text())[attention]
    long = {key: torch.tensor(data[key], dtype=torch.long) for key in ("prompt_ids", "completion_ids", "unmask_step")}
    return FixedRollouts(
        batch=SequenceBatch(
            prompt_ids=long["prompt_ids"],
            prompt_mask=torch.tensor(data["prompt_mask"], dtype=torch.bool),
            completion_ids=long["completion_ids"],
            completion_mask=torch.tensor(data["completion_mask"], dtype=torch.bool),
            unmask_step=long["unmask_step"],
        ),
        rewards=torch.tensor(data["rewards"], dtype=torch.float32),
        correct=torch.tensor(data["correct"], dtype=torch.float32),
        group_ids=torch.tensor(data["group_ids"], dtype=torch.long),
    )


# ------------------------------------------------------------------------------------------------ rebuilding
SFT_STEPS, SFT_BATCH = 1000, 32


def build_fixtures(out: Path = FIXTURES) -> None:
    """Rebuild the models and rollouts into ``out`` (minutes on a CPU; never needed to run ``regress``)."""
    import tempfile

    from stabledrl_bench.core.models import build_tiny, load_diffusion_lm, save_diffusion_lm
    from stabledrl_bench.training.sft import SFTConfig, run_sft

    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    rollouts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for attention in ("full", "block"):
            start = Path(tmp) / f"start-{attention}"
            save_diffusion_lm(build_tiny(attention=attention, block_size=BLOCK_SIZE, seed=0, **SHAPE), start)
            sft = SFTConfig(
                task=TASK,
                model=str(start),
                protocol=PROTOCOL,
                train_split=SPLIT,
                max_steps=SFT_STEPS,
                batch_size=SFT_BATCH,
                max_completion_length=CANVAS,
                output_dir=str(Path(tmp) / f"sft-{attention}"),
                save_every=0,
                progress=False,
            )
            target = model_dir(attention) if out == FIXTURES else out / f"model-{attention}"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(run_sft(sft), target)
            rollouts[attention] = _sample_rollouts(load_diffusion_lm(target))
    (out / ROLLOUTS_FILE).write_text(json.dumps(rollouts) + "\n")


def _sample_rollouts(dlm) -> dict[str, list]:
    """Two training prompts whose 4 completions each (temperature 0.9) include both verdicts, as JSON lists."""
    from stabledrl_bench.core.sampling import generate
    from stabledrl_bench.tasks import get_task

    task = get_task(TASK)
    settings = GOLDEN_BUDGET.decode_settings(dlm)
    group = GOLDEN_BUDGET.num_generations
    chosen: list[dict] = []
    for index, doc in enumerate(task.load(SPLIT)):
        spec = task.prompt(doc, PROTOCOL)
        ids, mask = dlm.encode_prompts([spec.messages] * group, chat_template=spec.chat_template, prefill=spec.prefill)
        with torch.no_grad():
            out = generate(dlm, ids, mask, settings, generator=keyed_generator(0, "fixture-rollouts", index))
        rewards = [r.total for r in task.reward_many(dlm.decode(out.completion_ids), [doc] * group, "d1")]
        if 0 < sum(r >= 0.5 for r in rewards) < group:
            chosen.append({"ids": ids, "mask": mask, "out": out, "rewards": rewards})
        if len(chosen) == 2:
            break
    width = max(c["ids"].shape[1] for c in chosen)

    def left_pad(tensor: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(tensor, (width - tensor.shape[1], 0), value=value)

    completion_ids = torch.cat([c["out"].completion_ids for c in chosen])
    return {
        "prompt_ids": torch.cat([left_pad(c["ids"], dlm.pad_id) for c in chosen]).tolist(),
        "prompt_mask": torch.cat([left_pad(c["mask"].long(), 0) for c in chosen]).bool().tolist(),
        "completion_ids": completion_ids.tolist(),
        "completion_mask": dlm.completion_mask(completion_ids).tolist(),
        "unmask_step": torch.cat([c["out"].unmask_step for c in chosen]).tolist(),
        "rewards": [r for c in chosen for r in c["rewards"]],
        "correct": [float(r >= 0.5) for c in chosen for r in c["rewards"]],
        "group_ids": [g for g in range(len(chosen)) for _ in range(group)],
    }


if __name__ == "__main__":
    build_fixtures(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES)
