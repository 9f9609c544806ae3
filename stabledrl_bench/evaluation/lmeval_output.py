"""lm-eval's output files under the harness's rule: a storage failure is one ``error:`` line, and nothing is lost.

lm-eval writes ``--output_path`` in ``EvaluationTracker.save_results_aggregated`` and ``save_results_samples``,
each of which catches every exception and only logs a warning ("Could not save results aggregated") and the
exception's repr. A full disk, a read-only mount or a folder that is not yours then ends an evaluation of hours
with exit status 0 and no results file (lm-eval 0.4.8-0.4.13).

:func:`fail_on_storage_errors` wraps both methods (the adapter calls it when lm-eval imports it, which is what
registers ``stabledrl_dllm``): while one runs, a logging handler on lm-eval's tracker logger notes the exception
being handled when lm-eval logs its warning (a handler runs inside lm-eval's ``except`` block, so the exception is
still the one being handled). When it was the storage failing (:func:`~stabledrl_bench.atomic.storage_failure`),
the run stops with one line and status 2, after printing the results table that lm-eval would print next, so the
numbers are on the screen even though the file could not be written. Any other failure keeps lm-eval's behaviour.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

from stabledrl_bench.atomic import storage_failure

STATUS = 2  # the harness's exit status for a problem the user can fix


class _StorageFailures(logging.Handler):
    """Notes the reason of a storage failure being handled while a record is logged (lm-eval's ``except``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reason: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        handled = sys.exc_info()[1]
        if self.reason is None and handled is not None:
            self.reason = storage_failure(handled, any_errno=True)


def _failing_loudly(save: Callable[..., None], what: str) -> Callable[..., None]:
    @functools.wraps(save)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        logger = logging.getLogger(save.__module__)
        failures, level = _StorageFailures(), logger.level
        logger.addHandler(failures)
        if logger.getEffectiveLevel() > logging.WARNING:  # lm-eval's warning is what the handler listens for
            logger.setLevel(logging.WARNING)
        try:
            save(self, *args, **kwargs)
        finally:
            logger.removeHandler(failures)
            logger.setLevel(level)
        if failures.reason is None:
            return
        results = kwargs.get("results", args[0] if args else None)
        if isinstance(results, dict) and "results" in results:
            from lm_eval.utils import make_table

            print(make_table(results))
        print(f"error: cannot write lm-eval's {what} under {self.output_path}: {failures.reason}", file=sys.stderr)
        raise SystemExit(STATUS)

    wrapped.stabledrl_wrapped = True  # type: ignore[attr-defined]
    return wrapped


def fail_on_storage_errors() -> None:
    """Wrap lm-eval's two result writers (once; see the module docstring)."""
    from lm_eval.loggers.evaluation_tracker import EvaluationTracker

    for name, what in (("save_results_aggregated", "results"), ("save_results_samples", "samples")):
        method = getattr(EvaluationTracker, name, None)  # None: an lm-eval without it (nothing to wrap)
        if method is not None and not getattr(method, "stabledrl_wrapped", False):
            setattr(EvaluationTracker, name, _failing_loudly(method, what))
