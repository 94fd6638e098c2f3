"""Run one trial on this node: rendezvous, NCCL environment, then training.

Every node of a trial's allocation runs this once. A 1-node, 1-process trial trains in this
process; anything larger starts a torchrun elastic agent (c10d rendezvous) for
``hpcsweep.train``, whose workers' failures become this trial's failure. Stop signals
(time limit, preemption, Ctrl-C) are handled here while the trial runs: see ``hpcsweep.trial.preempt``.
A trial dir that holds a checkpoint resumes, only under the training config it was trained with
(see ``hpcsweep.trial.identity``); a trial that has ended is not trained again.

A failure of the workers on any node is recorded in metrics.json (class, node, rank, traceback)
and, when it came from where the trial ran, retried on other nodes: see ``hpcsweep.trial.failures``.
A trial whose steps stop for ``trainer.hang_timeout_min`` fails as a hang (``hpcsweep.trial.watchdog``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hpcsweep.config import TrialConfig, trial_config_to_dict
from hpcsweep.control.outcome import Outcome
from hpcsweep.files import metrics_file
from hpcsweep.files.atomic import atomic_write_json, atomic_write_text
from hpcsweep.files.code_snapshot import read_snapshot_record, snapshot_dir_of
from hpcsweep.files.metrics_file import write_metrics
from hpcsweep.files.sweep_record import now_iso
from hpcsweep.files.trial_files import CONFIG_FILE, ENVIRONMENT_FILE, METRICS_FILE
from hpcsweep.slurm import commands
from hpcsweep.slurm.cluster_info import parse_node_address
from hpcsweep.slurm.env import SlurmJobEnv, slurm_job_env
from hpcsweep.control import stop
from hpcsweep.train import fault, worker_records
from hpcsweep.train.checkpoint import trial_already_done
from hpcsweep.trial import budget_watch, failures, preempt
from hpcsweep.trial.failure_class import Failure
from hpcsweep.trial.identity import check_resume, differences_text
from hpcsweep.trial.nccl import list_gpu_models, list_ib_devices, nccl_env, resolve_preset
from hpcsweep.trial.process_env import environment_overlay
from hpcsweep.trial.rendezvous import HEAD_ADDR_VAR, Rendezvous, rendezvous_from_env
from hpcsweep.trial.watchdog import HangWatchdog

log = logging.getLogger(__name__)

# How long an agent waits for the other nodes of its trial to join the rendezvous.
RDZV_JOIN_TIMEOUT_S = 900


class TrialFailed(RuntimeError):
    """The trial's training failed; the message carries the worker's last error lines."""


def worker_threads(env: Mapping[str, str], nproc_per_node: int, cpus_visible: int) -> int | None:
    """``OMP_NUM_THREADS`` for each torchrun worker, or None to keep the value the user set.

    The torchrun command sets 1 for several workers, but its launcher API, used here, sets nothing:
    each worker would start a thread per CPU of the node, and together they oversubscribe it (4 tiny
    workers on 2 cores trained 16x slower). The task's CPUs are shared out among the workers instead:
    ``SLURM_CPUS_PER_TASK``, but never more than the CPUs this process may run on, since a node may
    declare more CPUs than it has (Slurm's ``config_overrides``, or a cgroup smaller than the task).
    """
    if env.get("OMP_NUM_THREADS"):
        return None
    raw = env.get("SLURM_CPUS_PER_TASK", "")
    cpus = min(int(raw), cpus_visible) if raw.isdigit() and int(raw) > 0 else cpus_visible
    return max(1, cpus // nproc_per_node)


def free_port() -> int:
    """A TCP port free on this host right now (for local trials, where no job id exists)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def git_state(source_dir: Path) -> dict[str, Any]:
    """The commit and dirty flag of the checkout ``source_dir`` is in (nulls outside git)."""
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(source_dir), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def resolve_head_address(rdzv: Rendezvous, env: Mapping[str, str]) -> Rendezvous:
    """Give agents an address they can dial for the head node.

    A node name normally resolves through DNS; where it does not (aliased names, or the local test
    cluster's several "nodes" on one host), the controller's ``NodeAddr`` for it does.
    """
    if env.get(HEAD_ADDR_VAR) or rdzv.nnodes == 1:
        return rdzv
    try:
        socket.getaddrinfo(rdzv.master_addr, rdzv.master_port)
        return rdzv
    except socket.gaierror:
        address = parse_node_address(commands.show_node(rdzv.master_addr))
    if address is None:
        raise TrialFailed(f"cannot resolve the head node {rdzv.master_addr!r}: no DNS entry and no NodeAddr")
    return dataclasses.replace(rdzv, master_addr=address)


def environment_record(
    rdzv: Rendezvous, nccl_preset: str, nccl_vars: Mapping[str, str], env: Mapping[str, str]
) -> dict[str, Any]:
    """What a trial ran under: code version, rendezvous, NCCL preset (``auto`` resolved) and variables,
    Slurm job and restarts.

    ``code_snapshot`` names the sweep's code snapshot this code was imported from (its path,
    commit and diff hash), or is null when the trial runs the installed code.
    """
    import torch

    job = slurm_job_env(env)
    code_dir = snapshot_dir_of(__file__)
    return {
        **git_state(Path(__file__).resolve().parent),
        "code_snapshot": None if code_dir is None else read_snapshot_record(code_dir),
        "recorded_at": now_iso(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "rendezvous": rdzv.as_env(),
        "nccl_preset": nccl_preset,
        "nccl": dict(nccl_vars),
        "slurm": None
        if job is None
        else {
            "job_id": job.job_id,
            "job_label": job.job_label,
            "array_job_id": job.array_job_id,
            "array_task_id": job.array_task_id,
            "nodelist": job.nodelist,
            "node_name": job.node_name,
            "restart_count": job.restart_count,
        },
    }


def write_trial_config(trial: TrialConfig, trial_dir: Path) -> None:
    """Write the resolved ``config.yaml`` the workers read."""
    text = yaml.safe_dump(trial_config_to_dict(trial), sort_keys=False)
    atomic_write_text(trial_dir / CONFIG_FILE, text)


def check_trial_config(trial: TrialConfig, trial_dir: Path, force: bool, node_rank: int) -> None:
    """Refuse (``ConfigMismatch``) to resume ``trial_dir`` under another training config.

    With ``force``, log the differences and keep the old ``config.yaml`` aside (node 0), so the
    trial dir still records every config it was trained with.
    """
    differences = check_resume(trial_dir, trial, force)
    if not differences:
        return
    log.warning("resume.force=true: resuming %s with a different config: %s", trial_dir, differences_text(differences))
    if node_rank == 0:
        stamp = now_iso().replace(":", "").replace("+0000", "Z")
        aside = trial_dir / f"config.before-{stamp}.yaml"
        atomic_write_text(aside, (trial_dir / CONFIG_FILE).read_text())
        log.warning("the config it was trained with is kept as %s", aside.name)


def read_metrics(trial_dir: Path) -> dict[str, Any]:
    """The trial's ``metrics.json``; ``{}`` before the first write, or if it cannot be read (the
    exit codes alone then say how the trial ended)."""
    return metrics_file.read_metrics(trial_dir / METRICS_FILE) or {}


@dataclasses.dataclass(frozen=True)
class ProcessesResult:
    """How this node's training processes ended: their exit codes, the error text if any, and
    each failed worker's exit."""

    exit_codes: list[int]
    error: str = ""
    exits: tuple[failures.WorkerExit, ...] = ()
    hang: Failure | None = None


def run_elastic_agent(rdzv: Rendezvous, trial_dir: Path, threads: int | None) -> ProcessesResult:
    """Run a torchrun elastic agent for ``hpcsweep.train`` until its workers have exited.

    The agent runs in a thread: torch installs its own SIGTERM handler when started from the main
    thread, and the main thread's stop handlers must stay. The thread blocks the stop signals, so
    the workers start with them blocked (see ``stop.stop_signals_blocked``). The workers inherit
    ``OMP_NUM_THREADS=threads`` unless ``threads`` is None.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=rdzv.nnodes,
        max_nodes=rdzv.nnodes,
        nproc_per_node=rdzv.nproc_per_node,
        run_id=rdzv.rdzv_id,
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv.endpoint,
        # Decide the store host by node rank, not by matching hostnames: several "nodes" of one
        # host (or aliased names) would otherwise all try to host it.
        rdzv_configs={"is_host": rdzv.node_rank == 0, "join_timeout": RDZV_JOIN_TIMEOUT_S},
        max_restarts=0,
        monitor_interval=0.5,
        logs_specs=DefaultLogsSpecs(log_dir=str(trial_dir / "logs" / "torchrun")),
    )
    outcome: list[ProcessesResult | BaseException] = []

    def agent() -> None:
        with stop.stop_signals_blocked():
            try:
                elastic_launch(config, sys.executable)("-u", "-m", "hpcsweep.train", str(trial_dir))
                outcome.append(ProcessesResult([0] * rdzv.nproc_per_node))
            except ChildFailedError as err:
                codes = [failure.exitcode for failure in err.failures.values()]
                exits = tuple(
                    failures.WorkerExit(rank, f.local_rank, f.exitcode, f.message, float(f.timestamp))
                    for rank, f in err.failures.items()
                )
                outcome.append(ProcessesResult(codes, err.format_msg(), exits))
                log.info("trial workers exited with codes %s", codes)
            except BaseException as err:  # noqa: BLE001  (re-raised in the caller's thread)
                outcome.append(err)

    thread = threading.Thread(target=agent, name="torchrun-agent")
    with environment_overlay({} if threads is None else {"OMP_NUM_THREADS": str(threads)}):
        thread.start()
        thread.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def run_in_process(trial_dir: Path) -> ProcessesResult:
    """The fast path: a 1-node, 1-process trial trains here, without an agent."""
    from hpcsweep.train.worker import run_trial

    code = run_trial(trial_dir)
    if code == 0:
        return ProcessesResult([code])
    message = f"training exited with code {code}"
    return ProcessesResult([code], message, (failures.WorkerExit(0, 0, code, message, time.time()),))


def fail_trial(trial_dir: Path, metrics: dict[str, Any], error: str) -> Outcome:
    """Mark the trial failed in metrics.json with ``error`` (node 0 only); its ``failed`` outcome."""
    failed = {**metrics, "status": "failed", "error": error}
    write_metrics(trial_dir / METRICS_FILE, failed)
    return Outcome("failed", error, failed)


def after_stop(
    trial_dir: Path, job: SlurmJobEnv | None, node_rank: int, cap: int | None, stop: stop.StopRequest
) -> Outcome:
    """Finish a checkpointed stop: record it, and say whether the job is requeued, left to Slurm, or failed.

    Only node 0 writes; the edge carries out the ``requeue`` outcome's ``scontrol requeue``. A trial
    nothing will requeue is marked ``stopped``.
    """
    metrics = read_metrics(trial_dir)
    reason = stop.reason or metrics.get("last_stop_reason")
    took = None if stop.requested_at is None else round(time.monotonic() - stop.requested_at, 3)
    requeues = job.restart_count if job else 0
    decision = preempt.decide_after_stop(reason, requeues, cap, under_slurm=job is not None)
    log.info("stop (%s): checkpoint saved and workers gone %s s after the signal; %s",
             reason, took, decision.message)
    if node_rank != 0:
        return Outcome("node_done", decision.message, metrics, reason, metrics.get("step"))
    metrics.update(last_stop_reason=reason, stop_to_exit_s=took)
    if decision.action == "fail":
        return fail_trial(trial_dir, metrics, decision.message)
    if decision.action == "exit":
        metrics["status"] = "stopped"
    write_metrics(trial_dir / METRICS_FILE, metrics)
    if decision.action == "exit":
        return Outcome("stopped", decision.message, metrics, reason, metrics.get("step"))
    return Outcome("requeue", decision.message, metrics, reason, metrics.get("step"),
                   requeue_job=job.job_label if decision.action == "requeue" and job is not None else None)


def record_abort(trial_dir: Path, node_rank: int) -> Outcome:
    """After a second Ctrl-C: mark the trial ``stopped`` (node 0), since no worker will say so."""
    metrics = read_metrics(trial_dir)
    if node_rank == 0 and metrics.get("status") == "running":
        metrics = {**metrics, "status": "stopped", "last_stop_reason": "aborted"}
        write_metrics(trial_dir / METRICS_FILE, metrics)
    return Outcome("aborted", "interrupted again while stopping: left without a checkpoint of this step",
                   metrics, stop.INTERRUPTED, metrics.get("step"))


def ended_outcome(metrics: dict[str, Any]) -> Outcome:
    """The outcome of a trial whose workers exited 0: ``pruned`` when the search stopped it, else ``completed``."""
    return Outcome("pruned" if metrics.get("status") == "pruned" else "completed", str(metrics.get("status")), metrics)


def run_trial_on_this_node(
    trial: TrialConfig, trial_dir: Path, env: Mapping[str, str] | None = None, *, force_resume: bool = False
) -> dict[str, Any]:
    """Run this node's share of one trial and return how it ended (its ``metrics.json`` included).

    Raises ``ConfigMismatch`` before anything runs when the trial dir was trained with another
    config (unless ``force_resume``); every other end is an ``Outcome``.
    """
    env = dict(os.environ if env is None else env)
    if slurm_job_env(env) is None and not env.get("MASTER_PORT"):
        env["MASTER_PORT"] = str(free_port())
    rdzv = rendezvous_from_env(env, trial.trainer.nproc_per_node)
    fault.fault_from_env(env)  # a malformed HPCSWEEP_FAULT is refused before any worker starts
    check_trial_config(trial, trial_dir, force_resume, rdzv.node_rank)
    previous = read_metrics(trial_dir)
    if trial_already_done(trial_dir, previous):
        log.info("trial %s is already %s: not training it again", trial_dir, previous["status"])
        return Outcome("skipped", f"already {previous['status']}", previous)
    if budget_watch.skip_if_spent(trial, trial_dir, rdzv, env):
        return Outcome("skipped", "the sweep's GPU-hour budget is spent", read_metrics(trial_dir))
    trial_dir.mkdir(parents=True, exist_ok=True)
    write_trial_config(trial, trial_dir)
    rdzv = resolve_head_address(rdzv, env)
    ib_devices, gpu_models = list_ib_devices(), list_gpu_models()
    nccl_vars = nccl_env(
        trial.nccl.preset,
        overrides=trial.nccl.overrides,
        debug=trial.nccl.debug,
        ib_devices=ib_devices,
        gpu_models=gpu_models,
        ib_hca=trial.nccl.ib_hca,
        topo_file=trial.nccl.topo_file,
        inherited=env,
    )
    nccl_preset = resolve_preset(trial.nccl.preset, ib_devices, gpu_models)
    if rdzv.node_rank == 0:
        atomic_write_json(trial_dir / ENVIRONMENT_FILE, environment_record(rdzv, nccl_preset, nccl_vars, env))
    log.info(
        "trial %s: node %d/%d, %d process(es) per node, rendezvous %s",
        trial_dir, rdzv.node_rank, rdzv.nnodes, rdzv.nproc_per_node, rdzv.endpoint,
    )

    job = slurm_job_env(env)
    cap = preempt.max_requeues_from_env(env)
    over_cap = preempt.over_cap_error(job.restart_count if job else 0, cap)
    if over_cap:
        log.error("trial %s: %s", trial_dir, over_cap)
        if rdzv.node_rank == 0:
            return fail_trial(trial_dir, read_metrics(trial_dir), over_cap)
        return Outcome("failed", over_cap)
    if job is not None and rdzv.node_rank == 0:
        failures.record_slurm_failure(trial_dir, job)

    stop_file = stop.stop_file_for(trial_dir, rdzv.node_rank)
    stop_file.unlink(missing_ok=True)
    worker_dir = worker_records.worker_dir_for(trial_dir, rdzv.node_rank)
    shutil.rmtree(worker_dir, ignore_errors=True)
    worker_dir.mkdir(parents=True)
    # Workers (and the in-process fast path) read these from the process environment, for this trial only.
    trial_vars = {**nccl_vars, stop.STOP_FILE_VAR: str(stop_file), worker_records.WORKER_DIR_VAR: str(worker_dir)}
    node = job.node_name if job and job.node_name else socket.gethostname()
    # The trainer clears STOP_REQUESTED once it has acted; ``signalled`` keeps the reason and time.
    signalled = stop.StopRequest()

    def on_stop(reason: str) -> None:
        log.warning("trial %s: stop signal (%s): finishing the step, then checkpoint", trial_dir, reason)
        signalled.set(reason)
        stop.STOP_REQUESTED.set(reason)
        stop.write_stop_file(stop_file, reason)

    with environment_overlay(trial_vars), stop.stop_signals_handled(on_stop), \
            budget_watch.watching(trial, trial_dir, rdzv, on_stop, env):
        if stop.STOP_REQUESTED.reason:  # signalled during start-up, before these handlers
            on_stop(stop.STOP_REQUESTED.reason)
        try:
            if rdzv.nnodes == 1 and rdzv.nproc_per_node == 1:
                result = run_in_process(trial_dir)
            else:
                threads = worker_threads(env, rdzv.nproc_per_node, len(os.sched_getaffinity(0)))
                with HangWatchdog(worker_dir, trial.trainer.hang_timeout_min * 60, node) as watchdog:
                    result = run_elastic_agent(rdzv, trial_dir, threads)
                if watchdog.failure is not None:
                    result = dataclasses.replace(result, hang=watchdog.failure)
        except KeyboardInterrupt:  # a second Ctrl-C while stopping (``stop.stop_signals_handled``)
            return record_abort(trial_dir, rdzv.node_rank)
        finally:
            # A signal after the last step must not stop the next trial of this process.
            stop.STOP_REQUESTED.clear()
        metrics = read_metrics(trial_dir)
        outcome = "failed" if result.hang else preempt.classify_exit(result.exit_codes, metrics.get("status"))
        if outcome == "stopped":
            return after_stop(trial_dir, job, rdzv.node_rank, cap, signalled)
    if outcome == "failed":
        if result.error:  # torchrun's summary: which ranks failed, how, and when
            log.error("trial %s failed:\n%s", trial_dir, result.error)
        found = node_failures(result, worker_dir, node, metrics)
        decision = failures.settle_failure(
            trial_dir, found, node_rank=rdzv.node_rank, nnodes=rdzv.nnodes,
            attempt=f"{job.job_label}.{job.restart_count}" if job else f"local.{os.getpid()}", job=job,
            max_retries=failures.max_retries_from_env(env),
            report_defaults={"max_steps": trial.trainer.max_steps, "world_size": rdzv.nnodes * rdzv.nproc_per_node,
                             "restarts": metrics.get("restarts", 0), "env": env},
        )
        return Outcome("retry" if decision.action == "retry" else "failed", decision.message, read_metrics(trial_dir))
    return ended_outcome(metrics)


def node_failures(result: ProcessesResult, worker_dir: Path, node: str, metrics: dict[str, Any]) -> list[Failure]:
    """This node's failures: the hang, else each failed worker with the traceback or stacks it left."""
    if result.hang is not None:
        return [result.hang]
    worker_error = metrics.get("error")
    if isinstance(worker_error, list):  # rank 0's traceback lines
        worker_error = "\n".join(worker_error)
    reported = result.error or "training reported status failed"
    exits = result.exits or (failures.WorkerExit(0, 0, 1, reported, time.time()),)
    found = []
    for exit in exits:
        left = [
            path.read_text(errors="replace")
            for path in (worker_records.error_path(worker_dir, exit.local_rank),
                         worker_records.stacks_path(worker_dir, exit.local_rank))
            if path.exists() and path.stat().st_size
        ]
        text = left[0] if left else (worker_error if exit.rank == 0 and worker_error else exit.message)
        found.append(failures.worker_failure(exit, node, text))
    return found
