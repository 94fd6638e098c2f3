"""The launch phase: this node's training processes, started with the trial's environment, run until they exit.

A 1-node, 1-process trial trains in this process; anything larger starts a torchrun elastic agent
(c10d rendezvous) for ``hpcsweep.train``. The workers start from the environment the attempt started
with plus the trial's own variables (NCCL, ``OMP_NUM_THREADS``), for this trial only
(``hpcsweep.trial.process_env``), and read the rest from the node's attempt file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping

from hpcsweep.control import stop
from hpcsweep.slurm import commands
from hpcsweep.slurm.cluster_info import parse_node_address
from hpcsweep.trial import failures
from hpcsweep.trial.attempt import TrialAttempt
from hpcsweep.trial.failure_class import Failure
from hpcsweep.trial.nccl import list_gpu_models, list_ib_devices, nccl_env, resolve_preset
from hpcsweep.trial.process_env import environment_overlay
from hpcsweep.trial.rendezvous import Rendezvous
from hpcsweep.trial.rendezvous_store import agents_store
from hpcsweep.trial.watchdog import HangWatchdog

log = logging.getLogger(__name__)

# How long an agent waits for the other nodes of its trial to join the rendezvous.
RDZV_JOIN_TIMEOUT_S = 900


class _ChildThreadNotice(logging.Filter):
    """Drops torch's warning that an agent in a thread registers no signal handlers.

    The agent runs in a thread on purpose (see ``run_elastic_agent``): the runner's main thread
    handles the stop signals and passes them to the workers through the stop file, and Slurm ends
    every process of a job itself. Nothing in the warning is for the user to act on.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "Failed to register signal handlers since torchelastic is running on a child thread" not in (
            record.getMessage()
        )


logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_ChildThreadNotice())


class TrialFailed(RuntimeError):
    """The trial failed; the message carries the worker's last error lines. How Hydra learns that a job failed."""


@dataclasses.dataclass(frozen=True)
class ProcessesResult:
    """How this node's training processes ended: their exit codes, the error text if any, and
    each failed worker's exit."""

    exit_codes: list[int]
    error: str = ""
    exits: tuple[failures.WorkerExit, ...] = ()
    hang: Failure | None = None


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


def resolve_head_address(rdzv: Rendezvous) -> Rendezvous:
    """Give agents an address they can dial for the head node.

    A node name normally resolves through DNS; where it does not (aliased names, or the local test
    cluster's several "nodes" on one host), the controller's ``NodeAddr`` for it does. A one-node
    trial's agent and workers all run here: they meet on the loopback address, whatever DNS says.
    """
    if rdzv.nnodes == 1:
        return dataclasses.replace(rdzv, master_addr="127.0.0.1")
    try:
        socket.getaddrinfo(rdzv.master_addr, rdzv.master_port)
        return rdzv
    except socket.gaierror:
        address = parse_node_address(commands.show_node(rdzv.master_addr))
    if address is None:
        raise TrialFailed(f"cannot resolve the head node {rdzv.master_addr!r}: no DNS entry and no NodeAddr")
    return dataclasses.replace(rdzv, master_addr=address)


@dataclasses.dataclass(frozen=True)
class TrialEnvironment:
    """The NCCL preset this node resolved (``auto`` made concrete) and the variables the workers get."""

    nccl_preset: str
    nccl_vars: dict[str, str]


def trial_environment(attempt: TrialAttempt) -> TrialEnvironment:
    """The trial's NCCL variables on this node, resolved against the environment the attempt started with."""
    nccl = attempt.trial.nccl
    ib_devices, gpu_models = list_ib_devices(), list_gpu_models()
    variables = nccl_env(
        nccl.preset, overrides=nccl.overrides, debug=nccl.debug, ib_devices=ib_devices, gpu_models=gpu_models,
        ib_hca=nccl.ib_hca, topo_file=nccl.topo_file, inherited=attempt.env,
    )
    return TrialEnvironment(resolve_preset(nccl.preset, ib_devices, gpu_models), variables)


def run_elastic_agent(attempt: TrialAttempt, rdzv: Rendezvous, threads: int | None) -> ProcessesResult:
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
        # A multi-node trial's store is node 0's runner's (hpcsweep.trial.rendezvous_store: it outlives every
        # agent's close); a single node's agent hosts its own. By node rank, not by matching hostnames:
        # several "nodes" of one host (or aliased names) would otherwise all try to host it.
        rdzv_configs={"is_host": rdzv.nnodes == 1, "join_timeout": RDZV_JOIN_TIMEOUT_S},
        max_restarts=0,
        monitor_interval=0.5,
        logs_specs=DefaultLogsSpecs(log_dir=str(attempt.files.torchrun_logs)),
    )
    outcome: list[ProcessesResult | BaseException] = []
    worker_args = ("-u", "-m", "hpcsweep.train", str(attempt.files.root), str(attempt.attempt_file))

    def agent() -> None:
        with stop.stop_signals_blocked():
            try:
                elastic_launch(config, sys.executable)(*worker_args)
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
    with agents_store(rdzv, RDZV_JOIN_TIMEOUT_S) as finish:
        with environment_overlay({} if threads is None else {"OMP_NUM_THREADS": str(threads)}):
            thread.start()
            thread.join()
        finish(isinstance(outcome[0], ProcessesResult) and not any(outcome[0].exit_codes))
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def run_in_process(attempt: TrialAttempt) -> ProcessesResult:
    """The fast path: a 1-node, 1-process trial trains here, without an agent."""
    from hpcsweep.train.worker import run_trial

    code = run_trial(attempt.files.root, attempt.attempt_file)
    if code == 0:
        return ProcessesResult([code])
    message = f"training exited with code {code}"
    return ProcessesResult([code], message, (failures.WorkerExit(0, 0, code, message, time.time()),))


def run_processes(attempt: TrialAttempt, rdzv: Rendezvous) -> ProcessesResult:
    """This node's training processes, in this process or under an agent watched for hangs, until they exit."""
    if rdzv.nnodes == 1 and rdzv.nproc_per_node == 1:
        return run_in_process(attempt)
    threads = worker_threads(attempt.env, rdzv.nproc_per_node, len(os.sched_getaffinity(0)))
    with HangWatchdog(attempt.worker_dir, attempt.trial.trainer.hang_timeout_min * 60, attempt.node) as watchdog:
        result = run_elastic_agent(attempt, rdzv, threads)
    return result if watchdog.failure is None else dataclasses.replace(result, hang=watchdog.failure)
