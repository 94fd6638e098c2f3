"""Fixtures for tests against the real local Slurm cluster (``scripts/slurm-cluster up``)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")

# A trial small enough that several fit on 2 cores, yet real training end to end. The launcher
# keeps a user's A100 defaults (64 CPUs and 8 GPUs per node, which the local nodes declare).
SMALL_TRIAL = [
    "trainer.max_steps=8",
    "trainer.eval_every=4",
    "trainer.ckpt_every=4",
    "trainer.log_every=2",
    "trainer.warmup_steps=2",
    "trainer.eval_batches=1",
    "data.batch_size=4",
    "data.seq_len=32",
    "hydra.launcher.timeout_min=15",
]


# A trial long enough to be stopped mid-run, evaluating and checkpointing on the way.
STOPPABLE_TRIAL = [o for o in SMALL_TRIAL if not o.startswith("trainer.max_steps")] + [
    "trainer.max_steps=20", "trainer.ckpt_every=10", "trainer.eval_every=10", "trainer.log_every=1",
    "topology.mode=off",
]
TWO_NODES_TWO_PROCESSES = ["trainer.nodes=2", "trainer.nproc_per_node=2"]
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@functools.cache
def cluster_env() -> dict[str, str]:
    """The process environment with SLURM_CONF pointing at the local cluster."""
    env = dict(os.environ)
    if not env.get("SLURM_CONF"):
        out = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "slurm-cluster"), "env"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout
        match = re.search(r"^export SLURM_CONF=(.+)$", out, re.MULTILINE)
        assert match, f"no SLURM_CONF in `slurm-cluster env` output: {out!r}"
        env["SLURM_CONF"] = shlex.split(match.group(1))[0]
    assert Path(env["SLURM_CONF"]).exists(), "the local cluster is not set up: run scripts/slurm-cluster up"
    return env


@pytest.fixture(scope="session")
def slurm_env() -> dict[str, str]:
    """The process environment with SLURM_CONF pointing at the local cluster."""
    return dict(cluster_env())


def slurm(env: dict[str, str], *argv: str) -> str:
    """Run a Slurm client command and return stdout (test side; the product uses slurm.commands)."""
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, check=True, timeout=60).stdout


def task_processes(job_id: str) -> list[int]:
    """The pids of a job's task processes (its srun steps' tasks and their children, never the batch
    shell), by the Slurm variables each inherits: every local node runs on this machine.

    ``job_id`` is a job (``17``) or an array task (``17_0``)."""
    array_job, _, array_task = job_id.partition("_")
    wanted = {"SLURM_ARRAY_JOB_ID": array_job, "SLURM_ARRAY_TASK_ID": array_task} if array_task else {"SLURM_JOB_ID": job_id}
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = dict(v.split("=", 1) for v in environ.read_bytes().decode(errors="replace").split("\0") if "=" in v)
        except OSError:  # gone, or not ours to read
            continue
        if "SLURM_STEP_ID" in variables and all(variables.get(k) == v for k, v in wanted.items()):
            pids.append(int(environ.parent.name))
    return pids


def proc_status(pid: int) -> dict[str, str]:
    """``/proc/PID/status`` as a dict; empty once the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _not_stopped(pids: Sequence[int]) -> dict[int, str]:
    """Each of ``pids`` that is not stopped yet, with its state (a process that is gone counts as stopped).

    A process in the kernel (state D) whose child among ``pids`` is stopped counts as held: it is a
    vfork parent (Python's subprocess and torchrun start processes by vfork) waiting for that child to
    exec, which the child, stopped before it could, never does while held. It cannot run a line of its
    own until its child goes on; waiting for it to stop waited forever (CI: 'D (disk sleep)')."""
    statuses = {pid: proc_status(pid) for pid in pids}
    stopped_parents = {int(s["PPid"]) for s in statuses.values()
                       if s.get("State", "T").startswith("T") and "PPid" in s}
    states = {pid: s.get("State", "T") for pid, s in statuses.items()}
    return {pid: state for pid, state in states.items()
            if not state.startswith(("T", "Z", "X")) and not (state.startswith("D") and pid in stopped_parents)}


def _stop_all(job_id: str, deadline: float) -> list[int]:
    """SIGSTOP every task process of the job, those it starts meanwhile included; return them once stopped.

    A SIGSTOP takes effect when the process next leaves the kernel: one in uninterruptible I/O (a
    checkpoint's fsync on a loaded disk, state D) stops only once that I/O ends, which once took longer
    than a fixed 30 s on CI. So the wait is the caller's own ``deadline``, and a miss names the
    processes and their states."""
    held: list[int] = []
    while new := [pid for pid in task_processes(job_id) if pid not in held]:
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            held.append(pid)
        while running := _not_stopped(held):
            if time.monotonic() > deadline:
                pytest.fail(f"job {job_id}'s task processes did not stop before the deadline: {running}")
            time.sleep(0.005)
    return held


def _continue_all(pids: Sequence[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def metrics_step(trial_dir: Path) -> int:
    """The step in a trial's metrics.json; 0 before it has one."""
    try:
        return int(read_json(trial_dir / "metrics.json")["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def held_at_step(job_id: str, trial_dir: Path, step: int, timeout: float) -> tuple[list[int], int]:
    """The job's task processes, stopped (SIGSTOP) at the first look that finds the trial at ``step``
    or later; and the step it is held at.

    The test looks only while they are stopped, and lets them run a moment between looks: a small
    trial takes 20 ms a step, so a look from outside, however often, can find it at step 3 and send
    a signal that lands after its last step (CI, twice). A look that finds more than one step
    since the last halves the moment.
    """
    deadline, moment, last = time.monotonic() + timeout, 0.02, None
    while True:
        held = _stop_all(job_id, deadline)
        now = metrics_step(trial_dir)
        if held and now >= step:
            return held, now
        _continue_all(held)
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {trial_dir} to reach step {step} "
                                 f"(at step {now}; {len(held)} task processes of job {job_id})")
        if last is not None and now - last > 1:
            moment = max(moment / 2, 0.001)
        last = now
        time.sleep(moment if held else 0.2)  # none yet: the job waits in the queue or starts


def usr2_at_step(env: dict[str, str], job_id: str, trial_dir: Path, step: int, *scancel_options: str,
                 timeout: float = 240) -> int:
    """``scancel --signal=USR2`` to a running job once its trial is at ``step``, while its task
    processes are held there (``held_at_step``); they go on (SIGCONT) once the signal is pending in
    each that does not ignore it. Returns the step the trial was held at.

    Unheld, the trial trains on while the signal travels through slurmctld, slurmd and the step, and
    can finish its last step first. Held, the stop lands at the step the test saw, at any load.
    ``scancel_options`` pick the receiver, e.g. ``--batch`` for the batch shell, which must pass the
    signal on to the held tasks itself.
    """
    pids, at = held_at_step(job_id, trial_dir, step, timeout)
    usr2 = 1 << (signal.SIGUSR2 - 1)
    try:
        slurm(env, "scancel", *scancel_options, "--signal=USR2", job_id)

        def pending_everywhere() -> bool:
            for pid in pids:
                status = proc_status(pid)
                if not status or int(status["SigIgn"], 16) & usr2:
                    continue  # gone, or deaf to USR2
                if not (int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)) & usr2:
                    return False
            return True

        wait_for(pending_everywhere, timeout=120, what=f"USR2 to reach job {job_id}'s task processes", interval=0.1)
    finally:
        _continue_all(pids)
    return at


def sacct_states(env: dict[str, str], job_id: str) -> dict[str, str]:
    """``JobID -> State`` of an array's tasks (or a job) from accounting."""
    out = slurm(env, "sacct", "-X", "--noheader", "--parsable2", "-j", job_id, "--format=JobID,State")
    return dict(line.split("|", 1) for line in out.splitlines() if line)


def all_job_ids(env: dict[str, str]) -> set[str]:
    """Every job accounting knows about since the cluster started, by its submission's id: an array's
    tasks are one id (a pending array is one record until its tasks start, so a task's own record
    appearing later is no new submission)."""
    out = slurm(env, "sacct", "-X", "--noheader", "--parsable2", "--allusers", "--starttime=2020-01-01", "--format=JobID")
    return {line.split("_", 1)[0] for line in out.splitlines() if line}


def submitted_from(env: dict[str, str], cwd: Path, before: set[str]) -> set[str]:
    """The jobs accounting knows now, and not in ``before``, that were submitted from ``cwd`` (their
    WorkDir): what a command run there submitted. A job of an earlier test may reach accounting late
    (an srun step's record lags by a second), so a bare difference of job sets is not enough."""
    out = slurm(env, "sacct", "-X", "--noheader", "--parsable2", "--allusers", "--starttime=2020-01-01",
                "--format=JobID,WorkDir")
    jobs = dict(line.split("|", 1) for line in out.splitlines() if line)
    return {job for job, workdir in jobs.items()
            if job.split("_", 1)[0] not in before and Path(workdir).is_relative_to(cwd)}


def run_hpcsweep(
    args: Sequence[str], cwd: Path, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``python -m hpcsweep ARGS`` in ``cwd``; the output dirs land under ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "hpcsweep", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def only_sweep_dir(cwd: Path) -> Path:
    """The one multirun sweep dir under ``cwd``."""
    dirs = [p.parent for p in cwd.glob("multirun/*/*/sweep.json")]
    assert len(dirs) == 1, f"expected one sweep under {cwd}, found {dirs}"
    return dirs[0]


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def wait_until_ended(env: dict[str, str], job_id: str, timeout: float = 400) -> str:
    """Wait until accounting shows the job in a terminal state; return that state."""
    def state():
        value = sacct_states(env, job_id).get(job_id, "PENDING")
        return value if value.split()[0] in TERMINAL_STATES else None

    return wait_for(state, timeout=timeout, what=f"job {job_id} to end")


@dataclasses.dataclass(frozen=True)
class EndedTrial:
    job_id: str
    state: str
    trial_dir: Path


@pytest.fixture(scope="session")
def two_node_trial(tmp_path_factory, slurm_env) -> EndedTrial:
    """One uninterrupted 2-node x 2-process sweep trial of ``STOPPABLE_TRIAL``, run once per session.

    The multi-node test checks where its ranks ran; the stop tests of the same shape compare their
    final weights with its. A cluster run, not a local one, is their reference: from three ranks up
    it makes no assumption about how the ranks' reduction order depends on the layout.
    """
    cwd = tmp_path_factory.mktemp("two-node-trial")
    result = run_hpcsweep(["-m", *STOPPABLE_TRIAL, *TWO_NODES_TWO_PROCESSES], cwd, slurm_env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    (trial,) = read_json(next(cwd.glob("multirun/*/*/sweep.json")))["trials"]
    return EndedTrial(trial["job_id"], wait_until_ended(slurm_env, trial["job_id"]), cwd / trial["trial_dir"])
