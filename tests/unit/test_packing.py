"""trials_per_task: one array task runs several trials; sweep.json, status and the task's loop."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hydra.core.utils import JobReturn, JobStatus

from hpcsweep.files.sweep_record import (
    ArrayRecord,
    read_sweep_record,
    write_sweep_record,
)
from hpcsweep.results.table import PACKED_WAIT_REASON, load_sweep
from hpcsweep.slurm.job_states import JobState
from hpcsweep.sweep.shared_call import TaskTrial
from hpcsweep.sweep.slurm_submit import trials_per_task
from hydra_plugins.hpcsweep_plugins.launchers import SlurmLauncher

from .sweep_fixtures import make_sweep, metrics


@pytest.mark.parametrize("value", [0, -1, 1.5, "4", True])
def test_trials_per_task_must_be_a_whole_number(value):
    with pytest.raises(ValueError, match=r"hydra.launcher.trials_per_task=.* is not allowed: a whole number >= 1"):
        trials_per_task({"trials_per_task": value})
    assert trials_per_task({}) == 1 and trials_per_task({"trials_per_task": 4}) == 4


def packed_sweep(sweep_dir, trial_metrics):
    """Four trials packed two per task of array 41: tasks 41_0 (trials 0, 1) and 41_1 (trials 2, 3)."""
    record = make_sweep(sweep_dir, [([f"model.lr={i}e-4"], m) for i, m in enumerate(trial_metrics)], launcher="slurm")
    trials = [replace(t, job_id=f"41_{t.num // 2}") for t in record.trials]
    write_sweep_record(replace(record, trials=trials, arrays=[ArrayRecord("41", [0, 1, 2, 3], 2)]))


def test_status_shows_each_packed_trial(tmp_path):
    packed_sweep(tmp_path, [metrics("running", step=4), None, None, None])
    jobs = {"41_0": JobState("41_0", "RUNNING", 3600, 8, "node1", used_hours=8.0, units=8),
            "41_1": JobState("41_1", "PENDING", reason="Priority")}
    rows = load_sweep(tmp_path, query=lambda ids: jobs, with_scalars=False).rows
    assert [r.status for r in rows] == ["running", "pending", "pending", "pending"]
    assert [r.reason for r in rows[1:]] == [PACKED_WAIT_REASON, "Priority", "Priority"]
    # The task's 8 allocated GPU-hours are all the running trial's: the others have not run on it yet.
    assert [r.gpu_hours for r in rows] == [8.0, 0.0, 0.0, 0.0]
    assert rows[0].own_gpu_hours == 2.0 and rows[1].own_gpu_hours is None  # 1 h wall x 2 workers
    assert read_sweep_record(tmp_path).arrays == [ArrayRecord("41", [0, 1, 2, 3], 2)]


def test_a_packed_task_that_ended_shows_each_trials_own_end(tmp_path):
    packed_sweep(tmp_path, [metrics("completed"), metrics("failed", error="boom"), metrics("completed"), None])
    jobs = {"41_0": JobState("41_0", "FAILED", 60, 8, "node1", used_hours=6.0, units=8),
            "41_1": JobState("41_1", "CANCELLED", 60, 8, "node2", used_hours=3.0, units=8)}
    sweep = load_sweep(tmp_path, query=lambda ids: jobs, with_scalars=False)
    rows = sweep.rows
    assert [r.status for r in rows] == ["completed", "failed", "completed", "cancelled"]
    # Each task's hours shared by its trials' own shares (trials 0 and 1 ran as long); trial 3 never ran.
    assert [r.gpu_hours for r in rows] == [3.0, 3.0, 3.0, 0.0]
    assert sum(r.gpu_hours for r in rows) == sweep.usage.spent_hours == 9.0


class RecordingLauncher(SlurmLauncher):
    """``run_trials`` with each trial's Hydra run replaced by a recorded outcome."""

    def __init__(self, outcomes):
        super().__init__()
        self.task_function, self.params, self.outcomes, self.calls = None, {}, outcomes, []

    def __call__(self, sweep_overrides, job_dir_key, job_num, job_id, singleton_state, checked=None):
        self.calls.append((sweep_overrides, job_num, checked))
        value = self.outcomes[job_num]
        status = JobStatus.FAILED if isinstance(value, Exception) else JobStatus.COMPLETED
        return JobReturn(overrides=sweep_overrides, status=status, _return_value=value)


def test_a_task_runs_its_trials_in_order_and_raises_the_first_failure_last():
    launcher = RecordingLauncher({3: "ok", 4: RuntimeError("trial 4 broke"), 5: "ok"})
    with pytest.raises(RuntimeError, match="trial 4 broke"):
        launcher.run_trials([TaskTrial(["a=1"], 3, "c3"), TaskTrial(["a=2"], 4, "c4"), TaskTrial(["a=3"], 5)],
                            singleton_state={})
    # Each trial with the config the login node checked for it.
    assert launcher.calls == [(["a=1"], 3, "c3"), (["a=2"], 4, "c4"), (["a=3"], 5, None)]
    returns = RecordingLauncher({7: "ok"}).run_trials([TaskTrial(["a=1"], 7)], singleton_state={})
    assert list(returns) == [7] and returns[7].return_value == "ok"
