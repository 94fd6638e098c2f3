"""Job arrays on the real local cluster: one array per sweep, throttled, split when too large."""

from __future__ import annotations

import subprocess

from .conftest import SMALL_TRIAL, read_json, run_hpcsweep, sacct_states, wait_for

TINY = [*SMALL_TRIAL, "trainer.max_steps=2", "trainer.eval_every=2", "trainer.ckpt_every=2"]


def running_tasks(env, array_id: str) -> list[str]:
    out = subprocess.run(
        ["squeue", "--noheader", "--array", "--jobs", array_id, "--states=RUNNING", "--format=%i"],
        env=env, capture_output=True, text=True, check=True, timeout=30,
    ).stdout
    return out.split()


def test_eight_trials_are_one_array_with_at_most_two_running(tmp_path, slurm_env):
    lrs = ",".join(f"{(i + 1) * 1e-4:g}" for i in range(8))
    result = run_hpcsweep(["-m", f"model.lr={lrs}", *TINY, "hydra.launcher.array_parallelism=2"], tmp_path, slurm_env)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))
    (array,) = sweep["arrays"]
    array_id = array["array_job_id"]
    assert [t["job_id"] for t in sweep["trials"]] == [f"{array_id}_{i}" for i in range(8)]

    most_running = 0

    def all_done():
        nonlocal most_running
        most_running = max(most_running, len(running_tasks(slurm_env, array_id)))
        states = sacct_states(slurm_env, array_id)
        finished = [s for s in states.values() if s not in ("PENDING", "RUNNING", "REQUEUED")]
        return states if len(states) == 8 and len(finished) == 8 else None

    states = wait_for(all_done, timeout=600, what=f"all 8 tasks of array {array_id}", interval=0.2)
    assert states == {f"{array_id}_{i}": "COMPLETED" for i in range(8)}
    assert 1 <= most_running <= 2, most_running
    assert most_running == 2, "the throttle was never reached: the test did not observe parallel tasks"


def test_sweeps_larger_than_the_array_limit_become_several_arrays(tmp_path, slurm_env):
    result = run_hpcsweep(
        ["-m", "model.lr=1e-4,2e-4,3e-4", *TINY, "hydra.launcher.max_array_size=2"], tmp_path, slurm_env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    sweep = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))
    assert [a["trials"] for a in sweep["arrays"]] == [[0, 1], [2]]
    first, second = (a["array_job_id"] for a in sweep["arrays"])
    assert [t["job_id"] for t in sweep["trials"]] == [f"{first}_0", f"{first}_1", second]

    def finished():
        states = {**sacct_states(slurm_env, first), **sacct_states(slurm_env, second)}
        return states if len(states) == 3 and all(s == "COMPLETED" for s in states.values()) else None

    wait_for(finished, timeout=400, what="both arrays to complete")
