"""``SWEEP_DIR/sweep.json``: the list of a sweep's trials, where they live and which job runs each.

Schema (version 1)::

    {"version": 1, "sweep_dir": str, "launcher": "slurm" | "local", "created_at": ISO-8601,
     "budget_gpu_hours": float | null,
     "arrays": [{"array_job_id": str, "trials": [int, ...], "trials_per_task": int,
                 "launcher": {KEY: value, ...}}],
     "trials": [{"num": int, "overrides": [str], "trial_dir": str,
                 "job_id": "ARRAYID_TASK" | null, "submitted_at": ISO-8601,
                 "attempts": [{"job_id": "ARRAYID_TASK" | null, "submitted_at": ISO-8601}]}],
     "app": {KEY: value, ...}}

``budget_gpu_hours``, ``attempts``, an array's ``launcher`` and ``app`` came later and may be missing: no
budget, one attempt (the trial's ``job_id`` and ``submitted_at``), settings not recorded, nothing
recorded by the app. ``app`` is what the app's trial hook records about the sweep when it is
submitted (``TrialHook.sweep_facts``; hpcsweep's: ``models``, the identity of each model folder its
trials load, by ``model.path``).
A ``data=text`` sweep whose token cache was missing adds ``"token_preparation": {"job_id": str,
"log": str, "entries": [str, ...]}``: the one Slurm job that tokenized the corpus, which every array
waits on (``afterok``), its log, and the cache entries it writes.

``job_id`` and ``submitted_at`` are always the current attempt's; ``arrays`` lists every array
ever submitted, retries included, each with the ``hydra.launcher`` settings it was submitted with
(a retry's are the sweep's own, the first arrays', plus that retry's overrides).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hpcsweep.files.atomic import atomic_write_json
from hpcsweep.files.trial_files import TRIAL_FILES

SWEEP_FILE = "sweep.json"
LOCK_FILE = ".sweep.json.lock"
SCHEMA_VERSION = 1


def now_iso(timespec: str = "seconds") -> str:
    """The current UTC time, ISO-8601 with seconds (or ``timespec``, as ``datetime.isoformat`` takes it)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec=timespec)


@dataclass(frozen=True)
class Attempt:
    """One submission of a trial: the job that ran it (None for a local run) and when."""

    job_id: str | None
    submitted_at: str


@dataclass(frozen=True)
class TrialRecord:
    """One trial of a sweep; ``job_id`` and ``submitted_at`` are its current attempt's."""

    num: int
    overrides: list[str]
    trial_dir: str
    job_id: str | None
    submitted_at: str
    attempts: list[Attempt] = field(default_factory=list)
    """Every submission, oldest first; empty in files written before retries (one attempt then)."""

    def all_attempts(self) -> list[Attempt]:
        """Every submission of the trial, oldest first, the current one last."""
        return list(self.attempts) or [Attempt(self.job_id, self.submitted_at)]

    def retried(self, job_id: str | None, submitted_at: str) -> TrialRecord:
        """This trial with one more attempt, now the current one."""
        return replace(
            self, job_id=job_id, submitted_at=submitted_at,
            attempts=[*self.all_attempts(), Attempt(job_id, submitted_at)],
        )


@dataclass(frozen=True)
class ArrayRecord:
    """One Slurm job array and the trial numbers its tasks run, in task order.

    Task ``i`` runs ``trials[i * trials_per_task : (i + 1) * trials_per_task]``, one after another
    (a record without ``trials_per_task`` is of one trial per task).
    """

    array_job_id: str
    trials: list[int]
    trials_per_task: int = 1
    launcher: dict[str, Any] = field(default_factory=dict)
    """The ``hydra.launcher`` settings the array was submitted with (empty in older files)."""


@dataclass(frozen=True)
class TokenPreparationRecord:
    """The Slurm job that tokenizes a ``data=text`` sweep's corpus before its arrays may start."""

    job_id: str
    log: str
    """The job's stdout and stderr."""
    entries: list[str]
    """The token cache entries it writes (``hpcsweep.files.token_cache``)."""


@dataclass(frozen=True)
class SweepRecord:
    """Everything ``sweep.json`` holds."""

    sweep_dir: str
    launcher: str
    created_at: str
    trials: list[TrialRecord]
    arrays: list[ArrayRecord] = field(default_factory=list)
    budget_gpu_hours: float | None = None
    """``hydra.launcher.budget_gpu_hours`` of the latest submission (None: no budget)."""
    app: dict[str, Any] = field(default_factory=dict)
    """What the app's trial hook records about the sweep at submission (``TrialHook.sweep_facts``)."""
    token_preparation: TokenPreparationRecord | None = None
    """The job that tokenizes the corpus first (None: no ``data=text`` cache was missing)."""
    version: int = SCHEMA_VERSION

    def job_ids(self) -> list[str]:
        """The array job ids, in submission order."""
        return [array.array_job_id for array in self.arrays]

    def first_launcher_settings(self) -> dict[str, Any]:
        """The sweep's own launcher settings: those its first array was submitted with ({} unknown)."""
        return dict(self.arrays[0].launcher) if self.arrays else {}


def write_sweep_record(record: SweepRecord) -> Path:
    """Write ``sweep.json`` atomically into the sweep dir; return its path."""
    path = Path(record.sweep_dir) / SWEEP_FILE
    atomic_write_json(path, asdict(record))
    return path


def parse_sweep_record(text: str) -> SweepRecord:
    """Parse the text of ``sweep.json``."""
    raw = json.loads(text)
    if raw.get("version") != SCHEMA_VERSION:
        raise ValueError(f"sweep.json version {raw.get('version')!r} is not {SCHEMA_VERSION}")
    return SweepRecord(
        sweep_dir=raw["sweep_dir"],
        launcher=raw["launcher"],
        created_at=raw["created_at"],
        trials=[_trial_record(trial) for trial in raw["trials"]],
        arrays=[ArrayRecord(**array) for array in raw.get("arrays", [])],
        budget_gpu_hours=raw.get("budget_gpu_hours"),
        app=raw.get("app") or {},
        token_preparation=TokenPreparationRecord(**raw["token_preparation"]) if raw.get("token_preparation") else None,
    )


def _trial_record(raw: dict) -> TrialRecord:
    attempts = [Attempt(**attempt) for attempt in raw.get("attempts", [])]
    return TrialRecord(**{**raw, "attempts": attempts})


def missing_sweep_message(sweep_dir: str | Path) -> str | None:
    """Why ``sweep_dir`` is neither a sweep (``sweep.json``) nor a single trial dir, or None."""
    path = Path(sweep_dir)
    if any((path / name).exists() for name in (SWEEP_FILE, *TRIAL_FILES)):
        return None
    files = "/".join(TRIAL_FILES)
    return f"{sweep_dir}: no {SWEEP_FILE} and no {files} here; pass a sweep's multirun dir or a trial dir"


def read_sweep_record(sweep_dir: str | Path) -> SweepRecord:
    """Read ``SWEEP_DIR/sweep.json``."""
    return parse_sweep_record((Path(sweep_dir) / SWEEP_FILE).read_text())


def resolve_trial_dir(sweep_dir: Path, trial: TrialRecord) -> Path:
    """The trial's dir: as recorded, or ``SWEEP_DIR/<num>`` when the sweep was copied elsewhere."""
    recorded = Path(trial.trial_dir)
    if not recorded.is_absolute():
        recorded = sweep_dir / recorded
    return recorded if recorded.exists() else sweep_dir / str(trial.num)


@contextmanager
def sweep_record_locked(sweep_dir: str | Path) -> Iterator[None]:
    """Hold the sweep's lock on ``sweep.json`` updates (array tasks of a search update it at once)."""
    with open(Path(sweep_dir) / LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def with_trial_overrides(record: SweepRecord, overrides: Mapping[int, Sequence[str]]) -> SweepRecord:
    """``record`` with the overrides of the trials in ``overrides`` (number -> overrides) replaced."""
    trials = [replace(t, overrides=list(overrides[t.num])) if t.num in overrides else t for t in record.trials]
    return replace(record, trials=trials)


def record_trial_overrides(sweep_dir: str | Path, overrides: Mapping[int, Sequence[str]]) -> bool:
    """Write the overrides a search chose for some trials into ``sweep.json``, under the sweep's lock.

    False (and nothing written) while the sweep has no ``sweep.json`` yet: the sweeper merges
    every choice made so far once the submission has written it.
    """
    with sweep_record_locked(sweep_dir):
        if not (Path(sweep_dir) / SWEEP_FILE).exists():
            return False
        write_sweep_record(with_trial_overrides(read_sweep_record(sweep_dir), overrides))
        return True
