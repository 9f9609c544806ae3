"""The leaderboard's Stability section, generated from ``results/stability/*.json`` (never from hand-written numbers).

It iterates the :data:`~.options.EXPERIMENTS` registry (plugins included): one block per experiment with a record
(its ``report``, :mod:`.tables` for the built-ins, else :func:`~.tables.generic_block`), then every experiment's
lines under "What we observed" (its ``observations``, :mod:`.observations` for the built-ins), each claim with its
verdict computed from the records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stabledrl_bench.errors import UserError
from stabledrl_bench.experiments.stress.common import read_record, stability_dir
from stabledrl_bench.experiments.stress.options import EXPERIMENTS, in_order
from stabledrl_bench.experiments.stress.tables import generic_block
from stabledrl_bench.reporting.results import STABILITY_DIR


def stability_section(results_dir: Path | str) -> str | None:
    """Markdown of the Stability section, or None when no stability record exists: one block per registered
    experiment that has a record (plugins included), then every experiment's observations."""

    results_dir = Path(results_dir)
    folder = stability_dir(results_dir)
    names = in_order()
    records = {name: read_record(folder / f"{name}.json") for name in names if (folder / f"{name}.json").is_file()}
    if not records:
        return None

    link_base = f"{results_dir.as_posix()}/{STABILITY_DIR}"
    model = next((r["model"] for r in records.values() if r.get("model")), None)
    warm = next((r["warm_start"] for r in records.values() if r.get("warm_start")), None)
    intro = (
        f"Measured by `python -m stabledrl_bench stress {{{','.join(names)}}}` (one command each; records in "
        f"`{link_base}/`). These experiments test the paper's *mechanism* (estimated ratios, conditional vs "
        "unconditional clipping, self-normalisation) on a tiny model on CPU, not its 8B accuracy numbers"
    )
    if model:
        intro += f"; model: {model.get('name')} ({model.get('parameters')} parameters)"
    if warm and warm.get("spec"):
        sft = warm["spec"]["sft"]  # the runner's WarmStart.identity()
        intro += (
            f", warm start: {sft['max_steps']} masked-diffusion SFT steps on generated {sft['task']} "
            f"(`{sft['protocol']}` protocol), shared by every run"
        )

    def rendered(name: str, part: int) -> Any:
        """Block (0) or observations (1) of ``name``; a record missing a field is one line naming the file."""
        try:
            experiment = EXPERIMENTS.get(name)
            if part == 0:
                return (experiment.report or generic_block)(records[name], link_base)
            return experiment.observations(records.get(name)) if experiment.observations else []
        except KeyError as exc:
            raise UserError(
                f"{folder / f'{name}.json'}: no field {exc} (written by an older version of this harness); "
                f"run `stress {name}` again"
            ) from None

    parts = ["## Stability (stress tests on a tiny model)", intro + "."]
    parts += [rendered(name, 0) for name in records]
    observed = [line for name in names for line in rendered(name, 1)]
    parts.append(
        "### What we observed\n\nEach paper claim (§ numbers refer to [docs/published-numbers.md]"
        "(docs/published-numbers.md); the stress-test claims are grade S, qualitative only) against this run's "
        "numbers; verdicts are computed from the records above.\n\n" + "\n".join(observed)
    )
    return "\n\n".join(p for p in parts if p) + "\n"
