"""Where a log window's time goes: waiting for data, forward+backward, the optimizer step, checkpoint
blocking, logging, and the rest.

The trainer marks where each phase begins (``StepTimer.enter``, or ``phase`` around a call); the time
up to the next mark belongs to that phase. At the end of each log window (``end_window``) the intervals
are read and summed into metrics.json's ``step_time`` (that window) and ``step_time_total`` (every window
of every run of the trial: a resume goes on from the total its last run left), and TensorBoard's
``time/*_pct`` and ``mem/peak_gb``.

The marks come from a clock chosen by device type (``clock_for``). On CPU, ``HostClock`` reads
``time.perf_counter``. On CUDA, ``CudaEventClock`` records a ``torch.cuda.Event(enable_timing=True)`` on
the current stream, which costs no sync; the window's end waits for its last event once and only then
reads the intervals' ``elapsed_time``. CUDA intervals are on the GPU's timeline, so they show what the
GPU did: a step whose host work (a slow batch read) leaves the GPU idle shows as data time, while host
work that overlaps queued kernels does not. The accounting (``window_record``, ``add_window``) is pure.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

PHASES = ("data", "compute", "optimizer", "checkpoint", "logging")
"""The timed phases; ``compute`` is forward and backward over every micro-batch of a step."""
OTHER = "other"
"""Everything else in a window (evaluation, step hooks, stop checks): its wall less the phases."""
SECONDS_KEYS = tuple(f"{phase}_s" for phase in (*PHASES, OTHER))
TOTAL_KEYS = ("steps", "seconds", *SECONDS_KEYS)
"""What ``step_time_total`` sums; its percentages are derived from these."""
GIB = 2**30


def percent(part: float, whole: float) -> float:
    """``part`` as a percentage of ``whole`` (0 for an empty whole)."""
    return 100.0 * part / whole if whole > 0 else 0.0


def with_percentages(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (``seconds`` and every ``SECONDS_KEYS``) with each phase's ``*_pct`` of ``seconds``."""
    return {**record, **{f"{phase}_pct": percent(record[f"{phase}_s"], record["seconds"]) for phase in PHASES}}


def window_record(
    steps: int, wall_s: float, phase_s: Mapping[str, float], *, tokens_per_s: float, mfu: float | None,
    peak_bytes: int, peak_source: str,
) -> dict[str, Any]:
    """metrics.json's ``step_time`` for one window of ``steps`` steps over ``wall_s`` seconds.

    ``phase_s`` holds the seconds of each of ``PHASES`` (a missing one is 0); ``other_s`` is the rest of
    the wall. On CUDA the phases are GPU-timeline intervals and may add up to a little more than the
    host's wall; then the window is their sum, so the percentages never pass 100 together.
    """
    named = {f"{phase}_s": float(phase_s.get(phase, 0.0)) for phase in PHASES}
    seconds = max(wall_s, sum(named.values()))
    record = {"steps": steps, "seconds": seconds, **named, "other_s": seconds - sum(named.values())}
    return {
        **with_percentages(record), "tokens_per_s": tokens_per_s, "mfu": mfu,
        "peak_memory_gb": peak_bytes / GIB, "peak_memory_source": peak_source,
    }


def add_window(total: Mapping[str, Any] | None, window: Mapping[str, Any]) -> dict[str, Any]:
    """``step_time_total``: the steps and seconds of ``total`` (None: no window yet) plus ``window``'s,
    with the percentages of the sum."""
    summed = {key: (total[key] if total else 0) + window[key] for key in TOTAL_KEYS}
    return with_percentages(summed)


def carried_total(previous: Any) -> dict[str, Any] | None:
    """The ``step_time_total`` an earlier run of the trial left in metrics.json, to go on summing;
    None when there is none or it lacks a key (a trial from before the key)."""
    def is_number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    if not isinstance(previous, Mapping) or not all(is_number(previous.get(key)) for key in TOTAL_KEYS):
        return None
    return with_percentages({key: previous[key] for key in TOTAL_KEYS})


def tensorboard_scalars(window: Mapping[str, Any] | None) -> dict[str, float]:
    """The window's TensorBoard scalars: ``time/{phase}_pct`` and ``mem/peak_gb`` (none without a window)."""
    if window is None:
        return {}
    return {**{f"time/{phase}_pct": window[f"{phase}_pct"] for phase in PHASES}, "mem/peak_gb": window["peak_memory_gb"]}


class PhaseClock(Protocol):
    """Marks in time: ``mark`` now, ``settle`` before reading, then ``elapsed_s`` between two marks."""

    def mark(self) -> Any: ...

    def settle(self, last: Any) -> None: ...

    def elapsed_s(self, start: Any, end: Any) -> float: ...

    def release(self, marks: list[Any]) -> None: ...


class HostClock:
    """Marks on the host's clock (``time.perf_counter``): nothing is queued, nothing to wait for."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now

    def mark(self) -> float:
        return self.now()

    def settle(self, last: float) -> None:
        """Nothing to wait for."""

    def elapsed_s(self, start: float, end: float) -> float:
        return end - start

    def release(self, marks: list[float]) -> None:
        """Nothing to reuse."""


def cuda_timing_event() -> Any:
    """A CUDA event that records time (``torch.cuda.Event(enable_timing=True)``)."""
    import torch

    return torch.cuda.Event(enable_timing=True)


class CudaEventClock:
    """Marks as CUDA events on the current stream: recording one does not wait for the GPU.

    ``settle`` waits for the window's last event, once; every earlier event has completed by then, so
    ``elapsed_s`` reads them without another sync. Events read are kept for reuse (``release``).
    ``new_event`` makes an event; tests pass a fake.
    """

    def __init__(self, new_event: Callable[[], Any] = cuda_timing_event) -> None:
        self.new_event = new_event
        self.free: list[Any] = []

    def mark(self) -> Any:
        event = self.free.pop() if self.free else self.new_event()
        event.record()
        return event

    def settle(self, last: Any) -> None:
        last.synchronize()

    def elapsed_s(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000.0  # milliseconds

    def release(self, marks: list[Any]) -> None:
        self.free.extend(marks)


def clock_for(device_type: str) -> PhaseClock:
    """The clock that times phases on a device of ``device_type`` (``cuda``: events; else the host's)."""
    return CudaEventClock() if device_type == "cuda" else HostClock()


class WindowPeak(Protocol):
    """A window's peak memory: ``(bytes, "cuda" | "rss")`` (``memory_record.PeakMemory``)."""

    def window_peak(self) -> tuple[int, str]: ...


class StepTimer:
    """Times the phases of each log window on ``clock``; ``wall`` is the host clock of the window."""

    def __init__(self, clock: PhaseClock, memory: WindowPeak, wall: Callable[[], float] = time.perf_counter) -> None:
        self.clock, self.memory, self.wall = clock, memory, wall
        self.current = OTHER
        self.marks: list[Any] = []
        self.intervals: list[tuple[str, Any, Any]] = []
        self.window_start = 0.0
        self.window_start_step = 0
        self.last: dict[str, Any] | None = None
        self.total: dict[str, Any] | None = None

    def start(self, step: int, earlier_total: Any = None) -> None:
        """Open the first window at ``step``; marks before this are ignored. ``earlier_total``: the
        ``step_time_total`` of the trial's earlier runs, which this run's windows add to."""
        self.marks, self.intervals, self.current = [self.clock.mark()], [], OTHER
        self.window_start, self.window_start_step = self.wall(), step
        self.total = carried_total(earlier_total)

    def enter(self, phase: str) -> None:
        """From now on the time belongs to ``phase`` (one of ``PHASES``, or ``OTHER``)."""
        if self.marks and not phase == self.current == OTHER:
            self.close_interval()
            self.current = phase

    def close_interval(self) -> None:
        """Mark now: the time since the last mark belongs to the current phase (``OTHER``'s is not kept)."""
        mark = self.clock.mark()
        if self.current != OTHER:
            self.intervals.append((self.current, self.marks[-1], mark))
        self.marks.append(mark)

    @contextlib.contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        """Time a block as ``phase``, then go back to the phase it interrupted."""
        interrupted = self.current
        self.enter(phase)
        try:
            yield
        finally:
            self.enter(interrupted)

    def end_window(self, step: int, *, tokens_per_s: float, mfu: float | None) -> dict[str, Any]:
        """Close the window at ``step`` (the phase under way goes on into the next one); its record."""
        self.close_interval()
        last = self.marks[-1]
        self.clock.settle(last)
        now = self.wall()
        phase_s = dict.fromkeys(PHASES, 0.0)
        for phase, start, end in self.intervals:
            phase_s[phase] += self.clock.elapsed_s(start, end)
        self.clock.release(self.marks[:-1])
        peak_bytes, peak_source = self.memory.window_peak()
        self.last = window_record(step - self.window_start_step, now - self.window_start, phase_s,
                                  tokens_per_s=tokens_per_s, mfu=mfu, peak_bytes=peak_bytes, peak_source=peak_source)
        self.total = add_window(self.total, self.last)
        self.marks, self.intervals = [last], []
        self.window_start, self.window_start_step = now, step
        return self.last

    def report(self) -> dict[str, Any]:
        """metrics.json's ``step_time`` and ``step_time_total``; empty before the first window ends."""
        return {} if self.last is None else {"step_time": self.last, "step_time_total": self.total}


class NoStepTimer:
    """``trainer.step_timing=false``, and every rank but the one that logs: times nothing."""

    def start(self, step: int, earlier_total: Any = None) -> None:
        """Nothing to start."""

    def enter(self, phase: str) -> None:
        """Nothing to time."""

    @contextlib.contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        yield

    def end_window(self, step: int, *, tokens_per_s: float, mfu: float | None) -> None:
        return None

    def report(self) -> dict[str, Any]:
        return {}


def build_step_timer(device_type: str, memory: WindowPeak, *, enabled: bool) -> StepTimer | NoStepTimer:
    """The trainer's step timer: on ``device_type``'s clock when ``enabled``, else one that times nothing."""
    return StepTimer(clock_for(device_type), memory) if enabled else NoStepTimer()
