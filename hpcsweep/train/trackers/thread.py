"""A tracker's calls on a thread of its own: a slow tracker server never holds up a training step.

MLflow's sends (``MlflowClient.log_batch``, an HTTP round trip or a database write) and W&B's
``finish`` (an upload that waits for its server) ran on rank 0 between steps: a server that answers
slowly stalled rank 0, and every other rank with it at the next collective. ``TrackerThread`` runs
one tracker's start and every later call, in order, on its own daemon thread; the training loop only
queues them. At the end of a trial the trial waits for the queued calls until a deadline
(``trackers.FINISH_WAIT_S``) and then goes on without them: a slow tracker costs a trial that wait
once, at most. A call that raises stops the thread; the trial's thread reads ``error`` and reports
the tracker as failed (``hpcsweep.train.trackers.backends``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from hpcsweep.train.trackers.metrics import Logger

POLL_S = 0.05
"""How often a wait looks whether the thread ended (it may end without reaching the wait's mark)."""


class TrackerThread(Logger):
    """One tracker (made by ``start``, on the thread) whose calls run on its thread, in order."""

    def __init__(self, name: str, start: Callable[[], Logger]) -> None:
        self.name = name
        self.error: BaseException | None = None
        self._fields: dict[str, Any] | None = None
        self._calls: queue.SimpleQueue[Callable[[Logger], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(start,), name=f"tracker-{name}", daemon=True)
        self._thread.start()

    def _run(self, start: Callable[[], Logger]) -> None:
        try:
            tracker = start()
            self._fields = tracker.report_fields()
            while (call := self._calls.get()) is not None:
                call(tracker)
        except Exception as err:  # noqa: BLE001 - the trial's thread reports it (Trackers)
            self.error = err

    @property
    def started(self) -> bool:
        """Whether the tracker has started (its run id is known)."""
        return self._fields is not None

    def log(self, metrics: Mapping[str, float | None], step: int) -> None:
        metrics = dict(metrics)
        self._calls.put(lambda tracker: tracker.log(metrics, step))

    def finish(self, status: str, summary: Mapping[str, Any]) -> None:
        summary = dict(summary)
        self._calls.put(lambda tracker: tracker.finish(status, summary))

    def close(self) -> None:
        """Queue the tracker's close; the thread ends after it."""
        self._calls.put(lambda tracker: tracker.close())
        self._calls.put(None)

    def settle(self, deadline: float) -> bool:
        """Wait until every call queued so far has run, or the thread has ended, or ``time.monotonic()``
        passes ``deadline``; True unless the deadline came first."""
        done = threading.Event()
        if self._thread.is_alive():
            self._calls.put(lambda tracker: done.set())
        while not done.is_set() and self._thread.is_alive():
            if time.monotonic() >= deadline:
                return False
            done.wait(min(POLL_S, max(deadline - time.monotonic(), 0.0)))
        return True

    def report_fields(self) -> dict[str, Any]:
        return dict(self._fields or {})
