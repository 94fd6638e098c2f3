"""Whether a MoE trial's routing collapsed, from metrics.json's ``router`` (its last log window).

The rule (docs/user/efficiency.md, docs/user/moe.md), per MoE layer: the layer collapsed when

- **most of its experts starve**: at least ``COLLAPSE_STARVED_FRACTION`` of its experts (or, when fewer,
  the ``experts - top_k`` that a total collapse leaves idle) got under ``STARVED_LOAD`` of the mean
  expert's tokens, or
- **its busiest expert nears the ceiling**: its max/mean load is at least ``COLLAPSE_CEILING_FRACTION`` of
  ``experts / top_k``, the max/mean of a router that sends every token to the same experts (that expert
  was chosen by at least 90% of the tokens). Only where ``experts >= 2 x top_k``: with more choices per
  token than half the experts, any expert is chosen by most tokens.

Starving, not idle: a router that sends a stray token to each expert it has abandoned
(``[0, 0, 1, 0, 2047, 0, 2047, 1]``) is as collapsed as one that sends none. A trial collapsed when
any of its layers did; it is a rule on the trial alone, not against the sweep's median, so a sweep
whose every trial collapsed is flagged whole. A dense trial (no ``router``) is never flagged. A record
from before the per-layer ``loads`` is judged by its layers' idle fractions (an idle expert starves)
and max/mean loads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

STARVED_LOAD = 0.1
"""An expert that got under this fraction of its layer's mean expert's tokens starves."""
COLLAPSE_STARVED_FRACTION = 0.5
"""At least this share of a layer's experts starving: its routing collapsed."""
COLLAPSE_CEILING_FRACTION = 0.9
"""A layer's max/mean load at this fraction of its ceiling ``experts / top_k``: its routing collapsed."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def starved_count(loads: Sequence[float]) -> int:
    """How many experts got under ``STARVED_LOAD`` of the mean expert's tokens (0 when none was routed)."""
    total = math.fsum(loads)
    if total <= 0:
        return 0
    return sum(1 for load in loads if load < STARVED_LOAD * total / len(loads))


def starved_limit(experts: int, top_k: int) -> int:
    """Starving experts that make a collapse: half the experts, or the ``experts - top_k`` that a total
    collapse leaves idle when fewer (at least 1)."""
    return max(1, min(math.ceil(COLLAPSE_STARVED_FRACTION * experts), experts - top_k))


def layer_collapse(layer: Mapping[str, Any], experts: int | None, top_k: int | None) -> str | None:
    """Why one layer's record (metrics.json ``router.layers.N``) says it collapsed; None when it did not,
    or when it cannot say."""
    loads = layer.get("loads")
    if isinstance(loads, Sequence) and loads and all(_number(c) is not None for c in loads):
        experts = len(loads)
        starved = starved_count([float(c) for c in loads])
    else:
        idle = _number(layer.get("idle_fraction"))
        starved = None if idle is None or not experts else round(idle * experts)
    reasons = []
    if starved is not None and experts and top_k and experts > top_k and starved >= starved_limit(experts, top_k):
        reasons.append(f"{starved} of {experts} experts got under {STARVED_LOAD:.0%} of the mean load")
    load = _number(layer.get("max_mean_load"))
    if load is not None and experts and top_k and experts >= 2 * top_k:
        ceiling = experts / top_k
        if load >= COLLAPSE_CEILING_FRACTION * ceiling:
            reasons.append(f"the most loaded expert got {load:.2f}x the mean (ceiling {ceiling:g})")
    return ", ".join(reasons) or None


def collapse_reason(router: Any) -> str | None:
    """Why the routing of a trial whose metrics.json ``router`` is ``router`` collapsed; None when it
    did not, or when there is no record."""
    if not isinstance(router, Mapping):
        return None
    experts, top_k = _number(router.get("experts")), _number(router.get("top_k"))
    experts, top_k = (None if experts is None else int(experts)), (None if top_k is None else int(top_k))
    layers = router.get("layers")
    if not isinstance(layers, Mapping) or not layers:
        # A record with no layers: its overall figures stand for one layer.
        layers = {"": router}
    found = []
    for name, layer in layers.items():
        if isinstance(layer, Mapping) and (why := layer_collapse(layer, experts, top_k)):
            found.append(f"layer {name}: {why}" if name else why)
    if not found:
        return None
    return "routing collapsed: " + "; ".join(found)
