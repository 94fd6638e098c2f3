"""How many routed experts a MoE layer has, from a model's config: each family names the count its own way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROUTED_EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
"""Where a config keeps its routed experts per MoE layer: DeepSeek (MoE, V2, V3), Mixtral, Qwen-MoE."""


def routed_expert_count(config: Mapping[str, Any] | Any) -> int:
    """Routed experts per MoE layer of ``config`` (a ``config.json`` mapping, or a transformers config);
    0 for a dense model."""
    get = config.get if isinstance(config, Mapping) else lambda key: getattr(config, key, None)
    return next((int(get(key)) for key in ROUTED_EXPERT_KEYS if get(key)), 0)
