"""Layer 3, experiments: what ``reproduce`` and ``stress`` run, composed from training, evaluation and
reporting."""
