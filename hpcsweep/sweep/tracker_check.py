"""The trackers a sweep logs to, checked on the login node before anything is submitted.

``logging.backends`` and ``logging.mlflow.tracking_uri`` are validated with the config itself
(``hpcsweep.config``); here the packages a backend needs must be importable (one line each, with the
pip line that installs them), and the sweep's default MLflow store (a SQLite file in the sweep dir)
is created once, with its experiment, so that trials starting together do not race to create its
tables.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

from hpcsweep.config import LoggingConfig

PACKAGES = {"mlflow": ("mlflow", "pip install -e .[mlflow]"), "wandb": ("wandb", "pip install -e .[wandb]")}
"""What each tracker backend imports, and how to install it."""


def missing_packages(cfg: LoggingConfig) -> list[str]:
    """One line per backend of ``logging.backends`` whose package is not installed."""
    lines = []
    for backend in cfg.backends:
        if backend in PACKAGES and importlib.util.find_spec(PACKAGES[backend][0]) is None:
            module, install = PACKAGES[backend]
            lines.append(f"logging.backends names {backend}, but the {module} package is not installed: {install}")
    return lines


def check_trackers(cfg: LoggingConfig) -> None:
    """``ValueError`` naming ``logging.backends`` when a backend's package is missing."""
    lines = missing_packages(cfg)
    if lines:
        raise ValueError("; ".join(lines))


def create_default_mlflow_stores(trials: Iterable[tuple[LoggingConfig, Path]]) -> None:
    """Create the sweep-dir SQLite store and experiment of each trial that logs to MLflow by default."""
    from hpcsweep.train.trackers.mlflow_logger import experiment_id, experiment_name, tracking_uri

    done = set()
    for cfg, trial_dir in trials:
        if "mlflow" not in cfg.backends or cfg.mlflow.tracking_uri is not None:
            continue
        uri, name = tracking_uri(cfg.mlflow, trial_dir), experiment_name(cfg.mlflow, trial_dir)
        if (uri, name) in done:
            continue
        from mlflow import MlflowClient

        trial_dir.resolve().parent.mkdir(parents=True, exist_ok=True)
        experiment_id(MlflowClient(tracking_uri=uri), name)
        done.add((uri, name))
