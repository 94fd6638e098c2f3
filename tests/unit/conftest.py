"""Unit tests share one process: a stop request left by one test must not stop the next trial."""

import pytest

from hpcsweep.control import stop


@pytest.fixture(autouse=True)
def no_leftover_stop_request():
    stop.STOP_REQUESTED.clear()
    yield
    stop.STOP_REQUESTED.clear()
