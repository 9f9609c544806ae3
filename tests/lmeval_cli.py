"""lm-eval's own command line (``lm_eval ...``), indexing only ``--include_path``: the real CLI also indexes its
~13,000 built-in task files, which takes most of a test's time and none of which the tests load. Run it as
``python tests/lmeval_cli.py <lm_eval arguments>`` (or launch it with ``accelerate launch``)."""

from __future__ import annotations

import functools

from lm_eval.__main__ import cli_evaluate
from lm_eval.tasks import TaskManager

TaskManager.__init__ = functools.partialmethod(TaskManager.__init__, include_defaults=False)

if __name__ == "__main__":
    cli_evaluate()
