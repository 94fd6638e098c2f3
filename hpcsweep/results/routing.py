"""Whether a MoE trial's routing collapsed, from metrics.json's ``router`` (its last log window).

The rule (docs/user/efficiency.md, docs/user/moe.md): routing collapsed when at least
``COLLAPSE_IDLE_FRACTION`` of the routed experts (every MoE layer together) got no token, or when some
layer's most loaded expert got at least ``COLLAPSE_MAX_MEAN_LOAD`` times the mean expert's tokens.
It is a rule on the trial alone, not against the sweep's median: a sweep whose every trial collapsed
is flagged whole. A dense trial (no ``router``) is never flagged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

COLLAPSE_IDLE_FRACTION = 0.5
"""At least this share of experts without a token: routing collapsed."""
COLLAPSE_MAX_MEAN_LOAD = 4.0
"""The most loaded expert at this many times the mean load: routing collapsed. A balanced router is
near 1; the ceiling is ``experts / top_k`` (with 4 experts and top-2 it is 2, and only the idle
fraction can flag a collapse)."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def collapse_reason(router: Any) -> str | None:
    """Why the routing of a trial whose metrics.json ``router`` is ``router`` collapsed; None when it
    did not, or when there is no record."""
    if not isinstance(router, Mapping):
        return None
    idle, load = _number(router.get("idle_fraction")), _number(router.get("max_mean_load"))
    reasons = []
    if idle is not None and idle >= COLLAPSE_IDLE_FRACTION:
        reasons.append(f"{idle:.0%} of experts got no token")
    if load is not None and load >= COLLAPSE_MAX_MEAN_LOAD:
        reasons.append(f"the most loaded expert got {load:.1f}x the mean")
    if not reasons:
        return None
    return "routing collapsed: " + ", ".join(reasons)
