"""Trial dirs as Hydra and the trainer leave them, for TensorBoard layout tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from hpcsweep.train.trackers.metrics import TensorBoardLogger


def write_hydra_record(trial_dir: Path, override_dirname: str) -> None:
    """The part of ``.hydra/hydra.yaml`` that names the trial's TensorBoard run."""
    (trial_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    record = {"hydra": {"job": {"name": "hpcsweep", "override_dirname": override_dirname, "num": 0}}}
    (trial_dir / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(record))


def log_scalars(run_dir: Path, tag: str, points: Sequence[tuple[int, float]]) -> None:
    """One writer's event file in ``run_dir`` with ``(step, value)`` points of ``tag``."""
    logger = TensorBoardLogger(run_dir)
    for step, value in points:
        logger.log({tag: value}, step)
    logger.close()
