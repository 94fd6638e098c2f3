"""``HPCSWEEP_FAULT``: inject one crash or hang into a trial, to test that a cluster fails fast and retries.

    HPCSWEEP_FAULT=crash,step=5,rank=3   rank 3 dies of SIGSEGV after step 5 (a worker crash: retried)
    HPCSWEEP_FAULT=hang,step=5,rank=1    rank 1 stops making progress after step 5 (a hang: retried)

The fault fires once per trial dir: the rank writes a marker file into the trial dir first, so the
retry of the trial runs clean. Parsing is pure (``parse_fault``); the step hook is ``fault_hooks``.
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
KINDS = ("crash", "hang")


@dataclasses.dataclass(frozen=True)
class Fault:
    """Which fault to inject (``crash`` or ``hang``), after which step, on which global rank."""

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


def fault_hooks(
    env: Mapping[str, str], trial_dir: Path, rank: int, fire: Mapping[str, Callable[[], None]] | None = None
) -> list[Callable[[Any, int], None]]:
    """A step hook that injects ``HPCSWEEP_FAULT`` on its rank after its step, unless it already fired
    in ``trial_dir``; no hook without the variable or on other ranks. ``fire`` replaces the faults (tests)."""
    fault = fault_from_env(env)
    if fault is None or fault.rank != rank:
        return []
    actions = dict(fire or {"crash": _crash, "hang": _hang})
    marker = trial_dir / MARKER_FILE

    def inject(trainer: Any, step: int) -> None:
        if step != fault.step or marker.exists():
            return
        marker.write_text(f"{fault.describe()}\n")
        log.warning(
            "%s=%s: injecting a %s on rank %d after step %d", FAULT_VAR, fault.describe(), fault.kind, rank, step
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        actions[fault.kind]()

    return [inject]
