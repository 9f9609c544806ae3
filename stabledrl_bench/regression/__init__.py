"""``regress``: the numbers a run produces, pinned by golden references (see docs/regression.md)."""
