"""Stop requests inside every process of a trial: which signal means which stop, the request itself,
the node's stop file the workers watch, and the signal handlers that turn one into the other.

The decision what to do after a stop (requeue, leave it to Slurm, fail) is the trial's, in
``hpcsweep.trial.preempt``; here is only what every process (the sweep, the runner, each worker)
needs to notice a stop and leave cleanly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hpcsweep.files.atomic import atomic_write_json

log = logging.getLogger(__name__)

TIME_LIMIT = "time_limit"
"""The stop came from Slurm's warning signal before the job's time limit."""


PREEMPTED = "preempted"
"""The stop came from a SIGTERM: preemption, a node taken down, a cancel or requeue."""


INTERRUPTED = "interrupted"
"""The stop came from a SIGINT: Ctrl-C in a terminal."""


BUDGET = "budget"
"""The sweep's GPU-hour budget is spent: stop with a checkpoint, and nothing requeues the trial."""


# USR2 is submitit's and Slurm-launched PyTorch's usual warning signal; USR1 is avoided because
# NCCL may catch it. SIGINT is a stop too, so that Ctrl-C checkpoints instead of raising
# KeyboardInterrupt mid-step.
SIGNAL_REASONS: Mapping[signal.Signals, str] = {
    signal.SIGUSR2: TIME_LIMIT,
    signal.SIGTERM: PREEMPTED,
    signal.SIGINT: INTERRUPTED,
}


def stop_reason(signum: int) -> str:
    """The stop reason a signal stands for; ``ValueError`` for a signal that is not a stop."""
    try:
        return SIGNAL_REASONS[signal.Signals(signum)]
    except (KeyError, ValueError):
        raise ValueError(f"signal {signum} is not a stop signal; expected one of {sorted(SIGNAL_REASONS)}") from None


class StopRequest(threading.Event):
    """An event that also carries why it was set and when (``time.monotonic``)."""

    def __init__(self) -> None:
        super().__init__()
        self.reason: str | None = None
        self.requested_at: float | None = None

    def set(self, reason: str = "requested") -> None:  # type: ignore[override]
        """Request a stop; the first reason and time win until ``clear``."""
        if self.reason is None:
            self.reason, self.requested_at = reason, time.monotonic()
        super().set()

    def clear(self) -> None:
        self.reason = self.requested_at = None
        super().clear()


STOP_REQUESTED = StopRequest()
"""Set by a signal handler (or a stop file) to make the trainer save and exit after this step."""


def write_stop_file(path: Path, reason: str) -> None:
    """Ask this node's workers to stop (atomically, so a worker never reads half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"reason": reason, "requested_at": time.time()})


def read_stop_file(path: Path) -> str | None:
    """The reason in a stop file, or None when there is none."""
    try:
        return str(json.loads(path.read_text())["reason"])
    except FileNotFoundError:
        return None


def stop_file_hooks(path: Path | None, stop: StopRequest) -> list[Callable[[Any, int], None]]:
    """A step hook that sets ``stop`` once this node's stop file ``path`` appears (none without a file:
    a worker started without a runner)."""
    if path is None:
        return []

    def check_stop_file(trainer: Any, step: int) -> None:
        if not stop.is_set() and path.exists():
            stop.set(read_stop_file(path) or "requested")

    return [check_stop_file]


@contextlib.contextmanager
def stop_signals_handled(on_stop: Callable[[str], None]) -> Iterator[None]:
    """Call ``on_stop(reason)`` on USR2, SIGTERM and SIGINT inside the block; restore the old handlers after.

    Replaces submitit's handlers (USR2 would requeue and ``sys.exit`` mid-step, SIGTERM is
    ignored) and Python's KeyboardInterrupt for the duration of the trial. A second SIGINT in
    the block raises ``KeyboardInterrupt``, as Python's own handler would: leave now, without the
    checkpoint of this step. Must run in the main thread.
    """
    interrupts = 0

    def handler(signum: int, frame: Any) -> None:
        nonlocal interrupts
        reason = stop_reason(signum)
        if reason == INTERRUPTED:
            interrupts += 1
            if interrupts > 1:
                raise KeyboardInterrupt("interrupted again while stopping")
        on_stop(reason)

    with stop_signals_routed_to(handler):
        yield


@contextlib.contextmanager
def stop_signals_routed_to(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Every stop signal (``SIGNAL_REASONS``) calls ``handler`` inside the block; the old handlers come back after.

    Must run in the main thread.
    """
    previous = {sig: signal.signal(sig, handler) for sig in SIGNAL_REASONS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Block USR2, SIGTERM and SIGINT in this thread inside the block.

    Child processes inherit the mask, so a worker started here holds a stop signal pending while
    it imports torch, instead of dying of it, until ``unblock_stop_signals`` once its handlers are
    in place. The process's other threads (the main one) still receive the signals.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNAL_REASONS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNAL_REASONS)


def leave_on_terminate() -> None:
    """From now on a SIGTERM ends this process at once (the default action), not as a stop request.

    For a worker that has saved everything and is leaving: torchrun's agent SIGTERMs the workers
    still running once one has exited, and a stop handler would keep a worker blocked in a
    collective's teardown alive until the agent's SIGKILL, 30 s later.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def unblock_stop_signals() -> None:
    """Let stop signals in (a pending one is delivered now); call once the handlers are installed."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNAL_REASONS)
