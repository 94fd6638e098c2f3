"""One reading of every GPU a node gives the trial, through NVML (``pynvml`` of ``nvidia-ml-py``).

The NVML module is a parameter, never imported here: the real one is ``pynvml``, a unit test passes
a fake with the same names. Each GPU is opened by its UUID, so the index order of
``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER`` and a Slurm cgroup cannot make it read another
trial's GPU. A field that the GPU does not support (``NVMLError_NotSupported`` when it is opened) is
null with that reason; any NVML error while reading a GPU marks that GPU lost, with the error, and
the other GPUs go on. SM-active and tensor-active % come from GPM (Hopper and later), over the time
between two readings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

GIB = 2**30

FIELDS = ("util_pct", "mem_used_gb", "power_w", "sm_clock_mhz")
"""What every reading of a GPU holds, besides the GPM fields."""
GPM_FIELDS = ("sm_active_pct", "tensor_active_pct")


def field_readers(nvml: ModuleType) -> dict[str, Callable[[Any], float]]:
    """``{field: read(handle)}`` in the units the summary reports (%, GiB, W, MHz)."""
    return {
        "util_pct": lambda h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
        "mem_used_gb": lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used / GIB,
        "power_w": lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,  # NVML reports milliwatts
        "sm_clock_mhz": lambda h: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
    }


def nvml_error_text(err: Exception) -> str:
    """``NVMLError_GpuIsLost: GPU is lost``: the class pynvml maps the error code to, and its text."""
    return f"{type(err).__name__}: {err}"


Reading = dict[str, float | None]
"""One GPU's values at one time (``FIELDS`` and ``GPM_FIELDS``); None where the GPU does not give it."""


@dataclass
class Gpu:
    """One GPU of the node, as NVML opened it."""

    uuid: str
    name: str
    mem_total_gb: float | None
    handle: Any = None
    unsupported: dict[str, str] = field(default_factory=dict)
    """``{field: why it is null}`` for the fields this GPU does not give (GPM's included)."""
    lost: str | None = None
    """Why this GPU stopped answering, or None."""
    gpm_sample: Any = None
    """GPM's last sample of this GPU: the start of the next SM-active interval."""


class NvmlSampler:
    """Reads a node's GPUs through ``nvml``; ``open`` (by the GPUs' UUIDs) and ``close`` bracket its use."""

    def __init__(self, nvml: ModuleType, gpus: list[Gpu]) -> None:
        self.nvml, self.gpus = nvml, gpus
        self.readers = field_readers(nvml)

    @classmethod
    def open(cls, nvml: ModuleType, uuids: Sequence[str]) -> NvmlSampler:
        """Initialise NVML and open each GPU; raises ``nvml.NVMLError`` where NVML itself cannot start.

        A GPU that cannot be opened is kept, marked lost: the summary then says which one and why.
        """
        nvml.nvmlInit()
        sampler = cls(nvml, [])
        sampler.gpus = [sampler._open_gpu(uuid) for uuid in uuids]
        return sampler

    def _open_gpu(self, uuid: str) -> Gpu:
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            gpu = Gpu(uuid, nvml.nvmlDeviceGetName(handle), nvml.nvmlDeviceGetMemoryInfo(handle).total / GIB, handle)
        except nvml.NVMLError as err:
            return Gpu(uuid, "?", None, lost=f"could not be opened: {nvml_error_text(err)}")
        for name, read in self.readers.items():
            try:
                read(handle)
            except nvml.NVMLError_NotSupported as err:
                gpu.unsupported[name] = f"not supported on this GPU ({nvml_error_text(err)})"
            except nvml.NVMLError as err:
                gpu.lost = f"{name} could not be read: {nvml_error_text(err)}"
                return gpu
        self._start_gpm(gpu)
        return gpu

    def _start_gpm(self, gpu: Gpu) -> None:
        nvml = self.nvml
        try:
            if nvml.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice:
                gpu.gpm_sample = self._gpm_sample(gpu)
                return
            why = "GPM is not supported on this GPU (nvmlGpmQueryDeviceSupport: Hopper or later)"
        except nvml.NVMLError as err:
            why = f"GPM is not available: {nvml_error_text(err)}"
        for name in GPM_FIELDS:
            gpu.unsupported[name] = why

    def _gpm_sample(self, gpu: Gpu) -> Any:
        """A new GPM sample of ``gpu`` (freed again if taking it fails)."""
        sample = self.nvml.nvmlGpmSampleAlloc()
        try:
            self.nvml.nvmlGpmSampleGet(gpu.handle, sample)
        except self.nvml.NVMLError:
            self._free_sample(sample)
            raise
        return sample

    def read(self) -> list[Reading | None]:
        """One reading per GPU, in order; None for a GPU that is lost (now or before)."""
        return [self._read_gpu(gpu) if gpu.lost is None else None for gpu in self.gpus]

    def _read_gpu(self, gpu: Gpu) -> Reading | None:
        nvml = self.nvml
        values: Reading = {}
        try:
            for name, read in self.readers.items():
                values[name] = None if name in gpu.unsupported else read(gpu.handle)
        except nvml.NVMLError as err:
            gpu.lost = nvml_error_text(err)
            self._free_gpm(gpu)
            return None
        values.update(self._read_gpm(gpu))
        return values

    def _read_gpm(self, gpu: Gpu) -> dict[str, float | None]:
        """SM-active and tensor-active % since the GPU's previous GPM sample (None without GPM)."""
        nvml = self.nvml
        if gpu.gpm_sample is None:
            return dict.fromkeys(GPM_FIELDS)
        try:
            now = self._gpm_sample(gpu)
        except nvml.NVMLError as err:
            return self._stop_gpm(gpu, err)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_FIELDS)
        request.sample1, request.sample2 = gpu.gpm_sample, now
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        try:
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError as err:
            self._free_sample(now)
            return self._stop_gpm(gpu, err)
        self._free_sample(gpu.gpm_sample)
        gpu.gpm_sample = now
        return {name: float(metric.value) if metric.nvmlReturn == nvml.NVML_SUCCESS else None
                for name, metric in zip(GPM_FIELDS, request.metrics)}

    def _stop_gpm(self, gpu: Gpu, err: Exception) -> dict[str, None]:
        """GPM failed on a GPU that still answers (profiling may be restricted to admins): null from now on."""
        self._free_gpm(gpu)
        for name in GPM_FIELDS:
            gpu.unsupported[name] = f"GPM stopped: {nvml_error_text(err)}"
        return dict.fromkeys(GPM_FIELDS)

    def _free_gpm(self, gpu: Gpu) -> None:
        if gpu.gpm_sample is not None:
            sample, gpu.gpm_sample = gpu.gpm_sample, None
            self._free_sample(sample)

    def _free_sample(self, sample: Any) -> None:
        try:
            self.nvml.nvmlGpmSampleFree(sample)
        except self.nvml.NVMLError:
            pass  # its GPU is gone, and the sample with it

    def close(self) -> None:
        """Free GPM's samples and shut NVML down (pynvml counts its inits: other users keep theirs)."""
        for gpu in self.gpus:
            self._free_gpm(gpu)
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass  # shutting down a library whose GPUs are lost can fail; nothing is left to release
