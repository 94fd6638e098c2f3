"""Hydra override strings as keys and values: what the report and status show of each trial.

A trial's label is its override keys, valued as the trial was trained: where the trial's
``config.yaml`` (written when it starts training) holds a key, its value wins over the override's
text. A run that trained nothing (a completed trial run again with other overrides) rewrites
Hydra's ``.hydra/overrides.yaml`` but not ``config.yaml``, so the label still says what trained.
``hydra.*`` and ``resume.*`` keys are left out: they say how a run was started, not what it trained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

NOT_TRAINING_PREFIXES = ("hydra.", "resume.")
"""Override keys that are not training config: never part of a label."""


def split_override(override: str) -> tuple[str, str] | None:
    """``+model.lr=1e-4`` -> ``("model.lr", "1e-4")``; None for a deletion (``~key``)."""
    if override.startswith("~") or "=" not in override:
        return None
    key, value = override.split("=", 1)
    return key.lstrip("+"), value


def is_training_key(key: str) -> bool:
    """Whether an override key is training config (not ``hydra.*`` nor ``resume.*``)."""
    return not key.startswith(NOT_TRAINING_PREFIXES)


def override_values(overrides: Sequence[str]) -> dict[str, str]:
    """``["model.lr=1e-4", "+x=1"]`` -> ``{"model.lr": "1e-4", "x": "1"}`` (``hydra.*``, ``resume.*`` left out)."""
    values = {}
    for override in overrides:
        parsed = split_override(override)
        if parsed is not None and is_training_key(parsed[0]):
            values[parsed[0]] = parsed[1]
    return values


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"lr": 1e-4}}`` -> ``{"model.lr": 1e-4}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _same_value(text: str, value: Any) -> bool:
    if text == str(value):
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return text.lower() == str(value).lower()  # true/True, null/None


def value_text(value: Any) -> str:
    """A config value as an override would write it: ``0.0001``, ``true``, ``null``, ``[1, 2]``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return f"{value:g}" if isinstance(value, float) else str(value)


def trained_values(values: Mapping[str, str], config: Mapping[str, Any] | None) -> dict[str, str]:
    """``values`` (key -> override text) with each key the trained ``config`` holds set to its value there.

    A key that is no leaf of the config (a group choice such as ``model=llama_small``) keeps its
    text, and so does one whose text already means the config's value (``1e-4`` for 0.0001).
    Without a config (the trial has not started) the values stand as they are.
    """
    if not config:
        return dict(values)
    flat = flatten_config(config)
    trained = {}
    for key, text in values.items():
        if key in flat and not _same_value(text, flat[key]):
            trained[key] = value_text(flat[key])
        else:
            trained[key] = text
    return trained
