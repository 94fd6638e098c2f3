"""Process-group setup from the torchrun environment, and the few collectives the trainer needs.

The rendezvous itself (MASTER_ADDR and friends from SLURM_*) is computed elsewhere
(``hpcsweep.trial.rendezvous``); this module only reads what torchrun exported. Without torchrun the
same code runs as one process with world size 1 and no process group.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hpcsweep.train.gpu_choices import (
    DUMMY_GPUS_VAR,
    allocated_gpus,
    gpu_allocation_error,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorldInfo:
    """Where this worker sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None
    """``nccl``, ``gloo``, or ``None`` for a single process without a process group."""

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def ranks_from_env(env: Mapping[str, str]) -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` from torchrun's variables; ``(0, 0, 1)`` without them."""
    return (
        int(env.get("RANK", "0")),
        int(env.get("LOCAL_RANK", "0")),
        int(env.get("WORLD_SIZE", "1")),
    )


def choose_device(device_pref: str, local_rank: int, cuda_available: bool) -> torch.device:
    """The device for ``trainer.device`` (``auto``, ``cpu``, ``cuda``); one GPU per local rank.

    ``cuda`` without CUDA is refused before this is asked (``gpu_allocation_error``).
    """
    if device_pref == "cuda" or (device_pref == "auto" and cuda_available):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def node_name(env: Mapping[str, str]) -> str:
    """The Slurm node name when running under Slurm, else the host name."""
    return env.get("SLURMD_NODENAME") or socket.gethostname()


class GpusNotUsable(RuntimeError):
    """GPUs were asked for or given, but CUDA cannot use them: the trial must not train on CPU."""


def init_distributed(
    device_pref: str, timeout_s: int, env: Mapping[str, str] | None = None, *, group_of_one: bool = False
) -> WorldInfo:
    """Join the process group torchrun set up (NCCL on CUDA, gloo on CPU), or run alone.

    Alone, ``group_of_one`` still makes a process group (of this process only, on an in-memory
    store): FSDP shards over one, so a one-GPU FSDP trial runs the code many GPUs run.

    Raises ``GpusNotUsable`` first thing when this task has GPUs that CUDA cannot see
    (``hpcsweep.train.gpu_choices.gpu_allocation_error``).
    """
    env = os.environ if env is None else env
    rank, local_rank, world_size = ranks_from_env(env)
    cuda_available = torch.cuda.is_available()
    refusal = gpu_allocation_error(
        env, cuda_available=cuda_available, torch_cuda_version=torch.version.cuda, device_pref=device_pref
    )
    if refusal:
        raise GpusNotUsable(refusal)
    if not cuda_available and device_pref == "auto" and allocated_gpus(env):
        log.info("%s names GPUs without hardware (%s=1, the local test cluster): training on CPU",
                 allocated_gpus(env), DUMMY_GPUS_VAR)
    device = choose_device(device_pref, local_rank, cuda_available)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = None
    if world_size > 1 or group_of_one:
        backend = "nccl" if device.type == "cuda" else "gloo"
        alone = {} if world_size > 1 else {"store": dist.HashStore(), "rank": 0, "world_size": 1}
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
            **alone,
        )
    return WorldInfo(rank, local_rank, world_size, device, backend)


def destroy_distributed(world: WorldInfo) -> None:
    """Leave the process group, if this worker joined one."""
    if world.backend is not None and dist.is_initialized():
        dist.destroy_process_group()


def barrier(world: WorldInfo) -> None:
    """Wait for every rank (a no-op without a process group)."""
    if world.is_distributed:
        dist.barrier()


def all_gather_objects(world: WorldInfo, obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (a list of one without a process group)."""
    if not world.is_distributed:
        return [obj]
    gathered: list[Any] = [None] * world.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(world: WorldInfo, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not world.is_distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(world: WorldInfo, flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one, so all ranks take the same branch."""
    if not world.is_distributed:
        return flag
    tensor = torch.tensor([int(flag)], device=world.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def _reduce_ints(world: WorldInfo, values: Sequence[int], op: Any) -> list[int]:
    if not world.is_distributed:
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.int64, device=world.device)
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def max_over_ranks(world: WorldInfo, values: Sequence[int]) -> list[int]:
    """Each of ``values``' maxima over all ranks, in one collective: several decisions agreed at once."""
    return _reduce_ints(world, values, dist.ReduceOp.MAX)


def take_sums(world: WorldInfo, *totals: torch.Tensor) -> list[torch.Tensor]:
    """Each of ``totals`` summed over all ranks (one all_reduce each, on copies), and the totals
    themselves set to zero: a window's running sums taken and begun afresh. A collective."""
    summed = [total.clone() for total in totals]
    if world.world_size > 1:
        for total in summed:
            dist.all_reduce(total)
    for total in totals:
        total.zero_()
    return summed


def sum_over_ranks(world: WorldInfo, values: Sequence[int]) -> list[int]:
    """Each of ``values``' sums over all ranks, in one collective."""
    return _reduce_ints(world, values, dist.ReduceOp.SUM)


def mean_over_ranks(world: WorldInfo, value: torch.Tensor) -> torch.Tensor:
    """The mean of a tensor over all ranks."""
    if not world.is_distributed:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / world.world_size


def resolve_nproc_per_node(setting: int | str, visible_cuda_devices: int) -> int:
    """Workers per node: the configured number, or for ``auto`` one per visible GPU (at least 1)."""
    if setting == "auto":
        return max(1, visible_cuda_devices)
    return int(setting)


def visible_cuda_devices(device_pref: str) -> int:
    """How many CUDA devices this process may use (0 on CPU, or when ``trainer.device=cpu``)."""
    if device_pref == "cpu" or not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()
