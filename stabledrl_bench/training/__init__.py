"""Layer 2, training: the RL trainer every baseline shares, masked-diffusion SFT, the budget, optimisers,
checkpoints and run logs. Built on :mod:`stabledrl_bench.core`; knows nothing of evaluation or reports."""
