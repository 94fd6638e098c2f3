"""Unit tests share one process: a stop request left by one test must not stop the next trial."""

import os

import pytest

from hpcsweep.control import stop


@pytest.fixture(autouse=True)
def no_leftover_stop_request():
    stop.STOP_REQUESTED.clear()
    stop_file = os.environ.get(stop.STOP_FILE_VAR)
    yield
    stop.STOP_REQUESTED.clear()
    if stop_file is None:
        os.environ.pop(stop.STOP_FILE_VAR, None)
