"""A trial's one status from metrics.json and Slurm: cancelled and stopped trials are not failures."""

from __future__ import annotations

import pytest

from hpcsweep.results.table import load_sweep, trial_status
from hpcsweep.slurm.job_states import JobState, parse_sacct

from .sweep_fixtures import make_sweep, metrics


@pytest.mark.parametrize(
    ("metrics_status", "sacct_state", "on_slurm", "expected"),
    [
        ("running", "CANCELLED by 1000", True, "cancelled"),  # scancel while it ran
        (None, "CANCELLED by 0", True, "cancelled"),  # an admin cancelled it while it pended
        ("failed", "CANCELLED by 1000", True, "cancelled"),  # whatever the dying workers wrote
        ("completed", "CANCELLED by 1000", True, "completed"),  # finished before the cancel
        ("cancelled", None, False, "cancelled"),  # a local trial metrics.json marks cancelled
        ("stopped", None, False, "stopped"),  # Ctrl-C on a local trial
        ("stopped", None, True, "stopped"),  # accounting unreachable: metrics.json says it
        ("stopped", "PENDING", True, "pending"),  # requeued after its checkpoint
        ("stopped", "RUNNING", True, "running"),  # resumed
        ("stopped", "COMPLETED", True, "stopped"),  # the job ended after the checkpoint
        ("running", "FAILED", True, "failed"),
        ("running", "NODE_FAIL", True, "failed"),
        (None, "COMPLETED", True, "failed"),  # ended without ever reporting
    ],
)
def test_trial_status(metrics_status, sacct_state, on_slurm, expected):
    job = parse_sacct(f"9_0|{sacct_state}|0||None assigned\n")["9_0"] if sacct_state else None
    assert trial_status(metrics_status, job, on_slurm) == expected


def test_rows_carry_cancelled_status_and_pending_reasons(tmp_path):
    make_sweep(
        tmp_path,
        [
            (["model.lr=1e-4"], metrics("running", step=4)),
            (["model.lr=1e-3"], None),
            (["model.lr=3e-3"], metrics("running", step=2)),
        ],
        launcher="slurm",
    )
    jobs = {
        "41_0": JobState("41_0", "CANCELLED", 60, 8, "node1"),
        "41_1": JobState("41_1", "PENDING", reason="PartitionTimeLimit", never_starts="too long"),
        "41_2": JobState("41_2", "RUNNING", 60, 8, "node2", reason="stale"),
    }
    rows = load_sweep(tmp_path, query=lambda ids: jobs).rows
    assert [(r.status, r.error) for r in rows] == [("cancelled", ""), ("pending", ""), ("running", "")]
    assert (rows[1].reason, rows[1].never_starts) == ("PartitionTimeLimit", "too long")
    assert (rows[2].reason, rows[2].never_starts) == ("", "")  # only a pending trial shows why it waits
