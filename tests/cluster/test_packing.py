"""trials_per_task on the real local cluster: 8 trials as 2 array tasks of 4, one task stopped mid-trial.

Every trial must end with the weights of an unpacked run of its config: a single run of each
learning rate in its own process, locally. Each learning rate appears twice (``trainer.log_every``
1 and 2, which does not touch the weights), at different places of the packs.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
from pathlib import Path

from .conftest import (
    SMALL_TRIAL,
    STOPPABLE_TRIAL,
    only_sweep_dir,
    read_json,
    run_hpcsweep,
    sacct_states,
    usr2_at_step,
    wait_for,
    wait_until_ended,
)

LRS = ["1e-3", "2e-3", "3e-3", "4e-3"]
TRAINING = [o for o in STOPPABLE_TRIAL if not o.startswith(("hydra.", "trainer.log_every"))]
# A requeued job may start only once its old credential is older than the new one (in whole seconds).
REQUEUE_START_DELAY_S = 3


def unpacked_references(tmp_path: Path, env: dict[str, str]) -> tuple[threading.Thread, dict[float, str]]:
    """Start one single run per learning rate, one after another, each in its own process."""
    local_env = {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    hashes: dict[float, str] = {}

    def run_all() -> None:
        for lr in LRS:
            run_dir = tmp_path / "reference" / lr
            subprocess.run([sys.executable, "-m", "hpcsweep", f"hydra.run.dir={run_dir}", *TRAINING, f"model.lr={lr}"],
                           cwd=tmp_path, env=local_env, capture_output=True, timeout=300, check=True)
            hashes[float(lr)] = read_json(run_dir / "metrics.json")["weights_sha256"]

    thread = threading.Thread(target=run_all, name="unpacked-references")
    thread.start()
    return thread, hashes


def start_requeued_soon(env: dict[str, str], job_id: str) -> None:
    """A requeued task waits ~20 s (cred_expire) before it may start: move its StartTime closer."""
    out = subprocess.run(["squeue", "--noheader", "--array", "--jobs", job_id, "--format=%T|%S"],
                         env=env, capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    state, _, start = out.partition("|")
    try:
        late = datetime.datetime.fromisoformat(start) > datetime.datetime.now() + datetime.timedelta(
            seconds=REQUEUE_START_DELAY_S + 2)
    except ValueError:
        late = False
    if state == "PENDING" and late:
        subprocess.run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{REQUEUE_START_DELAY_S}"],
                       env=env, capture_output=True, timeout=30, check=False)


def test_eight_trials_packed_four_per_task_survive_a_stop_with_unpacked_weights(tmp_path, slurm_env):
    result = run_hpcsweep(
        ["-m", f"model.lr={','.join(LRS)}", "trainer.log_every=1,2", *TRAINING,
         "hydra.launcher.timeout_min=15", "hydra.launcher.trials_per_task=4"],
        tmp_path, slurm_env, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    references, hashes = unpacked_references(tmp_path, slurm_env)
    sweep_dir = only_sweep_dir(tmp_path)
    sweep = read_json(sweep_dir / "sweep.json")
    (array,) = sweep["arrays"]
    array_id = array["array_job_id"]
    assert (array["trials"], array["trials_per_task"]) == (list(range(8)), 4)
    trials = sweep["trials"]
    assert [t["job_id"] for t in trials] == [f"{array_id}_0"] * 4 + [f"{array_id}_1"] * 4

    # Stop task 0 in its second trial; its first has ended by then.
    stopped = Path(trials[1]["trial_dir"])
    usr2_at_step(slurm_env, f"{array_id}_0", stopped, 3, timeout=120)

    def all_ended():
        start_requeued_soon(slurm_env, f"{array_id}_0")
        ends = [read_json(Path(t["trial_dir"]) / "metrics.json") if (Path(t["trial_dir"]) / "metrics.json").exists()
                else {} for t in trials]
        return ends if all(m.get("status") in ("completed", "failed") for m in ends) else None

    ends = wait_for(all_ended, timeout=240, what="all 8 packed trials to end", interval=1.0)
    assert [m["status"] for m in ends] == ["completed"] * 8, [m.get("error") for m in ends]
    assert ends[1]["last_stop_reason"] == "time_limit" and ends[1]["restarts"] >= 1
    assert ends[0]["restarts"] == 0, "the trial that ended before the stop was trained again"
    assert wait_until_ended(slurm_env, f"{array_id}_0", timeout=60) == "COMPLETED"
    assert wait_until_ended(slurm_env, f"{array_id}_1", timeout=60) == "COMPLETED"

    references.join(timeout=240)
    assert sorted(hashes) == [float(lr) for lr in LRS], "the unpacked reference runs did not all finish"
    lr_of = [float(next(o.split("=")[1] for o in t["overrides"] if o.startswith("model.lr="))) for t in trials]
    assert [m["weights_sha256"] for m in ends] == [hashes[lr] for lr in lr_of]

    status = subprocess.run([sys.executable, "-m", "hpcsweep.status", str(sweep_dir)], env=slurm_env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert status.returncode == 0 and "8 trials, 8 completed" in status.stdout, status.stdout + status.stderr


def test_packed_trials_each_run_with_their_own_nccl_preset(tmp_path, slurm_env):
    """Two trials in one array task, one after another in one process: the second must not inherit the
    first's NCCL variables (ethernet's NCCL_IB_DISABLE=1 would outrank a100_ib's own 0)."""
    result = run_hpcsweep(
        ["-m", "nccl=ethernet,a100_ib", "hydra.launcher.trials_per_task=2", *SMALL_TRIAL],
        tmp_path, slurm_env, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    sweep = read_json(only_sweep_dir(tmp_path) / "sweep.json")
    (array,) = sweep["arrays"]
    task = sweep["trials"][0]["job_id"]  # one task: a job of its own, or task 0 of an array of one
    assert [t["job_id"] for t in sweep["trials"]] == [task, task]
    assert wait_until_ended(slurm_env, task, timeout=300) == "COMPLETED"
    assert set(sacct_states(slurm_env, str(array["array_job_id"]))) == {task}, "the two trials ran in other tasks"

    records = [read_json(Path(t["trial_dir"]) / "environment.json") for t in sweep["trials"]]
    assert [record["nccl_preset"] for record in records] == ["ethernet", "a100_ib"]
    ethernet, a100_ib = (record["nccl"] for record in records)
    assert (ethernet["NCCL_IB_DISABLE"], ethernet["NCCL_SOCKET_NTHREADS"]) == ("1", "4")
    assert (a100_ib["NCCL_IB_DISABLE"], a100_ib["NCCL_CROSS_NIC"]) == ("0", "0"), a100_ib
