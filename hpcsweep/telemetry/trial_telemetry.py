"""A trial's telemetry as the trainer sees it: started on every rank, sampled on each node's local
rank 0, gathered at log windows, logged and summarised by the rank that writes metrics.json.

The collectives and the logger are the trainer's, passed in: ``gather`` is called on every rank
at every log window (the trainer's log windows are collective points already), with one small
object per node (the other ranks send None). Nothing here imports torch at module level: the login
node may read ``trial_summary``'s keys.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol

from hpcsweep.telemetry import summary
from hpcsweep.telemetry.cpu_sampler import ProcessTreeSampler
from hpcsweep.telemetry.node_sampler import NodeSampler
from hpcsweep.telemetry.nvml_sampler import NvmlSampler, nvml_error_text
from hpcsweep.telemetry.sampler_thread import SamplerThread

log = logging.getLogger(__name__)

GPU_TAGS = {"util_pct": "util", "mem_used_gb": "mem_gb", "power_w": "power_w", "sm_clock_mhz": "sm_clock_mhz"}
"""GPU field -> the last part of its TensorBoard tag, ``sys/gpu{i}/<part>``."""
CPU_TAGS = {"util_pct": "sys/cpu/util", "rss_gb": "sys/cpu/rss_gb"}


class ScalarLogger(Protocol):
    def log(self, metrics: Mapping[str, float | None], step: int) -> None: ...


def load_pynvml() -> ModuleType:
    """The real NVML binding (``nvidia-ml-py``); imported when a trial on GPUs starts sampling."""
    return importlib.import_module("pynvml")


def torch_cuda_uuids(count: int) -> list[str]:
    """NVML UUIDs of CUDA devices 0..count-1 of this process (whatever ``CUDA_VISIBLE_DEVICES`` holds)."""
    import torch  # the worker has it loaded already; the login node never calls this

    return [nvml_uuid(str(torch.cuda.get_device_properties(i).uuid)) for i in range(count)]


def nvml_uuid(cuda_uuid: str) -> str:
    """NVML's name of a GPU from CUDA's UUID: CUDA prints the bare UUID, NVML wants ``GPU-`` before it."""
    return cuda_uuid if cuda_uuid.startswith(("GPU-", "MIG-")) else f"GPU-{cuda_uuid}"


def node_workers(ranks: Sequence[Mapping[str, Any]], rank: int) -> list[Mapping[str, Any]]:
    """The workers of ``rank``'s node agent, from the trainer's gathered ``{"rank", "local_rank", "node",
    "pid"}`` records: the run of ranks from ``rank``'s local rank 0 on, local ranks counting up.

    torchrun numbers each agent's workers consecutively; two agents on one host (a test) stay apart.
    """
    first = rank - ranks[rank]["local_rank"]
    workers = []
    for record in ranks[first:]:
        if record["node"] != ranks[rank]["node"] or record["local_rank"] != len(workers):
            break
        workers.append(record)
    return workers


def open_gpus(load_nvml: Callable[[], ModuleType], uuids: Sequence[str]) -> tuple[NvmlSampler | None, str | None]:
    """An NVML sampler of ``uuids``, or None and why not."""
    if not uuids:
        return None, "the trial trains on CPU: no GPU to read"
    try:
        nvml = load_nvml()
    except ImportError as err:
        return None, f"nvidia-ml-py cannot be imported: {err}"
    try:
        return NvmlSampler.open(nvml, uuids), None
    except nvml.NVMLError as err:
        return None, f"NVML did not start: {nvml_error_text(err)}"


def window_scalars(parts: Sequence[Mapping[str, Any] | None]) -> dict[str, float | None]:
    """TensorBoard scalars of one log window from every node's payload, GPUs numbered across nodes
    (node order, then the node's own order); the CPU's is the largest over nodes."""
    nodes = [p for p in parts if p is not None]
    scalars: dict[str, float | None] = {}
    index = 0
    for node in nodes:
        for means in node["window"]["gpus"]:
            for name, tag in GPU_TAGS.items():
                scalars[f"sys/gpu{index}/{tag}"] = means[name] if means else None
            index += 1
    for name, tag in CPU_TAGS.items():
        values = [n["window"]["cpu"][name] for n in nodes if n["window"]["cpu"] and n["window"]["cpu"][name] is not None]
        scalars[tag] = max(values) if values else None
    return scalars


def trial_summary(parts: Sequence[Mapping[str, Any] | None], interval_s: float) -> dict[str, Any]:
    """metrics.json's ``telemetry`` from every node's summary (see docs/user/telemetry.md)."""
    nodes = [p for p in parts if p is not None]
    gpus = [{"index": index, **gpu} for index, gpu in enumerate(g for node in nodes for g in node["gpus"])]
    reasons = [(node["node"], node["reason"]) for node in nodes if node["reason"] is not None]
    if gpus:
        reason = "; ".join(f"{name}: {why}" for name, why in reasons) or None
    else:
        reason = reasons[0][1] if reasons else None
    return {
        "source": "nvml" if gpus else "cpu",
        "reason": reason,
        "interval_s": interval_s,
        "samples": min((node["samples"] for node in nodes), default=0),
        "gpus": gpus,
        "cpu": {name: summary.max_stats([node["cpu"][name] for node in nodes]) for name in ("util_pct", "rss_gb")},
    }


class TrialTelemetry:
    """The trainer's handle on telemetry: ``start`` on every rank, ``log_window`` at each log window,
    ``report_fields`` into metrics.json, ``close`` at the end. ``interval_s`` 0: it does nothing."""

    def __init__(self, interval_s: float, node: NodeSampler | None, thread: SamplerThread | None,
                 gather: Callable[[Any], list[Any]], is_writer: bool) -> None:
        self.interval_s, self.node, self.thread, self.gather, self.is_writer = interval_s, node, thread, gather, is_writer
        self.summary = trial_summary([node.summary()], interval_s) if is_writer and node is not None else None

    @classmethod
    def start(cls, interval_s: float, *, device_type: str, ranks: Sequence[Mapping[str, Any]], rank: int,
              gather: Callable[[Any], list[Any]], is_writer: bool,
              load_nvml: Callable[[], ModuleType] = load_pynvml,
              cuda_uuids: Callable[[int], list[str]] = torch_cuda_uuids) -> TrialTelemetry:
        """Start sampling on this node when ``rank`` is its local rank 0 (nothing when ``interval_s`` is 0)."""
        if interval_s == 0 or ranks[rank]["local_rank"] != 0:
            return cls(interval_s, None, None, gather, is_writer)
        workers = node_workers(ranks, rank)
        gpus, reason = open_gpus(load_nvml, cuda_uuids(len(workers)) if device_type == "cuda" else [])
        if reason:
            log.info("telemetry samples CPU and memory only: %s", reason)
        node = NodeSampler(ranks[rank]["node"], gpus, reason, ProcessTreeSampler(w["pid"] for w in workers))
        thread = SamplerThread(node.sample, interval_s)
        thread.start()
        return cls(interval_s, node, thread, gather, is_writer)

    def log_window(self, step: int, logger: ScalarLogger) -> None:
        """At a log window, on every rank: gather the nodes' samples; the writer logs and summarises them."""
        if self.interval_s == 0:
            return
        parts = self.gather(self.node_payload())
        if self.is_writer:
            logger.log(window_scalars(parts), step)
            self.summary = trial_summary(parts, self.interval_s)

    def node_payload(self) -> dict[str, Any] | None:
        """This node's part of a log window (None on a rank that does not sample); a sampling thread
        that failed says so in the node's reason."""
        if self.node is None or self.thread is None:
            return None
        payload = self.node.payload()
        if self.thread.error:
            payload["reason"] = "; ".join(filter(None, [payload["reason"], f"sampling stopped: {self.thread.error}"]))
        return payload

    def report_fields(self) -> dict[str, Any]:
        """``{"telemetry": ...}`` for metrics.json on the writer; nothing elsewhere or when disabled."""
        return {"telemetry": self.summary} if self.summary is not None else {}

    def close(self) -> None:
        """Stop sampling and release NVML (safe to call twice)."""
        if self.thread is not None:
            self.thread.stop()
        if self.node is not None:
            self.node.close()
            self.node = None
