"""Waiting for what another node writes into the shared trial or sweep dir.

The nodes of a trial share its dirs, not a channel: node 0 writes its word (the search trial's
parameters, whether the trial starts, how a failure is settled) and the other nodes read until it
is there, or until they give up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(read: Callable[[], T | None], timeout_s: float, interval_s: float = 0.2) -> T | None:
    """The first value ``read`` returns that is not None, reading every ``interval_s``; None once
    ``timeout_s`` has passed without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval_s)
