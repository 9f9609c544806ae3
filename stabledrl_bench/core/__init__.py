"""Layer 1, the algorithms: model backends, attention masks, samplers, likelihood estimators, advantages and the
registries every method plugs into. Imports nothing from the layers above (training, evaluation, reporting,
experiments); the baselines (``stabledrl_bench.baselines``) and tasks (``stabledrl_bench.tasks``) build on it."""
