"""The hang watchdog: when no worker of this node finishes a step for ``trainer.hang_timeout_min``,
write every worker's Python stack to the trial log, end the workers, and report a hang.

A hung collective blocks every rank of the trial, so every node's watchdog fires within about one
step of the others. Which rank hung is read from the progress of all nodes' workers (the trial dir
is shared): the one with the fewest steps, since the others went on into the collective it never
joined. Where every rank is at the same step (a collective that hung in the network), the lowest
rank stands for the trial. The node holding that rank acts first, so that the stacks on record
are the hung rank's; the other nodes act only ``OTHERS_GRACE_S`` later, should it not.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcsweep.train.observe import worker_records
from hpcsweep.trial.failure_class import HANG, Failure

log = logging.getLogger(__name__)

# How long the workers get to write their stacks after the stacks signal.
STACKS_WAIT_S = 5.0
# How much longer the nodes without the hung rank wait: its node ends the trial well before.
OTHERS_GRACE_S = 30.0


def stalled_for(progress_times: Sequence[float], started_at: float, now: float) -> float:
    """Seconds since the last finished step of any worker (or since the watch began, if later)."""
    return now - max([started_at, *progress_times])


def hung_rank(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The progress record of the rank that hung: fewest steps, then lowest rank; None without records."""
    return min(records, key=lambda r: (r["step"], r["rank"]), default=None)


def check_interval(timeout_s: float) -> float:
    """How often to look: a sixth of the timeout, between 1 s and 30 s."""
    return min(30.0, max(1.0, timeout_s / 6))


class HangWatchdog:
    """Watches this node's workers (``worker_dir``) from a thread; ``failure`` is set once it fired.

    The other nodes' worker dirs sit beside ``worker_dir``; ``timeout_s`` 0 watches nothing.
    """

    def __init__(self, worker_dir: Path, timeout_s: float, node: str) -> None:
        self.worker_dir, self.timeout_s, self.node = worker_dir, timeout_s, node
        self.failure: Failure | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)

    def __enter__(self) -> HangWatchdog:
        if self.timeout_s > 0:
            self._started_at = time.time()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        interval = check_interval(self.timeout_s)
        while not self._done.wait(interval):
            records = worker_records.read_progress([self.worker_dir])
            idle = stalled_for([r["time"] for r in records], self._started_at, time.time())
            if idle < self.timeout_s or self._done.is_set():
                continue
            culprit = hung_rank(worker_records.read_progress(sorted(self.worker_dir.parent.glob("node*"))))
            if culprit is None or culprit["node"] == self.node or idle >= self.timeout_s + OTHERS_GRACE_S:
                self._fire(records, idle, culprit)
                return

    def _fire(self, records: list[dict[str, Any]], idle: float, culprit: dict[str, Any] | None) -> None:
        pids = [int(r["pid"]) for r in records]
        stacks = self._dump_stacks(pids)
        rank = None if culprit is None else int(culprit["rank"])
        node = self.node if culprit is None else str(culprit["node"])
        shown = "\n".join(f"--- local rank {local} ---\n{text}" for local, text in sorted(stacks.items()))
        log.error(
            "no step finished for %.0f s (trainer.hang_timeout_min=%g): the trial hangs, rank %s on %s "
            "the furthest behind. Python stacks of this node's workers:\n%s",
            idle, self.timeout_s / 60, rank, node, shown,
        )
        # On record: the hung rank's own stacks where this node holds it, else all of this node's.
        own = stacks.get(culprit["local_rank"]) if culprit is not None and culprit["node"] == self.node else None
        self.failure = Failure(HANG, node, rank, None, own or shown, time.time())
        for pid in pids:
            _signal(pid, signal.SIGKILL)

    def _dump_stacks(self, pids: list[int]) -> dict[int, str]:
        """Ask every worker for its stacks; return what each local rank wrote (waits up to ``STACKS_WAIT_S``)."""
        paths = sorted(self.worker_dir.glob("local*.stacks.txt"))
        before = {path: _size(path) for path in paths}
        for pid in pids:
            _signal(pid, worker_records.STACKS_SIGNAL)
        deadline = time.monotonic() + STACKS_WAIT_S
        while time.monotonic() < deadline and any(_size(p) <= before[p] for p in paths):
            time.sleep(0.2)
        # faulthandler writes the stacks from its signal handler in one go; give the last one a moment.
        time.sleep(0.2)
        return {
            int(path.name.removeprefix("local").split(".")[0]):
                path.read_text(errors="replace")[before[path]:].strip() or "(no stack written)"
            for path in paths
        }


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        log.info("worker %d is gone already", pid)
