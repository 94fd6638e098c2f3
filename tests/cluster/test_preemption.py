"""Stops on the real local cluster: Slurm's time-limit warning, a USR2 by scancel (to a sweep
trial and to the batch shell of ``slurm/train.sbatch``), a real preemption, a requeue cap, a node
taken down. Every trial that finishes must end with the weights of an uninterrupted run of the
same config: computed locally (same world size, no Slurm) up to two ranks, where a gradient sum is
one addition in any layout; for the 2-node x 2-process trial, the session's ``two_node_trial``."""

from __future__ import annotations

import datetime
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import (
    REPO,
    STOPPABLE_TRIAL,
    TWO_NODES_TWO_PROCESSES,
    _continue_all,
    held_at_step,
    metrics_step,
    proc_status,
    read_json,
    run_hpcsweep,
    slurm,
    usr2_at_step,
    wait_for,
    wait_until_ended,
)

TRAINING = [o for o in STOPPABLE_TRIAL if not o.startswith("hydra.")]


def submit(tmp_path: Path, env: dict[str, str], *overrides: str) -> tuple[str, Path]:
    """Submit a one-trial sweep; return its job id (``ARRAY_TASK``) and trial dir."""
    result = run_hpcsweep(["-m", *STOPPABLE_TRIAL, *overrides], tmp_path, env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    (trial,) = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))["trials"]
    return trial["job_id"], tmp_path / trial["trial_dir"]


def outside_any_job(env: dict[str, str]) -> dict[str, str]:
    """``env`` without a Slurm job's variables: a run that trains here, on its own."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


class Reference:
    """The same training run uninterrupted, locally on one node, started in the background."""

    def __init__(self, tmp_path: Path, env: dict[str, str], world_size: int, *overrides: str) -> None:
        self.run_dir = tmp_path / "reference"
        args = [f"hydra.run.dir={self.run_dir}", *TRAINING, f"trainer.nproc_per_node={world_size}",
                *[o for o in overrides if not o.startswith(("hydra.", "+hydra.", "trainer.nodes", "trainer.nproc"))]]
        self.proc = subprocess.Popen([sys.executable, "-m", "hpcsweep", *args], cwd=tmp_path,
                                     env=outside_any_job(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def weights_sha256(self, timeout: float = 300) -> str:
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, out[-3000:]
        return read_json(self.run_dir / "metrics.json")["weights_sha256"]


@pytest.fixture
def reference(tmp_path, slurm_env):
    """Start the uninterrupted reference run; killed at teardown if the test did not wait for it."""
    started: list[Reference] = []

    def start(world_size: int, *overrides: str, env: dict[str, str] = slurm_env) -> Reference:
        started.append(Reference(tmp_path, env, world_size, *overrides))
        return started[-1]

    yield start
    for ref in started:
        ref.kill()


def queued(env: dict[str, str], job_id: str) -> tuple[str, datetime.datetime | None]:
    """The job's squeue state (``PENDING``, ``RUNNING``...) and its (expected) start time; ("", None)
    once it has left the queue."""
    out = subprocess.run(["squeue", "--noheader", "--array", "--jobs", job_id, "--format=%T|%S"],
                         env=env, capture_output=True, text=True, timeout=30, check=False)
    state, _, start = out.stdout.strip().partition("|")
    try:
        return state, datetime.datetime.fromisoformat(start)
    except ValueError:
        return state, None


# A requeued job may start only once its old credential, revoked in whole seconds, is older than
# the new one: a start in the same second is killed ("Job credential revoked") and the job fails.
REQUEUE_START_DELAY_S = 3


def start_requeued_soon(env: dict[str, str], job_id: str) -> str:
    """Move a requeued job's StartTime to a few seconds from now; return its squeue state.

    A requeued job waits ~20 s (the cluster's cred_expire) before it may start: moving its
    StartTime only shortens the test.
    """
    state, start = queued(env, job_id)
    now = datetime.datetime.now()
    if state == "PENDING" and start and start > now + datetime.timedelta(seconds=REQUEUE_START_DELAY_S + 2):
        subprocess.run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{REQUEUE_START_DELAY_S}"],
                       env=env, capture_output=True, timeout=30, check=False)
    return state


def wait_until_final(env: dict[str, str], job_id: str, trial_dir: Path, timeout: float = 300) -> dict:
    """Wait until the trial has ended and its job has left the queue; start a requeued job soon."""
    def final():
        state = start_requeued_soon(env, job_id)
        metrics = read_json(trial_dir / "metrics.json") if (trial_dir / "metrics.json").exists() else {}
        return metrics if not state and metrics.get("status") in ("completed", "failed") else None

    return wait_for(final, timeout=timeout, what=f"job {job_id} to end and leave the queue", interval=1.0)


def test_usr2_to_a_moe_folder_trial_with_router_balance_on_resumes_bit_identically(tmp_path, slurm_env, reference):
    from tests.model_folders import make_model_folder

    # Both balances on: DeepSeek-V3's bias update (the default rate) and its sequence-wise aux loss.
    folder = make_model_folder(tmp_path / "moe", n_routed_experts=8)
    moe = ["model=pretrained", f"model.path={folder}", "data=synthetic", "model.lr=1e-3", "model.moe.aux_loss_coef=0.01"]
    env = {**slurm_env, "OMP_NUM_THREADS": "1"}
    job_id, trial_dir = submit(tmp_path, env, *moe)
    expected = reference(1, *moe, env=env)
    usr2_at_step(slurm_env, job_id, trial_dir, 3)

    metrics = wait_until_final(slurm_env, job_id, trial_dir)
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["restarts"] >= 1 and metrics["last_stop_reason"] == "time_limit"
    router = metrics["router"]
    assert (router["bias_update_rate"], router["aux_loss_coef"], list(router["layers"])) == (0.001, 0.01, ["1"])
    # The weights' digest covers the router biases (persistent buffers): moved, saved and resumed alike.
    assert metrics["weights_sha256"] == expected.weights_sha256()
    assert wait_until_ended(slurm_env, job_id, timeout=60) == "COMPLETED"


def test_scancel_usr2_to_a_two_node_trial_checkpoints_requeues_and_resumes(tmp_path, slurm_env, two_node_trial):
    assert two_node_trial.state == "COMPLETED"
    job_id, trial_dir = submit(tmp_path, slurm_env, *TWO_NODES_TWO_PROCESSES)
    usr2_at_step(slurm_env, job_id, trial_dir, 3)

    metrics = wait_until_final(slurm_env, job_id, trial_dir)
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["last_stop_reason"] == "time_limit"
    assert metrics["restarts"] >= 1 and metrics["slurm_restart_count"] >= 1
    assert metrics["stop_to_exit_s"] < 30
    assert metrics["weights_sha256"] == read_json(two_node_trial.trial_dir / "metrics.json")["weights_sha256"]
    assert wait_until_ended(slurm_env, job_id, timeout=60) == "COMPLETED"


@pytest.fixture
def node4_freed(slurm_env):
    """Cancel whatever the test left on node4's urgent partition."""
    yield
    slurm(slurm_env, "scancel", "--partition=urgent", "--nodelist=node4")


PREEMPTABLE_STEPS = "trainer.max_steps=400"
"""About 25 s of the small trial on one thread: the preemption takes a few seconds to land."""


def preempt_node4(env: dict[str, str]) -> None:
    """A job in the high-priority partition that needs all of node4."""
    slurm(env, "sbatch", "--parsable", "-p", "urgent", "-w", "node4", "-c", "64", "--time=2",
          "--output=/dev/null", "--wrap", "sleep 5")


def test_a_preempted_trial_is_requeued_by_slurm_and_resumes(tmp_path, slurm_env, node4_freed, reference):
    # Long enough that the preemption (a scheduler pass or two) always lands before the last step.
    job_id, trial_dir = submit(tmp_path, slurm_env, PREEMPTABLE_STEPS, "+hydra.launcher.additional_parameters.nodelist=node4")
    expected = reference(1, PREEMPTABLE_STEPS)
    wait_for(lambda: metrics_step(trial_dir) >= 3, timeout=240, what="the trial to reach step 3")
    preempt_node4(slurm_env)

    metrics = wait_until_final(slurm_env, job_id, trial_dir)
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["last_stop_reason"] == "preempted"
    assert metrics["restarts"] >= 1
    assert metrics["weights_sha256"] == expected.weights_sha256()
    assert wait_until_ended(slurm_env, job_id, timeout=60) == "COMPLETED"


def test_a_trial_preempted_beyond_its_cap_fails_and_leaves_the_queue(tmp_path, slurm_env, node4_freed):
    job_id, trial_dir = submit(tmp_path, slurm_env, PREEMPTABLE_STEPS, "hydra.launcher.max_num_timeout=0",
                               "+hydra.launcher.additional_parameters.nodelist=node4")
    wait_for(lambda: metrics_step(trial_dir) >= 3, timeout=240, what="the trial to reach step 3")
    preempt_node4(slurm_env)

    metrics = wait_until_final(slurm_env, job_id, trial_dir)
    assert metrics["status"] == "failed"
    assert "max_num_timeout=0" in metrics["error"]
    assert wait_until_ended(slurm_env, job_id, timeout=60) == "FAILED"


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
    wait_for(lambda: metrics_step(trial_dir) >= 3, timeout=240, what="the trial to reach step 3")
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


# slurmctld looks at time limits every 30 s (PERIODIC_TIMEOUT) and sends the --signal warning at
# the first look that finds the job within signal_delay_s + 30 s of its limit: with a 1-minute
# limit and a 1 s delay, 29-59 s into a run, and the kill one look (30 s) later. A requeued run
# starts a few seconds after a look, so its warning comes two looks later, ~55 s in.
TIME_LIMIT = ["hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=1", "hydra.launcher.max_num_timeout=30"]
TIME_LIMITED_STEPS = 400
"""10-25 s of the small trial on one thread: the run after the held ones finishes them, or is requeued too."""


def stop_signals_logged(trial_dir: Path) -> int:
    """How many stop signals the trial's runners have logged (one line each, as the runner gets it)."""
    try:
        return (trial_dir / "train.log").read_text(errors="replace").count(": stop signal (")
    except FileNotFoundError:
        return 0


def held_through_time_limit(env: dict[str, str], job_id: str, trial_dir: Path, timeout: float = 240) -> int:
    """Hold the job's task processes (``held_at_step``) once the run has trained a step of its own, until
    Slurm's time-limit warning is pending in each that does not ignore USR2; then let them go on, to
    stop and requeue. Returns the step the run was held at.

    Held, a run trains no further than that step whatever the machine's speed, so the trial needs
    another run; the stop itself is the one Slurm's warning starts, in a run at its time limit.
    A warning this run's runner got just before the hold (a slow start under load) also lets them
    go: every earlier run (``restarts``) logged its own stop signal.
    """
    pids, at = held_at_step(job_id, trial_dir, metrics_step(trial_dir) + 1, timeout)
    usr2 = 1 << (signal.SIGUSR2 - 1)
    try:
        earlier_runs = read_json(trial_dir / "metrics.json").get("restarts", 0)

        def warned() -> bool:
            if stop_signals_logged(trial_dir) > earlier_runs:
                return True
            for pid in pids:
                status = proc_status(pid)
                if not status or int(status["SigIgn"], 16) & usr2:
                    continue  # gone, or deaf to USR2
                if not (int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)) & usr2:
                    return False
            return True

        # The warning comes 29-59 s into a run; the kill of an unwarned run 30 s after.
        wait_for(warned, timeout=150, what=f"Slurm's time-limit warning to reach job {job_id}", interval=0.2)
    finally:
        _continue_all(pids)
    return at


def test_a_trial_needing_three_time_limits_completes_through_requeues(tmp_path, slurm_env, reference):
    # The trial and its reference train side by side: one thread each, or on 2 cores their
    # thread pools would spin against each other and run 5-10x slower than alone.
    env = {**slurm_env, "OMP_NUM_THREADS": "1"}
    long = [f"trainer.max_steps={TIME_LIMITED_STEPS}", "trainer.ckpt_every=0",
            f"trainer.eval_every={TIME_LIMITED_STEPS}", "trainer.log_every=50"]
    job_id, trial_dir = submit(tmp_path, env, *long, *TIME_LIMIT)
    expected = reference(1, *long, env=env)
    # Two runs are held, each from a step it trained itself until its time limit: more than two runs,
    # at any speed. A run that is not held and does not finish in time is requeued too: more runs.
    held_through_time_limit(slurm_env, job_id, trial_dir)
    wait_for(lambda: start_requeued_soon(slurm_env, job_id) == "RUNNING" and (m := read_json(
        trial_dir / "metrics.json")).get("restarts", 0) >= 1 and m.get("status") == "running", timeout=240,
             what=f"job {job_id}'s next run to resume", interval=1.0)
    held_through_time_limit(slurm_env, job_id, trial_dir)

    metrics = wait_until_final(slurm_env, job_id, trial_dir, timeout=2400)
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["step"] == TIME_LIMITED_STEPS
    assert metrics["restarts"] >= 2, metrics
    assert metrics["last_stop_reason"] == "time_limit"
    assert metrics["stop_to_exit_s"] < 25
    # The reference trains outside Slurm: under load it may get a smaller share of the cores than the trial.
    assert metrics["weights_sha256"] == expected.weights_sha256(timeout=1800)
    # Every run but the last was requeued by the trial itself, none ran into the limit.
    # metrics.json is final before the job has ended: its last run's record reaches accounting after.
    runs = wait_for(lambda: (r := slurm(slurm_env, "sacct", "--duplicates", "--noheader", "--parsable2", "-X", "-j",
                                        job_id, "--format=State").split()) and r[-1] not in ("RUNNING", "PENDING") and r,
                    timeout=120, what="the last run to end in accounting")
    assert runs.count("REQUEUED") == metrics["restarts"] and runs[-1] == "COMPLETED", runs
    assert "TIMEOUT" not in runs


def test_train_sbatch_traps_usr2_forwards_it_requeues_and_resumes(tmp_path, slurm_env, reference):
    (tmp_path / "slurm" / "logs").mkdir(parents=True)
    env = {**slurm_env, "HPCSWEEP_PYTHON": sys.executable}
    training = [o for o in TRAINING if not o.startswith("trainer.nodes")] + ["trainer.nproc_per_node=1"]
    submitted = slurm(env, "sbatch", "--parsable", f"--chdir={tmp_path}", "--nodes=2",
                      "--cpus-per-task=1", "--time=10", str(REPO / "slurm" / "train.sbatch"), *training)
    job_id = submitted.strip().split(";")[0]
    expected = reference(2, "trainer.nodes=2", "trainer.nproc_per_node=1")
    trial_dir = tmp_path / "outputs" / f"sbatch-{job_id}"
    # Only the batch shell gets the signal, as with --signal=B:USR2: its trap must pass it on.
    usr2_at_step(slurm_env, job_id, trial_dir, 3, "--batch")

    metrics = wait_until_final(slurm_env, job_id, trial_dir)
    log = (tmp_path / "slurm" / "logs" / f"hpcsweep-train-{job_id}.out").read_text()
    assert metrics["status"] == "completed", metrics.get("error", "") + log[-3000:]
    assert "train.sbatch: USR2 at" in log
    assert metrics["last_stop_reason"] == "time_limit"
    assert metrics["restarts"] >= 1
    assert metrics["weights_sha256"] == expected.weights_sha256()
    assert wait_until_ended(slurm_env, job_id, timeout=60) == "COMPLETED"
