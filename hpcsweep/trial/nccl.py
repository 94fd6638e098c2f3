"""NCCL environment presets for A100 and H100 clusters, each variable with the reason it is set.

A preset is data: a tuple of :class:`NcclVar`. :func:`nccl_settings` resolves a preset against the
config and the inherited environment, and :func:`nccl_env` gives the plain ``dict`` the trial's
workers start with (the trial's ``environment.json`` records it, and the preset it came from).
``auto`` is not a preset of its own: on each node it becomes ``none`` where the kernel lists no
InfiniBand device, ``h100_ib`` where the driver names a Hopper GPU, and ``a100_ib`` elsewhere
(:func:`resolve_preset`).

What the presets leave to NCCL, on purpose: the socket interface (unset, NCCL prefers ``ib*``
interfaces and never picks ``lo`` or ``docker*`` while another exists; any filter we set would drop
that preference), the HCAs (NCCL matches each GPU to its nearest HCA; ``nccl.ib_hca`` pins a list
the user gives, since only the user knows which HCAs are storage ports), NVLink SHARP (NCCL enables
it where the NVSwitch supports it, i.e. on H100/H200, and skips it on A100), and the RoCE GID index
(since NCCL 2.21 it picks the RoCE v2 GID itself; ``nccl.overrides`` sets ``NCCL_IB_GID_INDEX`` for
an older NCCL or an unusual GID table).

Precedence, lowest first: preset < inherited environment < ``debug`` < ``overrides``.
The inherited environment beats the preset because site modules often set ``NCCL_IB_HCA`` or
``NCCL_SOCKET_IFNAME`` for their fabric and know it better than a generic preset. The explicit
config (``debug``, ``overrides``) beats the inherited environment because it is recorded in the
trial's ``config.yaml``; a stray variable in a login shell must not silently undo it. Only the
variables a preset, ``debug`` or ``overrides`` name are returned; other inherited variables are
left alone (they reach the job anyway).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IB_SYSFS_DIR = "/sys/class/infiniband"
"""Where the kernel lists InfiniBand (and RoCE) host channel adapters."""


@dataclass(frozen=True)
class NcclVar:
    """One environment variable of a preset, with the reason it is set."""

    name: str
    value: str
    reason: str


@dataclass(frozen=True)
class NcclSetting:
    """One resolved variable: its value, the reason, and which layer it came from."""

    name: str
    value: str
    reason: str
    source: str
    """``preset``, ``inherited``, ``debug``, ``overrides``, ``ib_hca`` or ``topo_file``."""


_TORCH_ERRORS = (
    NcclVar(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "1",
        "a failed or timed-out collective aborts the process, so torchrun and Slurm see a failure instead of a hang",
    ),
    NcclVar(
        "TORCH_NCCL_BLOCKING_WAIT",
        "0",
        "blocking wait would make the host wait on every collective; async error handling already catches timeouts",
    ),
)
_IB_COMMON = (
    NcclVar("NCCL_IB_DISABLE", "0", "use the InfiniBand verbs transport between nodes"),
    NcclVar(
        "NCCL_NET_GDR_LEVEL",
        "PHB",
        "GPUDirect RDMA up to a shared PCIe host bridge: HGX A100 and H100 boards put GPU and HCA on one",
    ),
    NcclVar(
        "NCCL_IB_TIMEOUT",
        "22",
        "4.096 us * 2^22 ~ 17 s per retry (NCCL's 20: ~4 s): ride out fabric hiccups on large jobs",
    ),
    NcclVar("NCCL_IB_RETRY_CNT", "7", "the most retransmissions IB allows before the queue pair errors out"),
)
# HGX A100 and H100 nodes share everything these variables describe (one HCA per GPU on a rail-optimized
# fabric, GPU and HCA under one PCIe switch); the one difference, NVLink SHARP on H100, NCCL detects
# itself. So both presets export the same variables; they differ in name and in what ``auto`` records.
_IB_RAILS = (
    *_IB_COMMON,
    NcclVar(
        "NCCL_CROSS_NIC",
        "0",
        "rail-optimized fabric (DGX/HGX SuperPOD style): keep each ring on the same NIC rail on every node",
    ),
    *_TORCH_ERRORS,
)

PRESETS: Mapping[str, tuple[NcclVar, ...]] = {
    "a100_ib": _IB_RAILS,
    "h100_ib": _IB_RAILS,
    "a100_roce": (*_IB_COMMON, *_TORCH_ERRORS),
    "ethernet": (
        NcclVar("NCCL_IB_DISABLE", "1", "no RDMA fabric: use TCP sockets between nodes"),
        NcclVar("NCCL_SOCKET_NTHREADS", "4", "more CPU threads per connection to fill a 100 GbE link"),
        NcclVar("NCCL_NSOCKS_PERTHREAD", "4", "several sockets per thread spread a transfer over flows"),
        *_TORCH_ERRORS,
    ),
    "none": (),
}
"""Preset name → its variables, in the order they are exported."""

DEBUG_VARS: tuple[NcclVar, ...] = (
    NcclVar("NCCL_DEBUG", "INFO", "debug: log NCCL's version, topology and transport choices"),
    NcclVar("NCCL_DEBUG_SUBSYS", "INIT,NET", "debug: init and network only, not a line per collective"),
    NcclVar("TORCH_DISTRIBUTED_DEBUG", "DETAIL", "debug: check that all ranks call the same collectives"),
)
"""Variables exported only with ``debug=True``."""
IB_HCA_VAR = "NCCL_IB_HCA"
"""Exported from ``nccl.ib_hca``."""
TOPO_FILE_VAR = "NCCL_TOPO_FILE"
"""Exported from ``nccl.topo_file``."""


def exported_names() -> tuple[str, ...]:
    """Every variable this module may export on a node, whatever the preset: a container must let the host's
    value of each win over its image's (``hpcsweep.sweep.containers``)."""
    names = [var.name for preset in PRESETS.values() for var in preset]
    return tuple(dict.fromkeys([*names, IB_HCA_VAR, TOPO_FILE_VAR, *(var.name for var in DEBUG_VARS)]))


AUTO_PRESET = "auto"
"""``nccl.preset=auto``: an InfiniBand preset where this node has an InfiniBand device, else none."""
NVIDIA_PROC_DIR = "/proc/driver/nvidia/gpus"
"""Where the NVIDIA driver describes each GPU (one ``information`` file per PCI address)."""
_HOPPER = re.compile(r"\b(GH|H)(100|200|800|20)\b")
"""GPU names of the Hopper generation: H100, H200, H800, H20, GH200."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def resolve_preset(preset: str, ib_devices: Sequence[str], gpu_models: Sequence[str] = ()) -> str:
    """The concrete preset for ``preset``. ``auto`` becomes ``none`` when ``ib_devices`` is empty
    (on a laptop, or nodes with only Ethernet, NCCL picks sockets itself), ``h100_ib`` when one of
    ``gpu_models`` is a Hopper GPU, else ``a100_ib`` (A100, or a GPU the driver did not name);
    any other name is returned as it is.
    """
    if preset != AUTO_PRESET:
        return preset
    if not ib_devices:
        return "none"
    return "h100_ib" if any(_HOPPER.search(model) for model in gpu_models) else "a100_ib"


def nccl_settings(
    preset: str,
    *,
    overrides: Mapping[str, str] | None = None,
    debug: bool = False,
    ib_devices: Sequence[str] = (),
    gpu_models: Sequence[str] = (),
    ib_hca: Sequence[str] = (),
    topo_file: str | None = None,
    inherited: Mapping[str, str] | None = None,
) -> tuple[NcclSetting, ...]:
    """Resolve a preset into ordered settings (see the module docstring for precedence).

    ``ib_devices`` (:func:`list_ib_devices`) and ``gpu_models`` (:func:`list_gpu_models`) resolve
    ``auto`` (:func:`resolve_preset`). ``ib_hca`` (``nccl.ib_hca``) pins ``NCCL_IB_HCA`` to those
    HCAs, each of which must be among ``ib_devices``: a name NCCL cannot find would make it fall
    back to TCP sockets without an error. ``topo_file`` is passed through as ``NCCL_TOPO_FILE``.
    Raises ``ValueError`` naming the config key on an unknown preset, a bad override name or an
    HCA this node does not have.
    """
    if preset != AUTO_PRESET and preset not in PRESETS:
        raise ValueError(
            f"nccl.preset: unknown preset {preset!r}; allowed: {', '.join([*PRESETS, AUTO_PRESET])}"
        )
    preset = resolve_preset(preset, ib_devices, gpu_models)
    overrides = dict(overrides or {})
    inherited = inherited or {}
    for name in overrides:
        if not _ENV_NAME.match(name):
            raise ValueError(f"nccl.overrides: {name!r} is not an environment variable name")

    layers: list[tuple[NcclVar, str]] = [(var, "preset") for var in PRESETS[preset]]
    if ib_hca:
        layers.append((_ib_hca_var(ib_hca, ib_devices), "ib_hca"))
    if topo_file:
        layers.append(
            (NcclVar(TOPO_FILE_VAR, topo_file, "the cluster's own PCIe/NVLink topology description"), "topo_file")
        )

    resolved: dict[str, NcclSetting] = {}
    for var, source in layers:
        if var.name in inherited:
            resolved[var.name] = NcclSetting(
                var.name, inherited[var.name], f"inherited environment (preset: {var.value}); {var.reason}", "inherited"
            )
        else:
            resolved[var.name] = NcclSetting(var.name, var.value, var.reason, source)
    if debug:
        for var in DEBUG_VARS:
            resolved[var.name] = NcclSetting(var.name, var.value, var.reason, "debug")
    for name, value in overrides.items():
        previous = resolved.get(name)
        reason = "nccl.overrides" + (f" (was {previous.value}); {previous.reason}" if previous else "")
        resolved[name] = NcclSetting(name, str(value), reason, "overrides")
    return tuple(resolved.values())


def nccl_env(preset: str, **options: Any) -> dict[str, str]:
    """The variables to export for ``preset``, as a plain ``dict`` (keywords as :func:`nccl_settings`)."""
    return {s.name: s.value for s in nccl_settings(preset, **options)}


def _ib_hca_var(ib_hca: Sequence[str], ib_devices: Sequence[str]) -> NcclVar:
    missing = [name for name in ib_hca if name.split(":")[0] not in ib_devices]
    if missing:
        found = ", ".join(sorted(ib_devices, key=_natural_key)) or "none"
        raise ValueError(
            f"nccl.ib_hca: {', '.join(missing)} not found in {IB_SYSFS_DIR} on this node (found: {found})"
        )
    names = list(dict.fromkeys(ib_hca))
    # The leading "=" makes NCCL match names exactly; without it "mlx5_1" also selects mlx5_10.
    return NcclVar(
        IB_HCA_VAR,
        "=" + ",".join(names),
        f"only the {len(names)} HCA(s) nccl.ib_hca lists, matched exactly (not storage ports)",
    )


def _natural_key(name: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def list_ib_devices(sysfs_dir: str = IB_SYSFS_DIR) -> list[str]:
    """The HCA names under ``/sys/class/infiniband`` (empty where the directory does not exist)."""
    try:
        return sorted(os.listdir(sysfs_dir), key=_natural_key)
    except FileNotFoundError:
        return []


def parse_gpu_model(information: str) -> str | None:
    """The ``Model:`` of an NVIDIA driver ``information`` file (``NVIDIA H100 80GB HBM3``), or None."""
    for line in information.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model" and value.strip():
            return value.strip()
    return None


def list_gpu_models(proc_dir: str = NVIDIA_PROC_DIR) -> list[str]:
    """The model name of every GPU the NVIDIA driver lists (empty without the driver).

    Reads files only: asking CUDA would create a context on GPU 0 in this process, which the
    training workers then share for the whole trial.
    """
    try:
        entries = sorted(os.listdir(proc_dir))
    except FileNotFoundError:
        return []
    models = []
    for entry in entries:
        try:
            model = parse_gpu_model(Path(proc_dir, entry, "information").read_text())
        except OSError:  # a GPU going away while we look: it is not this trial's concern
            model = None
        if model:
            models.append(model)
    return models
