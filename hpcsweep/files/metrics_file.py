"""``metrics.json``: the trial's state, rewritten atomically as it runs; every stage reads it.

Written by the workers' rank 0 and by the trial's runner, read by the sweep (to skip ended trials)
and by ``status`` and ``report``, so it lives here, apart from the trainer's torch code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcsweep.files.atomic import atomic_write_json
from hpcsweep.files.sweep_record import now_iso

NOT_STARTED = "not_started"
"""The status of a trial that a stop of its local sweep kept from starting (``hpcsweep.sweep.local_run``)."""
STATUSES = ("running", "completed", "failed", "stopped_early", "stopped", "pruned", "skipped_budget", NOT_STARTED)


def read_metrics(path: Path) -> dict[str, Any] | None:
    """The metrics.json of a trial, or None when there is none (or it is unreadable)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def new_report(*, max_steps: int, world_size: int, restarts: int, env: Mapping[str, str]) -> dict[str, Any]:
    """The metrics.json fields of a trial that has not reported anything yet."""
    return {
        "status": "running",
        "step": 0,
        "max_steps": max_steps,
        "train_loss": None,
        "val_loss": None,
        "best_val_loss": None,
        "lr": None,
        "grad_norm": None,
        "tokens_per_s": None,
        "mfu": None,
        "restarts": restarts,
        "slurm_restart_count": int(env.get("SLURM_RESTART_COUNT", "0")),
        "world_size": world_size,
        "nodes": [],
        "ranks": [],
        "started_at": now_iso("milliseconds"),
        "weights_sha256": None,
        "error": None,
    }


def write_metrics(path: Path, metrics: Mapping[str, Any]) -> None:
    """Rewrite metrics.json with ``metrics`` and a fresh ``updated_at``."""
    if metrics["status"] not in STATUSES:
        raise ValueError(f"status={metrics['status']!r} is not one of {STATUSES}")
    # Milliseconds: a trial's own GPU-hours are updated_at - started_at, and a short run lasts under a second.
    atomic_write_json(path, {**metrics, "updated_at": now_iso("milliseconds")})
