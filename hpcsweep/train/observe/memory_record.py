"""A worker's memory plan against its real device, and the peak it measured: both for metrics.json.

``memory_plan`` is ``hpcsweep.memory_plan``'s estimate for this trial as it runs here (the precision
and attention kernel resolved, the real world size), compared with this GPU's total memory (on
CPU: compared with nothing). ``memory_peak`` is what rank 0 measured: on CUDA
``torch.cuda.max_memory_allocated``, comparable with the plan's ``tensors_bytes`` (the plan less
its fixed overhead, which the caching allocator does not see); on CPU the process's peak resident
set (Linux: ``VmHWM``; elsewhere ``ru_maxrss``), which also counts the interpreter and every library. ``PeakMemory`` also gives
each log window its own peak (``hpcsweep.train.observe.step_timer``) without losing the trial's.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from hpcsweep.memory_plan.gpu_memory import GpuMemory
from hpcsweep.memory_plan import plan_memory, plan_record, resolve_parallel, setup_of_trial, shape_of_trial
from hpcsweep.model.record import ModelRecord


def device_memory(device: torch.device) -> GpuMemory | None:
    """This CUDA device's total memory; None on CPU."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return GpuMemory(props.total_memory, props.name, "torch.cuda.get_device_properties")


def worker_memory_plan(cfg: Any, world_size: int, device: torch.device, precision: str, attention: str,
                       model_record: ModelRecord | None = None) -> dict[str, Any]:
    """metrics.json's ``memory_plan`` for trial ``cfg`` on ``world_size`` workers of ``device``,
    with the resolved ``precision`` and ``attention`` kernel; a model folder's shape is that of its
    ``config.json`` as ``model_record`` holds it (the runner's record), else as read now."""
    gpu = device_memory(device)
    try:
        shape = shape_of_trial(cfg.model, model_record)
    except ValueError as err:  # a pretrained folder of an architecture the plan does not know
        return {"verdict": "not planned", "error": str(err)}
    setup = replace(
        setup_of_trial(cfg, world_size=world_size, device=device.type, record=model_record),
        precision=precision, fused_attention=attention != "eager", flash_attention=attention.startswith("flash"),
    )
    if setup.parallel == "auto":
        setup = replace(setup, parallel=resolve_parallel(shape, setup, gpu))
    return plan_record(plan_memory(shape, setup), setup, gpu)


def planned_parallel(record: dict[str, Any]) -> str | None:
    """The parallel mode a ``worker_memory_plan`` record planned with (``trainer.parallel=auto``
    resolved by the plan: ``fsdp`` when DDP does not fit this GPU); None when nothing was planned."""
    return (record.get("setup") or {}).get("parallel")


def reset_peak(device: torch.device) -> None:
    """Start this trial's CUDA peak afresh (trials packed into one process follow one another); on
    CPU the resident-set peak cannot be reset."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def measured_peak(device: torch.device) -> dict[str, Any]:
    """metrics.json's ``memory_peak``: this process's peak so far, in bytes, and what measured it."""
    if device.type == "cuda":
        return {"bytes": torch.cuda.max_memory_allocated(device), "source": "torch.cuda.max_memory_allocated"}
    high_water = resident_high_water()
    if high_water is not None:
        return {"bytes": high_water, "source": "VmHWM"}
    # Linux reports ru_maxrss in KiB, macOS in bytes.
    scale = 1 if sys.platform == "darwin" else 1024
    return {"bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, "source": "ru_maxrss"}


def resident_high_water(status: Path = Path("/proc/self/status")) -> int | None:
    """This process's own resident-set peak in bytes (Linux's ``VmHWM``), or None where there is none.

    Not ``ru_maxrss``: Linux carries that over ``execve`` from the process that started this one, so a
    worker spawned by a large parent (a test runner, an agent with torch imported) would report the
    parent's resident set as its own peak."""
    try:
        text = status.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


class PeakMemory:
    """The peak memory of each log window and of the whole trial, from one counter.

    On CUDA a window's peak is ``torch.cuda.max_memory_allocated`` since the window before, whose end
    reset the counter; the trial's is the largest of those and the counter's now. On CPU the
    resident-set peak (``VmHWM``) never resets: each window's peak is the process's so far, and the
    trial's the largest of those and the reading now.
    Built at the trial's start, it starts the CUDA peak afresh (``reset_peak``).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.earlier_windows_bytes = 0
        reset_peak(device)

    def window_peak(self) -> tuple[int, str]:
        """``(bytes, source)``: the peak since the last call (``cuda``), or the process's so far (``rss``)."""
        peak = measured_peak(self.device)["bytes"]
        # Kept on CPU too: Linux folds the resident set into VmHWM only at some unmaps, so a later
        # reading can be a little lower than an earlier one, and the trial's peak must not be.
        self.earlier_windows_bytes = max(self.earlier_windows_bytes, peak)
        if self.device.type != "cuda":
            return peak, "rss"
        torch.cuda.reset_peak_memory_stats(self.device)
        return peak, "cuda"

    def trial_peak(self) -> dict[str, Any]:
        """metrics.json's ``memory_peak``, as ``measured_peak`` has it, over every window so far."""
        record = measured_peak(self.device)
        return {**record, "bytes": max(record["bytes"], self.earlier_windows_bytes)}
