"""A log window's router statistics, from the tokens each expert got (pure: lists of counts in, a dict out).

Per MoE layer and overall: ``max_mean_load``, the most loaded expert's tokens over the mean expert's
(1.0 is perfect balance; ``experts / top_k`` means every token went to the same ``top_k`` experts),
``idle_fraction``, the share of experts that got no token, and ``aux_loss``, the balance loss; per layer
also ``loads``, each expert's tokens (what the collapse rule reads). Overall, ``max_mean_load`` is the worst
layer's and ``idle_fraction`` is over every layer's experts together. The record is metrics.json's
``router``; ``tensorboard_scalars`` gives its ``moe/*`` scalars. ``hpcsweep.results.routing`` reads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_LAYER = re.compile(r"layers\.(\d+)\.")


def layer_of(module_name: str) -> int | None:
    """The decoder layer a router's module name puts it in (``model.layers.3.mlp.gate``: 3); None without one."""
    match = _LAYER.search(module_name + ".")
    return int(match.group(1)) if match else None


def max_mean_load(counts: Sequence[int]) -> float | None:
    """The most loaded expert's tokens over the mean; None when no token was routed."""
    total = sum(counts)
    return max(counts) * len(counts) / total if total else None


def idle_fraction(counts: Sequence[int]) -> float:
    """The share of experts that got no token."""
    return sum(1 for c in counts if c == 0) / len(counts)


def window_stats(
    loads: Mapping[int, Sequence[int]], *, top_k: int, aux_loss: float | None, aux_loss_coef: float,
    bias_update_rate: float, layer_aux_loss: Mapping[int, float] | None = None,
) -> dict[str, Any]:
    """metrics.json's ``router``: ``loads`` maps each MoE layer to its experts' token counts (over every
    rank), ``layer_aux_loss`` each layer to its own balance loss (the window's mean; None: no forward)."""
    layers = {
        str(layer): {"max_mean_load": max_mean_load(counts), "idle_fraction": idle_fraction(counts),
                     "tokens": int(sum(counts)), "loads": [int(c) for c in counts],
                     "aux_loss": None if layer_aux_loss is None else layer_aux_loss.get(layer)}
        for layer, counts in sorted(loads.items())
    }
    worst = [v["max_mean_load"] for v in layers.values() if v["max_mean_load"] is not None]
    every = [c for counts in loads.values() for c in counts]
    return {
        "max_mean_load": max(worst) if worst else None,
        "idle_fraction": idle_fraction(every),
        "aux_loss": aux_loss,
        "aux_loss_coef": aux_loss_coef,
        "bias_update_rate": bias_update_rate,
        "experts": max(len(c) for c in loads.values()),
        "top_k": top_k,
        "layers": layers,
    }


def tensorboard_scalars(stats: Mapping[str, Any]) -> dict[str, float]:
    """``moe/max_mean_load``, ``moe/idle_fraction``, ``moe/aux_loss``, and per layer ``moe/layerN/...``."""
    scalars = {f"moe/{key}": stats[key] for key in ("max_mean_load", "idle_fraction", "aux_loss")
               if stats.get(key) is not None}
    for layer, values in stats.get("layers", {}).items():
        for key in ("max_mean_load", "idle_fraction", "aux_loss"):
            if values.get(key) is not None:
                scalars[f"moe/layer{layer}/{key}"] = values[key]
    return scalars
