"""What the training workers on one node take from their runner: one file per node and attempt, ``attempt/nodeN.json``.

The runner writes it before it starts the workers (``hpcsweep.trial.attempt``); each worker reads it, its path
being the second argument of ``python -m hpcsweep.train TRIAL_DIR ATTEMPT_FILE``. Settings reach the workers
this way, never through environment variables: those are for what other programs read (torchrun, NCCL, CUDA).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from hpcsweep.files.atomic import atomic_write_json


@dataclasses.dataclass(frozen=True)
class WorkerAttempt:
    """One node's share of an attempt, as its workers see it.

    ``stop_file``: the file this node's runner writes to ask the workers to stop. ``worker_dir``: where each
    worker leaves its progress, stacks and traceback for the runner. ``signal_delay_s``: the lead of Slurm's
    time-limit signal (``hydra.launcher.signal_delay_s``), weighed against the first save; None outside Slurm.
    ``search_trial``: the study trial's file of a search trial (its pruning reporter), else None.
    ``model_record``: the JSON form of the runner's record of the model folder (``hpcsweep.model.record``),
    read once per attempt; None for the built-in model.
    """

    node_rank: int = 0
    stop_file: Path | None = None
    worker_dir: Path | None = None
    signal_delay_s: int | None = None
    search_trial: Path | None = None
    model_record: dict[str, Any] | None = None


NO_RUNNER = WorkerAttempt()
"""A worker started without a runner (by hand, a test, a benchmark): no stop file, records or search."""

_PATHS = ("stop_file", "worker_dir", "search_trial")


def attempt_to_dict(attempt: WorkerAttempt) -> dict[str, Any]:
    """The JSON form of ``attempt`` (paths as strings)."""
    raw = dataclasses.asdict(attempt)
    return {key: str(value) if key in _PATHS and value is not None else value for key, value in raw.items()}


def attempt_from_dict(raw: dict[str, Any]) -> WorkerAttempt:
    """The ``WorkerAttempt`` of its JSON form; ``ValueError`` naming an unknown field."""
    unknown = set(raw) - {field.name for field in dataclasses.fields(WorkerAttempt)}
    if unknown:
        raise ValueError(f"attempt file: unknown field(s) {', '.join(sorted(unknown))}")
    return WorkerAttempt(**{key: Path(value) if key in _PATHS and value is not None else value
                            for key, value in raw.items()})


def write_attempt(path: Path, attempt: WorkerAttempt) -> None:
    """Write the attempt file atomically (a worker never reads half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, attempt_to_dict(attempt))


def read_attempt(path: Path | None) -> WorkerAttempt:
    """The attempt in ``path``; ``NO_RUNNER`` without one."""
    if path is None:
        return NO_RUNNER
    return attempt_from_dict(json.loads(path.read_text()))
