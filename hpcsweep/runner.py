"""Run one trial on this node: rendezvous, NCCL environment, then training.

Every node of a trial's allocation runs this once. A 1-node, 1-process trial trains in this
process; anything larger starts a torchrun elastic agent (c10d rendezvous) for
``hpcsweep.train``, whose workers' failures become this trial's failure.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hpcsweep.config import TrialConfig, trial_config_to_dict
from hpcsweep.fileio import atomic_write_json, atomic_write_text
from hpcsweep.nccl import list_ib_devices, nccl_env
from hpcsweep.rendezvous import HEAD_ADDR_VAR, Rendezvous, rendezvous_from_env
from hpcsweep.slurm import commands
from hpcsweep.slurm.cluster_info import parse_node_address
from hpcsweep.slurm.env import slurm_job_env
from hpcsweep.sweep_record import now_iso

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
ENVIRONMENT_FILE = "environment.json"
METRICS_FILE = "metrics.json"
# How long an agent waits for the other nodes of its trial to join the rendezvous.
RDZV_JOIN_TIMEOUT_S = 900


class TrialFailed(RuntimeError):
    """The trial's training failed; the message carries the worker's last error lines."""


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
    rdzv: Rendezvous, nccl_vars: Mapping[str, str], env: Mapping[str, str]
) -> dict[str, Any]:
    """What a trial ran under: code version, rendezvous, NCCL variables, Slurm job and restarts."""
    import torch

    job = slurm_job_env(env)
    return {
        **git_state(Path(__file__).resolve().parent),
        "recorded_at": now_iso(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "rendezvous": rdzv.as_env(),
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


def read_metrics(trial_dir: Path) -> dict[str, Any]:
    """The trial's ``metrics.json``, or ``{}`` before the first write."""
    path = trial_dir / METRICS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def run_elastic_agent(rdzv: Rendezvous, trial_dir: Path) -> None:
    """Start a torchrun elastic agent for ``hpcsweep.train``; raise ``TrialFailed`` on worker failure."""
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
    try:
        elastic_launch(config, sys.executable)("-u", "-m", "hpcsweep.train", str(trial_dir))
    except ChildFailedError as err:
        message = err.format_msg()
        log.error("trial workers failed:\n%s", message)
        raise TrialFailed(message) from None


def run_in_process(trial_dir: Path) -> None:
    """The fast path: a 1-node, 1-process trial trains here, without an agent."""
    from hpcsweep.train import run_trial

    code = run_trial(trial_dir)
    if code != 0:
        raise TrialFailed(f"training exited with code {code}")


def run_trial_on_this_node(
    trial: TrialConfig, trial_dir: Path, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run this node's share of one trial and return its final ``metrics.json``.

    Raises ``TrialFailed`` when training fails, with the worker's error.
    """
    env = dict(os.environ if env is None else env)
    trial_dir.mkdir(parents=True, exist_ok=True)
    write_trial_config(trial, trial_dir)

    if slurm_job_env(env) is None and not env.get("MASTER_PORT"):
        env["MASTER_PORT"] = str(free_port())
    rdzv = resolve_head_address(rendezvous_from_env(env, trial.trainer.nproc_per_node), env)
    nccl_vars = nccl_env(
        trial.nccl.preset,
        overrides=trial.nccl.overrides,
        debug=trial.nccl.debug,
        ib_devices=list_ib_devices(),
        topo_file=trial.nccl.topo_file,
        pg_timeout_s=trial.nccl.pg_timeout_s,
        inherited=env,
    )
    # Workers (and the in-process fast path) read these from the process environment.
    os.environ.update(nccl_vars)
    if rdzv.node_rank == 0:
        atomic_write_json(trial_dir / ENVIRONMENT_FILE, environment_record(rdzv, nccl_vars, env))
    log.info(
        "trial %s: node %d/%d, %d process(es) per node, rendezvous %s",
        trial_dir, rdzv.node_rank, rdzv.nnodes, rdzv.nproc_per_node, rdzv.endpoint,
    )

    if rdzv.nnodes == 1 and rdzv.nproc_per_node == 1:
        run_in_process(trial_dir)
    else:
        run_elastic_agent(rdzv, trial_dir)

    metrics = read_metrics(trial_dir)
    if metrics.get("status") == "failed":
        raise TrialFailed(metrics.get("error") or "training reported status failed")
    return metrics
