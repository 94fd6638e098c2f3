"""``usage.json`` in a local trial's dir: the wall time of each of its runs, for a local sweep's budget.

On Slurm, accounting knows what every run used (``hpcsweep.slurm.usage``); a local run records it
here instead: when it started, when it was last seen, and how many GPUs (nodes without GPUs) it
holds. A run that died without a last word counts up to its last record.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from hpcsweep.files.atomic import atomic_write_json

USAGE_FILE = "usage.json"


@dataclass(frozen=True)
class LocalRun:
    """One local run of a trial; times are ``time.time()`` seconds."""

    started_at: float
    last_at: float
    units: int
    ended: bool = False

    @property
    def hours(self) -> float:
        """GPU-hours (node-hours without GPUs) this run has used."""
        return self.units * max(0.0, self.last_at - self.started_at) / 3600.0


def read_runs(path: Path) -> list[LocalRun]:
    """The runs in a ``usage.json``; none when it is missing or unreadable (a half-written file never is)."""
    try:
        raw = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    return [LocalRun(**run) for run in raw.get("runs", [])]


def write_runs(path: Path, runs: Iterable[LocalRun]) -> None:
    """Rewrite ``usage.json`` atomically."""
    atomic_write_json(path, {"runs": [asdict(run) for run in runs]})


def start_run(path: Path, units: int, now: float) -> None:
    """Record a new run, begun at ``now``."""
    write_runs(path, [*read_runs(path), LocalRun(now, now, units)])


def touch_run(path: Path, now: float, ended: bool = False) -> None:
    """Move the latest run's last record to ``now`` (and mark it ended)."""
    runs = read_runs(path)
    if runs:
        write_runs(path, [*runs[:-1], replace(runs[-1], last_at=now, ended=ended)])


def local_spending(runs: Iterable[LocalRun]) -> tuple[float, float]:
    """``(hours spent, hours added per hour)`` of local runs: all of them, and those still running."""
    runs = list(runs)
    return sum(run.hours for run in runs), float(sum(run.units for run in runs if not run.ended))
