"""Unit tests share one process: a stop request left by one test must not stop the next trial."""

import os

import pytest

from hpcsweep import preempt


@pytest.fixture(autouse=True)
def no_leftover_stop_request():
    preempt.STOP_REQUESTED.clear()
    stop_file = os.environ.get(preempt.STOP_FILE_VAR)
    yield
    preempt.STOP_REQUESTED.clear()
    if stop_file is None:
        os.environ.pop(preempt.STOP_FILE_VAR, None)
