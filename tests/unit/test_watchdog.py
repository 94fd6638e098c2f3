"""The hang watchdog's pure parts, and a real hung worker: its stack in the log, then killed."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.train.observe import worker_records
from hpcsweep.trial.failure_class import HANG
from hpcsweep.trial.watchdog import HangWatchdog, check_interval, hung_rank, stalled_for


def test_stalled_time_counts_from_the_last_step_or_the_start():
    assert stalled_for([100.0, 130.0], started_at=90.0, now=200.0) == 70.0
    assert stalled_for([], started_at=150.0, now=200.0) == 50.0


def test_the_hung_rank_is_the_one_furthest_behind_else_the_lowest():
    records = [{"rank": 0, "step": 5}, {"rank": 1, "step": 4}, {"rank": 2, "step": 5}]
    assert hung_rank(records)["rank"] == 1
    assert hung_rank([{"rank": 3, "step": 7}, {"rank": 2, "step": 7}])["rank"] == 2
    assert hung_rank([]) is None


def test_check_interval_is_bounded():
    assert check_interval(6.0) == 1.0 and check_interval(60.0) == 10.0 and check_interval(3600.0) == 30.0


HUNG_WORKER = """
import sys, threading
from pathlib import Path
from hpcsweep.train.observe import worker_records
d = Path(sys.argv[1])
stream = worker_records.enable_stack_dumps(d, 0)
worker_records.write_progress(d, rank=1, local_rank=0, node="nodeA", step=5)
def stuck_in_a_collective():
    threading.Event().wait()
stuck_in_a_collective()
"""


def test_a_hung_worker_gets_its_stack_logged_and_is_killed(tmp_path, caplog):
    worker_dir = TrialFiles(tmp_path).worker_dir(0)
    worker_dir.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", HUNG_WORKER, str(worker_dir)])
    try:
        while not worker_records.progress_path(worker_dir, 0).exists():
            assert proc.poll() is None
            time.sleep(0.1)
        with caplog.at_level(logging.ERROR), HangWatchdog(worker_dir, timeout_s=2.0, node="nodeA") as watchdog:
            assert proc.wait(timeout=30) == -9
        assert watchdog.failure is not None
        assert (watchdog.failure.kind, watchdog.failure.rank, watchdog.failure.node) == (HANG, 1, "nodeA")
        assert "stuck_in_a_collective" in watchdog.failure.traceback
        assert "stuck_in_a_collective" in caplog.text and "trainer.hang_timeout_min" in caplog.text
    finally:
        proc.kill()


def test_a_zero_timeout_watches_nothing(tmp_path):
    with HangWatchdog(tmp_path, timeout_s=0, node="n") as watchdog:
        pass
    assert watchdog.failure is None
