"""A retry's launcher overrides apply to that retry only, on the real local cluster.

A two-trial sweep runs in the default partition (``batch``). A retry of trial 0 with
``hydra.launcher.partition=urgent`` says so on its first line and runs in ``urgent``; the next
retry names no partition and runs in ``batch`` again. ``sacct`` is the judge of where each ran, and
``sweep.json`` records each array's settings. The budget is the exception: it is the whole sweep's,
so the one the first retry sets holds for the second.
"""

from __future__ import annotations

import subprocess
import sys

from .conftest import SMALL_TRIAL, only_sweep_dir, read_json, run_hpcsweep, slurm, wait_for, wait_until_ended


def retry(sweep_dir, args: list[str], cwd, env) -> subprocess.CompletedProcess[str]:
    """The retry command, its stderr merged into its stdout in the order it was written."""
    return subprocess.run([sys.executable, "-m", "hpcsweep.retry", str(sweep_dir), *args], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def partition_of(env, job_id: str) -> str:
    """The partition accounting says the job ran in. Right after the job ended accounting has been seen
    to answer nothing for it (a CI run under load), so it is asked again until it names one."""
    def answer() -> str | None:
        out = slurm(env, "sacct", "-X", "--noheader", "--parsable2", "-j", job_id, "--format=Partition").split()
        return out[-1] if out else None

    return wait_for(answer, timeout=60, what=f"accounting to name job {job_id}'s partition")


def test_a_retry_partition_applies_to_that_retry_only(tmp_path, slurm_env):
    result = run_hpcsweep(["-m", "model.lr=1e-3,2e-3", *SMALL_TRIAL, "topology.mode=off",
                           "hydra.launcher.budget_gpu_hours=50"], tmp_path, slurm_env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = only_sweep_dir(tmp_path)
    first = read_json(sweep_dir / "sweep.json")
    for trial in first["trials"]:
        assert wait_until_ended(slurm_env, trial["job_id"]) == "COMPLETED"
        assert partition_of(slurm_env, trial["job_id"]) == "batch"

    urgent = retry(sweep_dir, ["--trials", "0", "hydra.launcher.partition=urgent", "hydra.launcher.budget_gpu_hours=60"],
                   tmp_path, slurm_env)
    assert urgent.returncode == 0, urgent.stdout
    # Among the first lines, beside the retry's memory plan line.
    assert (
        "this retry runs in partition urgent, where the sweep ran in the cluster's default partition: "
        "hydra.launcher.partition=urgent applies to this retry only") in urgent.stdout.splitlines()[:3]
    assert "retrying 1 trial(s) 0 in " in urgent.stdout and "(attempt 2)" in urgent.stdout
    record = read_json(sweep_dir / "sweep.json")
    assert record["budget_gpu_hours"] == 60  # the budget is the whole sweep's
    urgent_job = next(t for t in record["trials"] if t["num"] == 0)["job_id"]
    assert wait_until_ended(slurm_env, urgent_job) == "COMPLETED"
    assert partition_of(slurm_env, urgent_job) == "urgent"

    plain = retry(sweep_dir, ["--trials", "0,1"], tmp_path, slurm_env)
    assert plain.returncode == 0, plain.stdout
    assert any(line.startswith("retrying 2 trial(s) 0,1 in ") for line in plain.stdout.splitlines()), plain.stdout
    assert "this retry runs in" not in plain.stdout
    assert "(attempt 2: 1; attempt 3: 0)" in plain.stdout
    record = read_json(sweep_dir / "sweep.json")
    for trial in record["trials"]:
        assert wait_until_ended(slurm_env, trial["job_id"]) == "COMPLETED"
        assert partition_of(slurm_env, trial["job_id"]) == "batch", trial
    # The budget a retry set stays the sweep's (its running tasks read it); a retry without one keeps it.
    assert record["budget_gpu_hours"] == 60
    # Each attempt's settings: the sweep's own, the urgent retry's, then the sweep's own again.
    assert [array["launcher"]["partition"] for array in record["arrays"]] == [None, "urgent", None]
    assert record["arrays"][0]["launcher"]["timeout_min"] == record["arrays"][2]["launcher"]["timeout_min"] == 15
