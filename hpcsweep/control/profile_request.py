"""Asking a running trial for a profile, through its trial dir as a stop file asks it to stop.

``python -m hpcsweep.profile`` writes ``profile/request.json``; rank 0 of the trial sees it at a
step boundary, every rank agrees on it in the step's stop check, and the trial profiles its next
steps (``hpcsweep.train.observe.profiling``). Rank 0 removes the request once it is taken, and writes
``profile/request-done.json`` (naming the request and the traces of every rank) once its own trace
is written. Where the traces of a window go is named here, for the trainer, the command and status.

Files (JSON, written atomically)::

    profile/request.json       {"id": str, "steps": int, "requested_at": float}
    profile/request-done.json  {"id": str, "steps": [START, END], "traces": [str], "cut_short": bool}

Paths in ``traces`` are relative to the trial dir. Login-node code: no torch here.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpcsweep.files.atomic import atomic_write_json
from hpcsweep.files.trial_files import PROFILE_DIR, TrialFiles

REQUEST_FILE = "request.json"
DONE_FILE = "request-done.json"
MAX_REQUEST_STEPS = 20
"""The most steps one request may profile: a trace grows with every step, and Perfetto's UI slows
down past a few hundred MB."""


@dataclass(frozen=True)
class ProfileRequest:
    """A request for a profile of a running trial's next ``steps`` steps."""

    id: str
    steps: int
    requested_at: float


@dataclass(frozen=True)
class ProfileDone:
    """What a trial wrote for a request: the steps it profiled and every rank's trace."""

    id: str
    steps: tuple[int, int]
    traces: tuple[str, ...]
    cut_short: bool = False
    """The trial stopped (or stopped early) before the last step asked for: fewer steps than asked."""


def check_request_steps(steps: Any) -> int:
    """``steps`` as a valid request size; ``ValueError`` naming what is allowed otherwise."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_REQUEST_STEPS:
        raise ValueError(f"--steps={steps!r} is not allowed: an integer from 1 to {MAX_REQUEST_STEPS}")
    return steps


def parse_request(text: str) -> ProfileRequest:
    """A request file's text as a ``ProfileRequest``; ``ValueError`` when it is not one."""
    try:
        raw = json.loads(text)
        request = ProfileRequest(id=str(raw["id"]), steps=raw["steps"], requested_at=float(raw["requested_at"]))
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"not a profile request ({type(err).__name__}: {err})") from None
    check_request_steps(request.steps)
    return request


def parse_done(text: str) -> ProfileDone:
    """A done file's text as a ``ProfileDone``; ``ValueError`` when it is not one."""
    try:
        raw = json.loads(text)
        start, end = raw["steps"]
        return ProfileDone(id=str(raw["id"]), steps=(int(start), int(end)),
                           traces=tuple(str(t) for t in raw["traces"]), cut_short=bool(raw.get("cut_short")))
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"not a profile done file ({type(err).__name__}: {err})") from None


def request_path(trial_dir: Path) -> Path:
    return TrialFiles(trial_dir).profile / REQUEST_FILE


def done_path(trial_dir: Path) -> Path:
    return TrialFiles(trial_dir).profile / DONE_FILE


def window_dir(start: int, end: int) -> str:
    """The folder of one window's traces, relative to the trial dir: ``profile/steps-3-4``."""
    return f"{PROFILE_DIR}/steps-{start}-{end}"


def trace_path(start: int, end: int, rank: int) -> str:
    """Rank ``rank``'s trace of steps ``start``..``end``, relative to the trial dir."""
    return f"{window_dir(start, end)}/rank{rank}.json"


def memory_snapshot_path(start: int, end: int, rank: int) -> str:
    """Rank ``rank``'s CUDA allocator snapshot of steps ``start``..``end``, relative to the trial dir."""
    return f"{window_dir(start, end)}/rank{rank}-memory.pickle"


def write_request(trial_dir: Path, steps: int) -> ProfileRequest:
    """Ask the trial in ``trial_dir`` to profile its next ``steps`` steps (replacing a request not taken yet)."""
    request = ProfileRequest(id=uuid.uuid4().hex, steps=check_request_steps(steps), requested_at=time.time())
    atomic_write_json(request_path(trial_dir), asdict(request))
    return request


def read_request(trial_dir: Path) -> ProfileRequest | None:
    """The request waiting in ``trial_dir``, or None; ``ValueError`` for a file that is not one."""
    try:
        text = request_path(trial_dir).read_text()
    except FileNotFoundError:
        return None
    return parse_request(text)


def remove_request(trial_dir: Path) -> None:
    """The request is taken (or unreadable): nobody takes it again."""
    request_path(trial_dir).unlink(missing_ok=True)


def write_done(trial_dir: Path, done: ProfileDone) -> None:
    """Tell whoever asked that the request ``done.id`` is served, and where its traces are."""
    atomic_write_json(done_path(trial_dir), {**asdict(done), "steps": list(done.steps), "traces": list(done.traces)})


def read_done(trial_dir: Path) -> ProfileDone | None:
    """The last request served in ``trial_dir``, or None (none yet, or a torn or foreign file)."""
    try:
        return parse_done(done_path(trial_dir).read_text())
    except (FileNotFoundError, ValueError):
        return None
