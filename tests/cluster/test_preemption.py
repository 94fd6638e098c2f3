"""Stops on the real local cluster: a USR2 by scancel, a real preemption, a requeue cap, a node
taken down. Every trial that finishes must end with the weights of an
uninterrupted run of the same config, computed locally (same world size, no Slurm)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import (
    SMALL_TRIAL,
    read_json,
    run_hpcsweep,
    sacct_states,
    slurm,
    wait_for,
)

FAST = [o for o in SMALL_TRIAL if not o.startswith("trainer.max_steps")] + [
    "trainer.max_steps=20", "trainer.ckpt_every=10", "trainer.eval_every=10", "trainer.log_every=1",
    "topology.mode=off",
]
TRAINING = [o for o in FAST if not o.startswith("hydra.")]


def submit(tmp_path: Path, env: dict[str, str], *overrides: str) -> tuple[str, Path]:
    """Submit a one-trial sweep; return its job id (``ARRAY_TASK``) and trial dir."""
    result = run_hpcsweep(["-m", *FAST, *overrides], tmp_path, env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    (trial,) = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))["trials"]
    return trial["job_id"], tmp_path / trial["trial_dir"]


class Reference:
    """The same training run uninterrupted, locally on one node, started in the background."""

    def __init__(self, tmp_path: Path, env: dict[str, str], world_size: int, *overrides: str) -> None:
        local_env = {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        self.run_dir = tmp_path / "reference"
        args = [f"hydra.run.dir={self.run_dir}", *TRAINING, f"trainer.nproc_per_node={world_size}",
                *[o for o in overrides if not o.startswith(("hydra.", "+hydra.", "trainer.nodes", "trainer.nproc"))]]
        self.proc = subprocess.Popen([sys.executable, "-m", "hpcsweep", *args], cwd=tmp_path, env=local_env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def weights_sha256(self, timeout: float = 300) -> str:
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, out[-3000:]
        return read_json(self.run_dir / "metrics.json")["weights_sha256"]


class ClusterReference:
    """The same multi-node trial uninterrupted on the cluster, laid out over nodes as the test's.

    With two ranks a gradient sum is one addition, the same in any layout, so a local run serves;
    from three ranks up the cluster run is the reference that makes no assumption about how the
    ranks' order depends on the layout."""

    def __init__(self, tmp_path: Path, env: dict[str, str], *overrides: str) -> None:
        cwd = tmp_path / "reference"
        cwd.mkdir()
        self.env = env
        self.job_id, self.trial_dir = submit(cwd, env, *overrides)

    def kill(self) -> None:
        subprocess.run(["scancel", self.job_id], env=self.env, capture_output=True, timeout=30, check=False)

    def weights_sha256(self) -> str:
        metrics = wait_until_final(self.env, self.job_id, self.trial_dir)
        assert metrics["status"] == "completed", metrics.get("error")
        return metrics["weights_sha256"]


@pytest.fixture
def reference(tmp_path, slurm_env):
    """Start the uninterrupted reference run; killed at teardown if the test did not wait for it."""
    started: list[Reference | ClusterReference] = []

    def start(world_size: int, *overrides: str) -> Reference | ClusterReference:
        if world_size > 2 and any(o.startswith("trainer.nodes=") and o != "trainer.nodes=1" for o in overrides):
            started.append(ClusterReference(tmp_path, slurm_env, *overrides))
        else:
            started.append(Reference(tmp_path, slurm_env, world_size, *overrides))
        return started[-1]

    yield start
    for ref in started:
        ref.kill()


def step_of(trial_dir: Path) -> int:
    try:
        return read_json(trial_dir / "metrics.json")["step"]
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def queued(env: dict[str, str], job_id: str) -> str:
    """The job's squeue state (``PENDING``, ``RUNNING``...), or "" once it has left the queue."""
    out = subprocess.run(["squeue", "--noheader", "--array", "--jobs", job_id, "--format=%T"],
                         env=env, capture_output=True, text=True, timeout=30, check=False)
    return out.stdout.strip()


def wait_until_final(env: dict[str, str], job_id: str, trial_dir: Path, timeout: float = 300) -> dict:
    """Wait until the trial has ended and its job has left the queue; start a requeued job at once.

    A requeued job waits ~20 s (the cluster's cred_expire) before it may start: moving its
    StartTime to now only shortens the test.
    """
    def final():
        state = queued(env, job_id)
        if state == "PENDING":
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
                           env=env, capture_output=True, timeout=30, check=False)
        metrics = read_json(trial_dir / "metrics.json") if (trial_dir / "metrics.json").exists() else {}
        return metrics if not state and metrics.get("status") in ("completed", "failed") else None

    return wait_for(final, timeout=timeout, what=f"job {job_id} to end and leave the queue", interval=1.0)


def final_state(env: dict[str, str], job_id: str) -> str:
    return wait_for(lambda: sacct_states(env, job_id).get(job_id) in ("COMPLETED", "FAILED")
                    and sacct_states(env, job_id)[job_id], timeout=60, what=f"accounting of {job_id}")


def test_scancel_usr2_to_a_two_node_trial_checkpoints_requeues_and_resumes(tmp_path, slurm_env, reference):
    shape = ["trainer.nodes=2", "trainer.nproc_per_node=2", "hydra.launcher.cpus_per_task=2"]
    job_id, trial_dir = submit(tmp_path, slurm_env, *shape)
    expected = reference(4, *shape)
    wait_for(lambda: step_of(trial_dir) >= 3, timeout=240, what="the trial to reach step 3")
    slurm(slurm_env, "scancel", "--signal=USR2", job_id)

    metrics = wait_until_final(slurm_env, job_id, trial_dir)
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["last_stop_reason"] == "time_limit"
    assert metrics["restarts"] >= 1 and metrics["slurm_restart_count"] >= 1
    assert metrics["stop_to_exit_s"] < 30
    assert metrics["weights_sha256"] == expected.weights_sha256()
    assert final_state(slurm_env, job_id) == "COMPLETED"


@pytest.fixture
def node4_freed(slurm_env):
    """Cancel whatever the test left on node4's urgent partition."""
    yield
    slurm(slurm_env, "scancel", "--partition=urgent", "--nodelist=node4")


def preempt_node4(env: dict[str, str]) -> None:
    """A job in the high-priority partition that needs all of node4."""
    slurm(env, "sbatch", "--parsable", "-p", "urgent", "-w", "node4", "-c", "8", "--time=2",
          "--output=/dev/null", "--wrap", "sleep 5")


def test_a_preempted_trial_is_requeued_by_slurm_and_resumes(tmp_path, slurm_env, node4_freed, reference):
    job_id, trial_dir = submit(tmp_path, slurm_env, "trainer.max_steps=60", "+hydra.launcher.additional_parameters.nodelist=node4")
    expected = reference(1, "trainer.max_steps=60")
    wait_for(lambda: step_of(trial_dir) >= 3, timeout=240, what="the trial to reach step 3")
    preempt_node4(slurm_env)

    metrics = wait_until_final(slurm_env, job_id, trial_dir)
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["last_stop_reason"] == "preempted"
    assert metrics["restarts"] >= 1
    assert metrics["weights_sha256"] == expected.weights_sha256()
    assert final_state(slurm_env, job_id) == "COMPLETED"


def test_a_trial_preempted_beyond_its_cap_fails_and_leaves_the_queue(tmp_path, slurm_env, node4_freed):
    job_id, trial_dir = submit(tmp_path, slurm_env, "trainer.max_steps=60", "hydra.launcher.max_num_timeout=0",
                               "+hydra.launcher.additional_parameters.nodelist=node4")
    wait_for(lambda: step_of(trial_dir) >= 3, timeout=240, what="the trial to reach step 3")
    preempt_node4(slurm_env)

    metrics = wait_until_final(slurm_env, job_id, trial_dir)
    assert metrics["status"] == "failed"
    assert "max_num_timeout=0" in metrics["error"]
    assert final_state(slurm_env, job_id) == "FAILED"


@pytest.fixture
def node_restorer(slurm_env):
    """Return every node a test takes out to service."""
    downed: list[str] = []
    yield downed
    for node in downed:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                       env=slurm_env, capture_output=True, timeout=30, check=False)
    wait_for(lambda: all("DRAIN" not in slurm(slurm_env, "scontrol", "show", "node", node) for node in downed),
             timeout=60, what=f"{downed} back in service")


def test_a_trial_whose_node_fails_comes_back_elsewhere_and_resumes(tmp_path, slurm_env, node_restorer, reference):
    shape = ["trainer.nodes=2", "trainer.nproc_per_node=1", "hydra.launcher.cpus_per_task=1"]
    job_id, trial_dir = submit(tmp_path, slurm_env, *shape)
    expected = reference(2, *shape)
    wait_for(lambda: step_of(trial_dir) >= 3, timeout=240, what="the trial to reach step 3")
    first_nodes = read_json(trial_dir / "metrics.json")["nodes"]
    victim = first_nodes[-1]
    node_restorer.append(victim)
    # The node fails: Slurm kills the job's processes on every node and requeues it (--requeue).
    # On this one-host cluster the "dead" node's slurmd would re-register at once
    # (ReturnToService=2), so it is also drained: the requeued trial must run elsewhere.
    slurm(slurm_env, "scontrol", "update", f"NodeName={victim}", "State=DOWN", "Reason=hpcsweep-test")
    slurm(slurm_env, "scontrol", "update", f"NodeName={victim}", "State=DRAIN", "Reason=hpcsweep-test")

    metrics = wait_until_final(slurm_env, job_id, trial_dir)
    assert metrics["status"] == "completed", metrics.get("error")
    assert victim not in metrics["nodes"]
    assert metrics["restarts"] >= 1
    assert metrics["weights_sha256"] == expected.weights_sha256()
