"""stabledrl-bench: a reference harness for reinforcement learning on diffusion language models.

Engine layout (one idea per module): ``models`` (backends + tiny model), ``sampling`` (diffusion decoders),
``estimators`` (likelihood proxies), ``registry`` (baselines; the losses live in the top-level ``baselines/``
folder), ``trainer`` / ``sft`` (training), ``evaluation`` / ``lmeval_adapter`` / ``protocols`` (evaluation),
``results`` / ``leaderboard`` (records and tables), ``reproduce`` / ``stress`` (the paper's experiments).
Tasks live in the top-level ``tasks/`` folder, installed as ``stabledrl_bench.tasks``.
"""

__version__ = "0.1.0"
