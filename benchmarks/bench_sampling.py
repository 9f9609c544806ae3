"""Cached vs uncached block-diffusion decoding: wall-clock time and NFE on a tiny block-attention model.

Not a test. The KV cache changes cost only (each step forwards one block instead of the whole prefix), never the
output, so the script also checks that both paths decode the same tokens.

    python benchmarks/bench_sampling.py --batch 8 --prompt-len 64 --max-completion-length 256 --device cpu
"""

from __future__ import annotations

import argparse

import torch
from timing import best_time

from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.core.sampling import GenerationOutput, block_diffusion_generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-completion-length", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--steps-per-block", type=int, default=4)
    parser.add_argument("--strategy", choices=("static", "dynamic"), default="static")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    model = build_tiny(attention="block", block_size=args.block_size)
    model.model.to(args.device).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, model.vocab_size, (args.batch, args.prompt_len), generator=gen).to(args.device)
    mask = torch.ones_like(ids, dtype=torch.bool)

    def decode(use_cache: bool) -> GenerationOutput:
        return block_diffusion_generate(
            model,
            ids,
            mask,
            max_completion_length=args.max_completion_length,
            steps_per_block=args.steps_per_block,
            strategy=args.strategy,
            use_cache=use_cache,
        )

    results = {use_cache: best_time(lambda u=use_cache: decode(u), args.repeats) for use_cache in (True, False)}
    tokens = args.batch * args.max_completion_length
    for use_cache, (seconds, out) in results.items():
        label = "cached  " if use_cache else "uncached"
        print(f"{label} {seconds:8.3f} s  {tokens / seconds:9.1f} tok/s  nfe/sample {out.nfe}")
    same = torch.equal(results[True][1].sequences, results[False][1].sequences)
    print(f"speedup {results[False][0] / results[True][0]:.2f}x  identical outputs: {same}")


if __name__ == "__main__":
    main()
