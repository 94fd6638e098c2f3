"""How a local sweep shares this machine out: how many trials at once, their GPUs and their CPUs.

Pure functions of the GPU ids and CPUs this process may use; ``hpcsweep.sweep.local_pool``
applies them. Each running trial gets a slot (a disjoint share of the CPUs, set as the trial
process's affinity, from which torch sizes its thread pool and the runner shares threads out among
torchrun workers) and GPUs of its own (``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PARALLELISM_KEY = "hydra.launcher.local_parallelism"
CUDA_DEVICES_VAR = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class LocalSlot:
    """One place for a running trial: its index and the CPUs its process may run on."""

    index: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class LocalPlan:
    """How many trials run at once on this machine, each one's slot, and the GPUs to hand out."""

    parallelism: int
    slots: tuple[LocalSlot, ...]
    gpu_ids: tuple[str, ...]

    @property
    def gpus_per_slot(self) -> int:
        """GPUs of a trial that names no GPU count: an equal share, at least one (none without GPUs)."""
        return max(1, len(self.gpu_ids) // self.parallelism) if self.gpu_ids else 0


def visible_gpu_ids(env: Mapping[str, str], driver_gpus: int) -> tuple[str, ...]:
    """The GPUs this process may hand out: ``CUDA_VISIBLE_DEVICES`` when set, else every GPU of the driver.

    The entries are kept as written (indexes or UUIDs), so that a trial's subset means the same
    devices; CUDA ignores everything from the first entry starting with ``-`` on.
    """
    if CUDA_DEVICES_VAR not in env:
        return tuple(str(index) for index in range(driver_gpus))
    ids = []
    for entry in (part.strip() for part in env[CUDA_DEVICES_VAR].split(",")):
        if not entry or entry.startswith("-"):
            break
        ids.append(entry)
    return tuple(ids)


def local_parallelism(value: Any, gpu_count: int) -> int:
    """Trials at once: ``value``, or for null one per GPU (1 without GPUs); ``ValueError`` naming the key."""
    if value is None:
        return max(1, gpu_count)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{PARALLELISM_KEY}={value!r} is not allowed: a whole number >= 1, or null (one trial per GPU, "
            "1 without GPUs)"
        )
    return value


def share_cpus(cpus: Sequence[int], parts: int) -> tuple[tuple[int, ...], ...]:
    """``cpus`` cut into ``parts`` disjoint runs of equal length (the rest unused), in order.

    With more parts than CPUs, each part gets one CPU, and the CPUs are shared round the parts.
    """
    ordered = sorted(cpus)
    if parts > len(ordered):
        return tuple((ordered[index % len(ordered)],) for index in range(parts))
    size = len(ordered) // parts
    return tuple(tuple(ordered[index * size:(index + 1) * size]) for index in range(parts))


def plan_local_run(requested: Any, gpu_ids: Sequence[str], cpus: Sequence[int]) -> LocalPlan:
    """The plan for ``hydra.launcher.local_parallelism=requested`` on these GPUs and CPUs."""
    parallelism = local_parallelism(requested, len(gpu_ids))
    slots = tuple(LocalSlot(index, part) for index, part in enumerate(share_cpus(cpus, parallelism)))
    return LocalPlan(parallelism, slots, tuple(gpu_ids))


def trial_gpu_count(plan: LocalPlan, asked: int | None, key: str) -> int:
    """The GPUs a trial takes: ``asked`` (its own count, e.g. ``trainer.nproc_per_node``), else a slot's share.

    ``ValueError`` naming ``key`` when it asks for more GPUs than the machine has. Without GPUs
    nothing is handed out and a trial runs on the CPU.
    """
    if not plan.gpu_ids:
        return 0
    if asked is None:
        return plan.gpus_per_slot
    if asked > len(plan.gpu_ids):
        raise ValueError(
            f"{key}={asked} is not allowed here: this machine has {len(plan.gpu_ids)} GPU(s) "
            f"({CUDA_DEVICES_VAR} {','.join(plan.gpu_ids)})"
        )
    return asked


def take_gpus(free: Sequence[str], count: int) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The first ``count`` of the ``free`` GPUs and those left, or None when too few are free."""
    if count > len(free):
        return None
    return tuple(free[:count]), tuple(free[count:])


def trial_environment(plan: LocalPlan, gpus: Sequence[str]) -> dict[str, str]:
    """Variables a trial process gets on top of this one's: its GPUs (none to set without GPUs).

    A trial that takes no GPU on a GPU machine sees none, rather than every GPU.
    """
    return {CUDA_DEVICES_VAR: ",".join(gpus)} if plan.gpu_ids else {}
