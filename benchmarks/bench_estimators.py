"""Batched likelihood estimators vs the same estimator one row at a time: wall time (and peak GPU memory).

Not a test. Every estimator folds its Monte-Carlo samples into one forward pass; ``micro_batch_size=1`` runs the
identical computation row by row, which is the reference here. The script checks both give the same estimates
and prints the speed ratio measured in the same process.

    python benchmarks/bench_estimators.py --batch 16 --max-completion-length 64 --repeats 3
"""

from __future__ import annotations

import argparse

import torch
from timing import best_time

from stabledrl_bench.core.estimators import SequenceBatch, build_estimator
from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.core.sampling import FullDecode, generate

ESTIMATORS = {
    "d1_one_step": {},
    "spg_block": {"num_mc": 2, "block_length": 8},
    "espo_elbo": {"num_mc": 2},
    "trace_replay": {"shrink": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-completion-length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    dlm = build_tiny()
    dlm.model.to(args.device).eval()
    prompts = [f"{i} {i + 3} {2 * i + 1} -> {i + 7}" for i in range(args.batch)]
    prompt_ids, prompt_mask = dlm.encode_prompts(prompts)
    settings = FullDecode(
        max_completion_length=args.max_completion_length, block_length=8, steps=args.max_completion_length // 2
    )
    out = generate(dlm, prompt_ids, prompt_mask, settings)
    batch = SequenceBatch(
        prompt_ids, prompt_mask, out.completion_ids, dlm.completion_mask(out.completion_ids), out.unmask_step
    )
    print(
        f"device={args.device} batch={args.batch} max_completion_length={args.max_completion_length} "
        f"(best of {args.repeats})"
    )
    print(f"{'estimator':14s} {'batched s':>10s} {'row-by-row s':>13s} {'speed-up':>9s}  same result")
    for name, kwargs in ESTIMATORS.items():
        batched = build_estimator(name, **kwargs)
        looped = build_estimator(name, micro_batch_size=1, **kwargs)
        noise = batched.draw(batch, torch.Generator().manual_seed(0))
        with torch.no_grad():
            t_fast, fast = best_time(lambda b=batched, n=noise: b.evaluate(dlm, batch, n), args.repeats)
            t_slow, slow = best_time(lambda b=looped, n=noise: b.evaluate(dlm, batch, n), args.repeats)
        field = "elbo" if fast.elbo is not None else "token_logp"
        same = torch.allclose(getattr(fast, field), getattr(slow, field), atol=1e-4)
        print(f"{name:14s} {t_fast:10.3f} {t_slow:13.3f} {t_slow / t_fast:8.1f}x  {same}")


if __name__ == "__main__":
    main()
