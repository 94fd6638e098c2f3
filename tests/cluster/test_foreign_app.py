"""A Hydra app that is not hpcsweep sweeps through ``hydra/launcher=hpcsweep_slurm`` with ``wait=true`` (issue #12).

The app (``tests/foreign_app``) and hpcsweep are installed with a plain ``pip install`` into a fresh
venv. Its jobs run as Slurm array tasks on the local cluster, and Hydra gets back the JobReturns
it gets from its basic launcher: the values, the overrides, the dirs numbered as Hydra numbers them.
"""

from __future__ import annotations

import json

import pytest

from ..foreign_sweeps import (
    SWEEPS,
    assert_hydra_job_returns,
    assert_sweep_record,
    comparable,
    install_foreign_app,
    run_foreign_sweep,
)
from .conftest import TERMINAL_STATES, sacct_states, slurm, wait_for


# The launcher's own defaults otherwise: a foreign app selects hpcsweep_slurm directly.
def ended_states(env: dict[str, str], job: str, job_ids: list[str]) -> dict[str, str]:
    """The accounting states of ``job_ids`` (of ``job``) once all are terminal.

    Accounting learns of a task's end a moment after the task has written its result.
    """
    def ended():
        states = sacct_states(env, job)
        return {j: states[j] for j in job_ids} if all(states.get(j) in TERMINAL_STATES for j in job_ids) else None

    return wait_for(ended, timeout=60, what=f"accounting to show the tasks of {job} ended")


SLURM_WAIT = ["hydra/launcher=hpcsweep_slurm", "hydra.launcher.wait=true", "hydra.launcher.timeout_min=10"]


@pytest.fixture(scope="module")
def foreign_python(tmp_path_factory):
    return install_foreign_app(tmp_path_factory.mktemp("foreign-app"))


@pytest.mark.parametrize("sweep", sorted(SWEEPS))
def test_foreign_app_sweeps_on_slurm_with_hydras_job_returns(foreign_python, tmp_path, slurm_env, sweep):
    overrides, expected = SWEEPS[sweep]
    reference_dir, slurm_dir = tmp_path / "basic", tmp_path / "hpcsweep-slurm"
    proc, reference = run_foreign_sweep(foreign_python, tmp_path, reference_dir, [*overrides, "hydra/launcher=basic"])
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # wait=true: the sweep returns once every array task has ended, or the timeout fails the test.
    proc, returns = run_foreign_sweep(foreign_python, tmp_path, slurm_dir, [*overrides, *SLURM_WAIT],
                                      env=slurm_env, timeout=500)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_hydra_job_returns(returns, slurm_dir, expected)
    assert comparable(returns, slurm_dir) == comparable(reference, reference_dir)
    record = assert_sweep_record(slurm_dir, "slurm", expected)
    # One allocation shape: one array, whose tasks ran the jobs and ended COMPLETED.
    (array,) = record["arrays"]
    assert array["trials"] == [num for num, _, _ in expected]
    job_ids = [t["job_id"] for t in record["trials"]]
    assert [json.loads((slurm_dir / str(num) / "job_end.json").read_text())["slurm_job"] for num, _, _ in expected] \
        == job_ids
    assert ended_states(slurm_env, array["array_job_id"], job_ids) == {job_id: "COMPLETED" for job_id in job_ids}


def test_a_foreign_job_past_its_time_limit_is_requeued_and_runs_again_in_its_dir(foreign_python, tmp_path, slurm_env):
    # No hook: submitit's own USR2 handler requeues the task, which runs the task function again
    # with the same overrides in the same numbered dir; the app's marker there makes it return.
    sweep_dir = tmp_path / "requeued"
    overrides = ["db=mysql", "work_s=600"]
    time_limit = ["hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=40"]
    proc, returns = run_foreign_sweep(foreign_python, tmp_path, sweep_dir, [*overrides, *SLURM_WAIT, *time_limit],
                                      env=slurm_env, timeout=500)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_hydra_job_returns(returns, sweep_dir, [(0, overrides, "mysql:80")])
    assert (sweep_dir / "0" / "starts.txt").read_text() == "start\nstart\n"
    (trial,) = assert_sweep_record(sweep_dir, "slurm", [(0, overrides, "mysql:80")])["trials"]
    assert ended_states(slurm_env, trial["job_id"], [trial["job_id"]]) == {trial["job_id"]: "COMPLETED"}
    # --duplicates: every run of the task, the requeued one too.
    runs = slurm(slurm_env, "sacct", "-X", "--duplicates", "--noheader", "--parsable2", "-j", trial["job_id"],
                 "--format=State")
    assert runs.split() == ["REQUEUED", "COMPLETED"]
