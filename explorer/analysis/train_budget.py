"""Memory budgets written the way people write them: 80e9, "80GB", "80 GiB", "512MiB"."""

from __future__ import annotations

import re

UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BUDGET = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_budget(budget: float | str) -> int:
    """Bytes in `budget`: a number of bytes, or a number with a unit (B, KB/MB/GB/TB in powers of
    10, KiB/MiB/GiB/TiB in powers of 2; case-insensitive). Raises ValueError naming the value (TypeError for a bool)."""
    if isinstance(budget, bool):
        raise TypeError(f"budget must be bytes or a string such as '80GB', got {budget!r}")
    if isinstance(budget, (int, float)):
        if budget < 0:
            raise ValueError(f"budget must not be negative, got {budget!r}")
        return int(budget)
    match = _BUDGET.match(budget) if isinstance(budget, str) else None
    if match is None or match.group(2).lower() not in UNITS:
        raise ValueError(
            f"cannot read the budget {budget!r}: write bytes or a number and a unit, e.g. '80GB', '80GiB', '512MiB'"
        )
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])
