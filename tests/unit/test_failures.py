"""One decision per failed run: every node reports, the root cause is chosen, one node records it and returns
the retry for the edge to carry out."""

from __future__ import annotations

import dataclasses
import json
import threading

from hpcsweep.control import exit_codes
from hpcsweep.files.atomic import atomic_write_json
from hpcsweep.files.metrics_file import read_metrics
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.slurm.env import slurm_job_env
from hpcsweep.trial import failures
from hpcsweep.trial.failure_class import COMMUNICATION, SIGNAL, Failure

DEFAULTS = {"max_steps": 20, "world_size": 4, "restarts": 0, "env": {}}


def job(restarts: int):
    return slurm_job_env({"SLURM_JOB_ID": "78", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "0",
                          "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NNODES": "2", "SLURM_RESTART_COUNT": str(restarts)})


def settle(trial_dir, node_rank, found, restarts=0, max_retries=1):
    return failures.settle_failure(
        trial_dir, found, node_rank=node_rank, nnodes=2, attempt=f"77_0.{restarts}", job=job(restarts),
        max_retries=max_retries, report_defaults=DEFAULTS,
    )


def test_the_crashed_rank_is_recorded_once_and_its_retry_left_to_the_edge(tmp_path):
    for rank in (0, 1):
        TrialFiles(tmp_path).worker_dir(rank).mkdir(parents=True)
    crash = Failure(SIGNAL, "node2", 3, -11, "Fatal Python error: Segmentation fault\n  File fault.py in _crash", 10.0)
    broken = Failure(COMMUNICATION, "node1", 0, 1, "RuntimeError: Connection closed by peer", 9.0)

    first = settle(tmp_path, 1, [crash])  # node 0 has not reported: waits REPORT_WAIT_S, then decides
    assert first.kind == "retry" and "retry 1 of 1, excluding node2" in first.message
    # Nothing reached Slurm: the outcome names the job and the node the edge requeues it off.
    assert (first.requeue_job, first.exclude_nodes) == ("77_0", ("node2",))
    assert exit_codes.exit_code(first) == exit_codes.EXIT_RETRY
    (record,) = read_metrics(tmp_path / "metrics.json")["failures"]
    assert (record["class"], record["node"], record["rank"], record["signal"], record["retried"]) == (
        "signal", "node2", 3, "SIGSEGV", True)
    assert "_crash" in record["traceback"] and record["job_id"] == "77_0"
    assert first.metrics["failures"] == [record]

    # Node 0's own report comes late: it follows the decision, requeues nothing, and leaves with 0 so that
    # srun's --kill-on-bad-exit cannot end node 1 before its edge has requeued the job.
    second = settle(tmp_path, 0, [broken])
    assert second.kind == "node_done" and second.requeue_job is None and exit_codes.exit_code(second) == 0
    assert len(read_metrics(tmp_path / "metrics.json")["failures"]) == 1

    # The retry crashes again: max_retries=1 is spent, the trial fails with the traceback in error.
    for rank in (0, 1):
        (TrialFiles(tmp_path).worker_dir(rank) / "failure.json").unlink()
    TrialFiles(tmp_path).worker_dir(0).joinpath("failure.json").write_text(
        json.dumps([{"kind": COMMUNICATION, "node": "node3", "rank": 0, "exit_code": 1, "traceback": "", "at": 1.0}])
    )
    final = settle(tmp_path, 1, [crash], restarts=1)
    assert final.kind == "failed" and "max_retries=1" in final.message and "_crash" in final.message
    assert final.requeue_job is None and final.exclude_nodes == ()
    metrics = read_metrics(tmp_path / "metrics.json")
    assert metrics["status"] == "failed" and [f["retried"] for f in metrics["failures"]] == [True, False]
    assert metrics["error"][0].startswith("signal failure of rank 3 on node2")

    # A node that follows a failed decision leaves non-zero, ending whatever still runs.
    follower = settle(tmp_path, 0, [broken], restarts=1)
    assert follower.kind == "failed" and exit_codes.exit_code(follower) == exit_codes.EXIT_FAILED


def test_a_node_that_saw_only_broken_collectives_waits_for_the_node_whose_worker_died(tmp_path, monkeypatch):
    """The crashed rank's node reports after the first wait (its agent stops its other workers first):
    the node that saw only "connection closed" waits on, and the signal is the root cause it records."""
    monkeypatch.setattr(failures, "REPORT_WAIT_S", 0.2)
    monkeypatch.setattr(failures, "SYMPTOM_WAIT_S", 20.0)
    for rank in (0, 1):
        TrialFiles(tmp_path).worker_dir(rank).mkdir(parents=True)
    crash = Failure(SIGNAL, "node2", 3, -11, "Fatal Python error: Segmentation fault", 10.0)
    broken = Failure(COMMUNICATION, "node1", 0, 1, "RuntimeError: Connection closed by peer", 9.0)
    late = threading.Timer(1.0, lambda: atomic_write_json(TrialFiles(tmp_path).worker_dir(1) / "failure.json",
                                                          [dataclasses.asdict(crash)]))
    late.start()
    try:
        first = settle(tmp_path, 0, [broken])
    finally:
        late.join()
    assert first.kind == "retry" and "signal failure of rank 3 on node2" in first.message
    assert first.exclude_nodes == ("node2",)
