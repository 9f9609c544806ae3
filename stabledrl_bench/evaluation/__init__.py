"""Layer 2, evaluation: named protocols, the native evaluator, the lm-eval adapter and ``verify``. Built on
:mod:`stabledrl_bench.core` and writes records through :mod:`stabledrl_bench.reporting.results`."""
