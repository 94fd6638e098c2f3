"""A daemon thread that calls a sampling function every so many seconds until it is stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 10.0
"""How long ``stop`` waits for a sample under way (NVML calls take milliseconds; a hung driver
must not hold the trial's exit)."""


class SamplerThread:
    """Runs ``sample()`` every ``interval_s`` seconds on a daemon thread, between ``start`` and ``stop``.

    An exception in ``sample`` never reaches training: it is logged, kept in ``error``, and sampling
    stops. The first sample is taken one interval after ``start``.
    """

    def __init__(self, sample: Callable[[], None], interval_s: float, name: str = "hpcsweep-telemetry") -> None:
        self.sample, self.interval_s = sample, interval_s
        self.error: str | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            try:
                self.sample()
            except Exception as err:  # any error: telemetry must never fail the trial it watches
                self.error = f"{type(err).__name__}: {err}"
                log.warning("telemetry sampling stopped: %s", self.error, exc_info=True)
                return

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop sampling and wait for the thread (at most ``JOIN_TIMEOUT_S``); safe to call twice."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(JOIN_TIMEOUT_S)
