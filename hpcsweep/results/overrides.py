"""Hydra override strings as keys and values: what the report and status show of each trial."""

from __future__ import annotations

from collections.abc import Sequence


def split_override(override: str) -> tuple[str, str] | None:
    """``+model.lr=1e-4`` -> ``("model.lr", "1e-4")``; None for a deletion (``~key``)."""
    if override.startswith("~") or "=" not in override:
        return None
    key, value = override.split("=", 1)
    return key.lstrip("+"), value


def override_values(overrides: Sequence[str]) -> dict[str, str]:
    """``["model.lr=1e-4", "+x=1"]`` -> ``{"model.lr": "1e-4", "x": "1"}`` (Hydra keys left out)."""
    values = {}
    for override in overrides:
        parsed = split_override(override)
        if parsed is not None and not parsed[0].startswith("hydra."):
            values[parsed[0]] = parsed[1]
    return values
