"""``HPCSWEEP_FAULT``: inject one fault into a trial, to test that a cluster fails fast, retries, stops and resumes.

    HPCSWEEP_FAULT=crash,step=5,rank=3          rank 3 dies of SIGSEGV after step 5 (a worker crash: retried)
    HPCSWEEP_FAULT=hang,step=5,rank=1           rank 1 stops making progress after step 5 (a hang: retried)
    HPCSWEEP_FAULT=stop,step=5,rank=0           a stop request after step 5, as a stop signal would make
                                                (every rank saves and stops; the runner decides what follows)
    HPCSWEEP_FAULT=hang_in_save,step=6,rank=0   rank 0 stops for ever inside the save of step 6, after its
                                                shard is written and before the checkpoint is complete
                                                (a save killed half-way, once the process is killed)

The fault fires once per trial dir: the rank writes a marker file into the trial dir first
(``fault_injected.txt``, which also tells a test that the fault has fired), so the retry or resume of
the trial runs clean. Parsing is pure (``parse_fault``); the step hook is ``fault_hooks``, the save's
pause ``save_pause``.

Slow data is not a fault of this variable, which reaches every trial of a sweep alike: it is the
per-trial config key ``data.read_delay_ms`` (``data.read_delay_ms=0,0,0,50`` slows one trial of four).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FAULT_VAR = "HPCSWEEP_FAULT"
MARKER_FILE = "fault_injected.txt"
"""In the trial dir once the fault has fired: it never fires there again."""
KINDS = ("crash", "hang", "stop", "hang_in_save")
STOP_REASON = "fault"
"""The stop reason of ``stop``: not a signal's, so under Slurm the runner requeues as after a time limit."""


@dataclasses.dataclass(frozen=True)
class Fault:
    """Which fault to inject (one of ``KINDS``), at which step, on which global rank."""

    kind: str
    step: int
    rank: int

    def describe(self) -> str:
        return f"{self.kind},step={self.step},rank={self.rank}"


def _bad(raw: str, why: str) -> ValueError:
    return ValueError(
        f"{FAULT_VAR}={raw!r} is not allowed: {why}; expected KIND,step=N,rank=R with KIND one of "
        f"{', '.join(KINDS)}, N >= 1 and R >= 0 (e.g. crash,step=5,rank=3)"
    )


def parse_fault(raw: str) -> Fault | None:
    """The fault ``HPCSWEEP_FAULT`` asks for, None when it is empty; ``ValueError`` when malformed."""
    text = raw.strip()
    if not text:
        return None
    kind, *fields = [part.strip() for part in text.split(",")]
    if kind not in KINDS:
        raise _bad(raw, f"unknown fault {kind!r}")
    values: dict[str, int] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or key not in ("step", "rank"):
            raise _bad(raw, f"unknown field {field!r}")
        if key in values:
            raise _bad(raw, f"{key} given twice")
        if not value.isdigit():
            raise _bad(raw, f"{key}={value!r} is not a whole number")
        values[key] = int(value)
    missing = [key for key in ("step", "rank") if key not in values]
    if missing:
        raise _bad(raw, f"{' and '.join(missing)} missing")
    if values["step"] < 1:
        raise _bad(raw, "step must be >= 1")
    return Fault(kind, values["step"], values["rank"])


def fault_from_env(env: Mapping[str, str]) -> Fault | None:
    """The fault of ``HPCSWEEP_FAULT`` in ``env``, or None."""
    return parse_fault(env.get(FAULT_VAR, ""))


def _crash() -> None:
    # SIGSEGV, not an exception: a crash of the process itself, as a CUDA or NCCL fault would be.
    # faulthandler (enabled by the worker) writes the Python stack before the process dies.
    os.kill(os.getpid(), signal.SIGSEGV)


def _hang() -> None:
    threading.Event().wait()


def _stop() -> None:
    from hpcsweep.control.stop import STOP_REQUESTED

    STOP_REQUESTED.set(STOP_REASON)


def _fire_once(fault: Fault, marker: Path, rank: int, step: int) -> bool:
    """Write the marker and say so in the log, unless the fault fired in this trial dir before."""
    if marker.exists():
        return False
    marker.write_text(f"{fault.describe()}\n")
    log.warning("%s=%s: injecting a %s on rank %d at step %d", FAULT_VAR, fault.describe(), fault.kind, rank, step)
    for handler in logging.getLogger().handlers:
        handler.flush()
    return True


def fault_hooks(
    env: Mapping[str, str], trial_dir: Path, rank: int, fire: Mapping[str, Callable[[], None]] | None = None
) -> list[Callable[[Any, int], None]]:
    """A step hook that injects ``HPCSWEEP_FAULT`` on its rank after its step, unless it already fired
    in ``trial_dir``; no hook without the variable or on other ranks. ``fire`` replaces the faults (tests)."""
    fault = fault_from_env(env)
    if fault is None or fault.rank != rank or fault.kind == "hang_in_save":
        return []
    actions = dict(fire or {"crash": _crash, "hang": _hang, "stop": _stop})
    marker = trial_dir / MARKER_FILE

    def inject(trainer: Any, step: int) -> None:
        if step == fault.step and _fire_once(fault, marker, rank, step):
            actions[fault.kind]()

    return [inject]


def save_pause(env: Mapping[str, str], trial_dir: Path, rank: int) -> tuple[int, Callable[[], None]] | None:
    """``(step, pause)`` for ``hang_in_save`` on this rank: the checkpoint store calls ``pause`` inside the
    save of ``step``, once this rank's shard is written; None for any other fault or rank."""
    fault = fault_from_env(env)
    if fault is None or fault.rank != rank or fault.kind != "hang_in_save":
        return None

    def pause() -> None:
        if _fire_once(fault, trial_dir / MARKER_FILE, rank, fault.step):
            threading.Event().wait()

    return fault.step, pause
