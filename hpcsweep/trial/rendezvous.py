"""Where a trial's torchrun agents meet: a pure function of the environment.

Inside a Slurm job the head node is the first host of the job's nodelist and the port is derived
from the job id, so every node of a trial computes the same rendezvous without talking to the
others. Outside Slurm the trial runs on one node at 127.0.0.1.

Resolving a node *name* to an address is left to the caller: the runner dials the name through DNS,
or the controller's ``NodeAddr`` for it where DNS does not know it (the local test cluster runs every
"node" on one host, where ``node3`` is not in DNS).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hpcsweep.slurm.env import expand_nodelist, slurm_job_env

PORT_MIN = 20000
"""Lowest port :func:`rendezvous_port` returns."""
PORT_MAX = 32000
"""One past the highest port :func:`rendezvous_port` returns. Linux hands out ephemeral ports
from 32768 (``net.ipv4.ip_local_port_range``); NCCL and gloo open many outgoing connections,
so a rendezvous port inside that range could already be taken by one of them."""
DEFAULT_LOCAL_PORT = 29500
"""Port outside Slurm when ``MASTER_PORT`` is not set (torchrun's own default)."""


@dataclass(frozen=True)
class Rendezvous:
    """The static rendezvous of one trial: who is the head, which port, how many processes."""

    master_addr: str
    master_port: int
    nnodes: int
    node_rank: int
    nproc_per_node: int
    rdzv_id: str

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} is outside 0..{self.nnodes - 1}")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be >= 1, got {self.nproc_per_node}")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port {self.master_port} is not a TCP port")

    @property
    def world_size(self) -> int:
        """Number of worker processes in the trial: ``nnodes * nproc_per_node``."""
        return self.nnodes * self.nproc_per_node

    @property
    def endpoint(self) -> str:
        """``host:port``, the form ``torchrun --rdzv-endpoint`` takes."""
        return f"{self.master_addr}:{self.master_port}"

    def as_env(self) -> dict[str, str]:
        """The rendezvous as environment variables for the torchrun agent and the trial record."""
        return {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "NNODES": str(self.nnodes),
            "NODE_RANK": str(self.node_rank),
            "NPROC_PER_NODE": str(self.nproc_per_node),
            "WORLD_SIZE": str(self.world_size),
            "RDZV_ID": self.rdzv_id,
            "RDZV_ENDPOINT": self.endpoint,
        }


def rendezvous_port(job_id: str, task_id: str | None) -> int:
    """A port in ``[PORT_MIN, PORT_MAX)`` that depends only on the job id and array task id.

    Why two trials on one node do not collide: the job id is hashed with SHA-256 (stable across
    processes, unlike ``hash()``) to an offset, and the array task id is *added* to it, so the
    tasks of one array get consecutive ports modulo the range: two tasks of the same array collide
    only when their ids differ by a multiple of ``PORT_MAX - PORT_MIN`` (12,000), which is more
    than Slurm's default ``MaxArraySize`` (1,001). Trials from different jobs or arrays land
    independently, so two of them on one node share a port with probability 1/12,000.
    """
    span = PORT_MAX - PORT_MIN
    digest = hashlib.sha256(job_id.strip().encode()).digest()
    offset = int.from_bytes(digest[:8], "big")
    if task_id is not None and task_id.strip() != "":
        offset += int(task_id)
    return PORT_MIN + offset % span


def rendezvous_from_env(
    env: Mapping[str, str],
    nproc_per_node: int,
    *,
    hostnames: Callable[[str], list[str]] | None = None,
) -> Rendezvous:
    """Compute this node's rendezvous from the environment.

    Inside Slurm: head node = first host of ``SLURM_JOB_NODELIST`` (expanded by ``hostnames``
    when given, e.g. ``commands.show_hostnames``, else by :func:`expand_nodelist`), node rank =
    ``SLURM_NODEID``, port = :func:`rendezvous_port` of the array job and task (or the job),
    ``rdzv_id`` = the job label. ``MASTER_PORT`` is ignored there: Slurm copies the submitting
    shell's environment into every job, so one exported port would be shared by all trials.

    Outside Slurm: one node at 127.0.0.1, ``MASTER_PORT`` from ``env`` or 29500.
    """
    job = slurm_job_env(env)
    if job is None:
        raw_port = env.get("MASTER_PORT", "").strip()
        port = int(raw_port) if raw_port else DEFAULT_LOCAL_PORT
        return Rendezvous(
            master_addr="127.0.0.1",
            master_port=port,
            nnodes=1,
            node_rank=0,
            nproc_per_node=nproc_per_node,
            rdzv_id="local",
        )
    if not job.nodelist:
        raise ValueError("inside a Slurm job but SLURM_JOB_NODELIST is not set")
    if job.num_nodes > 1 and not env.get("SLURM_NODEID"):
        # Every node would take rank 0 and wait for the others for ever.
        container = f" (Slurm's OCI support, SLURM_CONTAINER={env['SLURM_CONTAINER']}, leaves each task's " \
                    "variables out of its container: the site's oci.conf must add them, docs/user/containers.md)" \
            if env.get("SLURM_CONTAINER") else ""
        raise ValueError(f"a task of a {job.num_nodes}-node job has no SLURM_NODEID{container}: this node's rank "
                         "in the trial is unknown")
    hosts = (hostnames or expand_nodelist)(job.nodelist)
    if not hosts:
        raise ValueError(f"SLURM_JOB_NODELIST={job.nodelist!r} names no host")
    if job.is_array_task:
        port = rendezvous_port(str(job.array_job_id), str(job.array_task_id))
    else:
        port = rendezvous_port(job.job_id, None)
    return Rendezvous(
        master_addr=hosts[0],
        master_port=port,
        nnodes=job.num_nodes,
        node_rank=job.node_id,
        nproc_per_node=nproc_per_node,
        rdzv_id=job.job_label,
    )
