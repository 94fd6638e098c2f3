"""Trial directories for trainer tests: a ``config.yaml`` as the runner writes it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hpcsweep.config import trial_config_from_dict, trial_config_to_dict


def trial_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The default trial config with ``{"group.key": value}`` settings applied (``model.lora.r``: nested)."""
    cfg = trial_config_to_dict(trial_config_from_dict({}))
    for key, value in settings.items():
        *groups, name = key.split(".")
        node = cfg
        for group in groups:
            node = node[group]
        node[name] = value
    return cfg


def make_trial_dir(path: Path, settings: Mapping[str, Any]) -> Path:
    """Create ``path`` holding the config.yaml of ``trial_config(settings)``."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(trial_config(settings)))
    return path


def read_metrics(trial_dir: Path) -> dict[str, Any]:
    return json.loads((trial_dir / "metrics.json").read_text())
