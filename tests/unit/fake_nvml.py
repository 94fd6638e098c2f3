"""A fake of ``pynvml`` (``nvidia-ml-py``) with the names the telemetry sampler uses, over GPUs
whose readings a test sets. ``test_telemetry`` checks that every name here exists in the real
``pynvml``; ``benchmarks/gpu_check.py`` proves the real library on a GPU."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace


class NVMLError(Exception):
    """pynvml's base error: ``value`` is the NVML return code, ``str`` its text."""

    TEXT = "Unknown Error"

    def __str__(self) -> str:
        return self.TEXT


class NVMLError_NotSupported(NVMLError):  # pynvml's own class names
    TEXT = "Not Supported"


class NVMLError_GpuIsLost(NVMLError):
    TEXT = "GPU is lost"


class NVMLError_NoPermission(NVMLError):
    TEXT = "Insufficient Permissions"


class NVMLError_NotFound(NVMLError):
    TEXT = "Not Found"


@dataclass
class FakeGpu:
    """What one fake GPU reports; a test changes the fields between samples."""

    uuid: str
    name: str = "NVIDIA H200"
    util: int = 90
    mem_used: int = 40 * 2**30
    mem_total: int = 141 * 2**30
    power_mw: int = 500_000
    sm_clock: int = 1980
    sm_active: float = 70.0
    tensor_active: float = 40.0
    gpm: bool | type[NVMLError] = True
    """True: GPM works; False: the GPU does not support it; an error class: the query raises it."""
    power_error: type[NVMLError] | None = None
    gpm_metrics_error: type[NVMLError] | None = None
    lost: bool = False


@dataclass
class GpmSample:
    gpu: FakeGpu | None = None
    read: tuple[float, float] | None = None


class FakeNvml:
    """The module object the sampler is given."""

    NVML_SUCCESS = 0
    NVML_CLOCK_SM = 1
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_NoPermission = NVMLError_NoPermission

    def __init__(self, gpus: list[FakeGpu], init_error: type[NVMLError] | None = None) -> None:
        self.gpus = {gpu.uuid: gpu for gpu in gpus}
        self.init_error = init_error
        self.inits = self.shutdowns = 0
        self.live_gpm_samples: set[int] = set()

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error()
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        if uuid not in self.gpus:
            raise NVMLError_NotFound()
        return self.gpus[uuid]

    @staticmethod
    def _answering(gpu: FakeGpu) -> FakeGpu:
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        return gpu

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return self._answering(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        gpu = self._answering(handle)
        return SimpleNamespace(total=gpu.mem_total, used=gpu.mem_used, free=gpu.mem_total - gpu.mem_used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._answering(handle).util, memory=0)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        gpu = self._answering(handle)
        if gpu.power_error:
            raise gpu.power_error()
        return gpu.power_mw

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return self._answering(handle).sm_clock

    def nvmlGpmQueryDeviceSupport(self, handle: FakeGpu) -> SimpleNamespace:
        gpu = self._answering(handle)
        if isinstance(gpu.gpm, type):
            raise gpu.gpm()
        return SimpleNamespace(version=1, isSupportedDevice=int(gpu.gpm))

    def nvmlGpmSampleAlloc(self) -> GpmSample:
        sample = GpmSample()
        self.live_gpm_samples.add(id(sample))
        return sample

    def nvmlGpmSampleFree(self, sample: GpmSample) -> None:
        self.live_gpm_samples.remove(id(sample))

    def nvmlGpmSampleGet(self, handle: FakeGpu, sample: GpmSample) -> GpmSample:
        gpu = self._answering(handle)
        sample.gpu, sample.read = gpu, (gpu.sm_active, gpu.tensor_active)
        return sample

    @staticmethod
    def c_nvmlGpmMetricsGet_t() -> SimpleNamespace:
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None,
                               metrics=[SimpleNamespace(metricId=0, nvmlReturn=3, value=0.0) for _ in range(8)])

    def nvmlGpmMetricsGet(self, request: SimpleNamespace) -> SimpleNamespace:
        assert request.version == self.NVML_GPM_METRICS_GET_VERSION and request.sample1 is not request.sample2
        gpu = request.sample2.gpu
        if gpu.gpm_metrics_error:
            raise gpu.gpm_metrics_error()
        sm_active, tensor_active = request.sample2.read
        values = {self.NVML_GPM_METRIC_SM_UTIL: sm_active, self.NVML_GPM_METRIC_ANY_TENSOR_UTIL: tensor_active}
        for metric in request.metrics[: request.numMetrics]:
            metric.value, metric.nvmlReturn = values[metric.metricId], self.NVML_SUCCESS
        return request


PYNVML_NAMES = [name for name in vars(FakeNvml) if name.startswith(("nvml", "NVML", "c_nvml"))]
"""The pynvml names the fake stands in for."""
