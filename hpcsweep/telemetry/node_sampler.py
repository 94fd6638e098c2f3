"""What one node samples for its trial: its GPUs through NVML where it can, always its workers' CPU.

``NodeSampler.sample`` runs on the sampling thread: it reads, stores, and refreshes the node's
summary. ``payload`` runs on the training thread at a log window: it hands over that summary and
the window's means (the samples since the previous window), a small object whatever the run's length.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from hpcsweep.telemetry import summary
from hpcsweep.telemetry.cpu_sampler import ProcessTreeSampler
from hpcsweep.telemetry.nvml_sampler import FIELDS, GPM_FIELDS, Gpu, NvmlSampler

GPU_FIELDS = (*FIELDS, *GPM_FIELDS)
CPU_FIELDS = ("util_pct", "rss_gb")


class Series:
    """Sample times and one float column per field, grown in place (NaN: not read at that time)."""

    def __init__(self, fields: Sequence[str]) -> None:
        self.fields = tuple(fields)
        self.n = 0
        self._times = np.empty(64)
        self._columns = np.empty((len(self.fields), 64))

    def append(self, t: float, values: Mapping[str, float | None]) -> None:
        if self.n == self._times.size:
            self._times = np.resize(self._times, 2 * self.n)
            self._columns = np.concatenate([self._columns, np.empty_like(self._columns)], axis=1)
        self._times[self.n] = t
        self._columns[:, self.n] = [np.nan if values.get(f) is None else values[f] for f in self.fields]
        self.n += 1

    @property
    def times(self) -> np.ndarray:
        return self._times[: self.n]

    def column(self, name: str, start: int = 0) -> np.ndarray:
        return self._columns[self.fields.index(name), start: self.n]

    def means(self, start: int) -> dict[str, float | None] | None:
        """Each field's mean over the samples from index ``start`` on; None when there is none."""
        if start >= self.n:
            return None
        means = {}
        for name in self.fields:
            values = self.column(name, start)
            values = values[~np.isnan(values)]
            means[name] = round(float(values.mean()), summary.DIGITS) if values.size else None
        return means


def null_reason(gpu: Gpu, name: str, series: Series) -> str:
    """Why GPU field ``name`` has no statistics."""
    if name in gpu.unsupported:
        return gpu.unsupported[name]
    if gpu.lost is not None and series.n == 0:
        return f"the GPU was lost before its first sample: {gpu.lost}"
    if series.n == 0:
        return "no sample yet (the first is taken trainer.telemetry_every_s after the start)"
    return "NVML gave no value"


def gpu_summary(node: str, gpu: Gpu, series: Series, start: float) -> dict[str, Any]:
    """One GPU's part of metrics.json's ``telemetry.gpus`` (without its trial-global index)."""
    fields = {name: summary.stats(series.column(name)) for name in GPU_FIELDS}
    energy = summary.energy_j(start, series.times, series.column("power_w"))
    reasons = {name: null_reason(gpu, name, series) for name, value in fields.items() if value is None}
    if energy is None:
        reasons["energy_j"] = reasons.get("power_w", "power was not read at every sample")
    return {"node": node, "name": gpu.name, "uuid": gpu.uuid, "mem_total_gb": gpu.mem_total_gb, **fields,
            "energy_j": energy, "gpu_hours": summary.gpu_hours(start, series.times), "lost": gpu.lost,
            "reasons": reasons}


class NodeSampler:
    """The samples of one node: its GPUs (``gpus``: None where NVML is absent, ``reason`` says why)
    and the CPU and memory of its workers' process tree (``cpu``)."""

    def __init__(self, node: str, gpus: NvmlSampler | None, reason: str | None, cpu: ProcessTreeSampler,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node, self.gpus, self.reason, self.cpu, self.clock = node, gpus, reason, cpu, clock
        self.start = clock()
        self.cpu.read(self.start)  # the start of the first CPU interval
        self.gpu_series = [Series(GPU_FIELDS) for _ in (gpus.gpus if gpus is not None else ())]
        self.cpu_series = Series(CPU_FIELDS)
        self.rounds = 0
        self._window_start = [0] * (len(self.gpu_series) + 1)  # per GPU, then the CPU
        self._lock = threading.Lock()
        self._summary = self._summarize()

    def sample(self) -> None:
        """One round: every GPU that still answers, then the CPU; the node's summary refreshed."""
        readings = self.gpus.read() if self.gpus is not None else []
        t = self.clock()
        cpu = self.cpu.read(t)
        with self._lock:
            for series, reading in zip(self.gpu_series, readings):
                if reading is not None:
                    series.append(t, reading)
            self.cpu_series.append(t, {"util_pct": cpu.util_pct, "rss_gb": cpu.rss_gb})
            self.rounds += 1
        # Only this thread appends, so the summary is computed outside the lock, off the training thread's way.
        fresh = self._summarize()
        with self._lock:
            self._summary = fresh

    def _summarize(self) -> dict[str, Any]:
        gpus = self.gpus.gpus if self.gpus is not None else []
        return {
            "node": self.node,
            "source": "nvml" if self.gpus is not None else "cpu",
            "reason": self.reason,
            "samples": self.rounds,
            "gpus": [gpu_summary(self.node, gpu, series, self.start) for gpu, series in zip(gpus, self.gpu_series)],
            "cpu": {name: summary.stats(self.cpu_series.column(name)) for name in CPU_FIELDS},
        }

    def summary(self) -> dict[str, Any]:
        """The node's summary as of its last sample."""
        with self._lock:
            return self._summary

    def payload(self) -> dict[str, Any]:
        """The summary plus the means of the samples since the previous ``payload``: what rank 0 gets
        from this node at a log window."""
        with self._lock:
            everything = [*self.gpu_series, self.cpu_series]
            means = [series.means(start) for series, start in zip(everything, self._window_start)]
            self._window_start = [series.n for series in everything]
            return {**self._summary, "window": {"gpus": means[:-1], "cpu": means[-1]}}

    def close(self) -> None:
        if self.gpus is not None:
            self.gpus.close()
