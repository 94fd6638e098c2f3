"""How much memory the GPUs of a trial have, from a Slurm GRES type or ``hydra.launcher.gpu_mem_gb``.

Pure: the launcher's settings and the partition's node GRES (``sinfo``'s ``%G``) in, a
``GpuMemory`` out. GB here are binary (2**30 bytes), as NVIDIA's sizes are: an "80 GB" A100
reports 81,920 MiB to ``nvidia-smi``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GIB = 2**30


@dataclass(frozen=True)
class GpuType:
    """A GPU model as sites name it in GRES: its memory and whether it has bf16 tensor cores."""

    label: str
    memory_gb: float
    bf16: bool


# Sources: NVIDIA's datasheets. A100: https://www.nvidia.com/en-us/data-center/a100/ (40 GB and
# 80 GB parts); H100: https://www.nvidia.com/en-us/data-center/h100/ (SXM and PCIe 80 GB, NVL 94 GB);
# H200: https://www.nvidia.com/en-us/data-center/h200/ (141 GB); B200: DGX B200 datasheet (1,440 GB
# over 8 GPUs); L40S/L40/A40/RTX A6000: 48 GB each; L4 and A10: 24 GB; V100: 16 and 32 GB parts;
# T4: 16 GB. A bare "a100" or "v100" names no size: a100 is taken as the 80 GB part (the common one in
# training clusters; a site with 40 GB parts names them a100_40g or sets gpu_mem_gb), v100 as the 16 GB one.
GPU_TYPES: dict[str, GpuType] = {
    "a100": GpuType("A100", 80, True),
    "a100_80g": GpuType("A100", 80, True),
    "a100_40g": GpuType("A100 40GB", 40, True),
    "h100": GpuType("H100", 80, True),
    "h100_nvl": GpuType("H100 NVL", 94, True),
    "h200": GpuType("H200", 141, True),
    "b200": GpuType("B200", 180, True),
    "l40s": GpuType("L40S", 48, True),
    "l40": GpuType("L40", 48, True),
    "a40": GpuType("A40", 48, True),
    "rtx_a6000": GpuType("RTX A6000", 48, True),
    "l4": GpuType("L4", 24, True),
    "a10": GpuType("A10", 24, True),
    "v100": GpuType("V100", 16, False),
    "v100_32g": GpuType("V100 32GB", 32, False),
    "t4": GpuType("T4", 16, False),
}
"""GRES type (lower case, ``-`` read as ``_``, a ``gb`` suffix read as ``g``) -> the GPU."""


@dataclass(frozen=True)
class GpuMemory:
    """The memory of each GPU a trial gets, and where that figure came from."""

    bytes: int
    label: str
    """How messages name the GPU: ``A100``, or ``GPU`` when only gpu_mem_gb is known."""
    source: str
    bf16: bool = True

    @property
    def gb(self) -> float:
        return self.bytes / GIB


def gres_gpu_types(gres: str) -> list[str]:
    """The GPU types of a GRES string: ``gpu:a100:8(S:0-1),gpu:v100:2`` -> ``[a100, v100]``;
    ``gpu:8`` -> ``[""]`` (a GPU of no named type); other GRES -> none."""
    types = []
    for item in re.split(r",(?![^()]*\))", gres):
        parts = item.split("(")[0].strip().split(":")
        if parts[0] == "gpu":
            types.append(parts[1] if len(parts) == 3 or (len(parts) == 2 and not parts[1].isdigit()) else "")
    return types


def gpu_type(name: str) -> GpuType | None:
    """The table's entry of a GRES type name (``A100-80GB`` -> a100_80g), None when it has none."""
    key = name.strip().lower().replace("-", "_")
    key = re.sub(r"(\d+)gb$", r"\1g", key)
    return GPU_TYPES.get(key)


def gpu_memory(params: Mapping[str, Any], partition_gres: Iterable[str] = ()) -> GpuMemory | str:
    """The per-GPU memory of a trial's GPUs, or the reason it is unknown (a line for a warning).

    In order: ``hydra.launcher.gpu_mem_gb``; the type in ``hydra.launcher.gres``
    (``gpu:h100:8``); the GPU types of the partition's nodes (``partition_gres``), the smallest
    when they differ, since a trial may land on any of them.
    """
    gb = params.get("gpu_mem_gb")
    if gb is not None:
        if isinstance(gb, bool) or not isinstance(gb, (int, float)) or gb <= 0:
            raise ValueError(f"hydra.launcher.gpu_mem_gb={gb!r} is not allowed: the memory of one GPU in GB, > 0")
        return GpuMemory(int(gb * GIB), "GPU", "hydra.launcher.gpu_mem_gb")
    launcher_gres = params.get("gres")
    if launcher_gres:
        named = [t for t in gres_gpu_types(str(launcher_gres)) if t]
        if named:
            return _of_types(named, f"hydra.launcher.gres={launcher_gres}")
    named = [t for gres in partition_gres for t in gres_gpu_types(gres)]
    if not named:
        return "the partition's nodes declare no GPU GRES"
    if "" in named:
        return "the partition's GPU GRES names no type"
    return _of_types(named, "the partition's GRES")


def _of_types(names: list[str], source: str) -> GpuMemory | str:
    known = {name: gpu_type(name) for name in names}
    unknown = sorted(name for name, found in known.items() if found is None)
    if unknown:
        return f"GRES type {unknown[0]!r} ({source}) is not in hpcsweep.memory_plan.gpu_memory.GPU_TYPES"
    smallest = min(known.items(), key=lambda item: item[1].memory_gb)  # type: ignore[union-attr]
    name, found = smallest
    assert found is not None
    return GpuMemory(int(found.memory_gb * GIB), found.label, f"{source} gpu:{name}", found.bf16)
