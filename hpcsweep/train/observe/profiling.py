"""Profiler traces of chosen steps: ``trainer.profile_steps``, or a running trial's request.

Every rank runs ``torch.profiler`` over the same optimizer steps and writes its own Chrome/Perfetto
JSON trace, ``TRIAL_DIR/profile/steps-START-END/rankR.json``, each step labelled ``step N`` (a
``record_function``). Which steps to profile is a pure function of the window and the step about to
run (``window_from``), so all ranks start and stop together: the config window is the same on every
rank, and a request (``hpcsweep.control.profile_request``) is read by rank 0 and agreed in the
step's stop check, a collective every rank already makes.

A resumed trial does not take a window it has passed, and takes the remaining steps of one it
stopped inside; a stop, early stop or prune inside a window writes the steps taken so far, and a
failure writes them with the failing step's part (``failed_step``). One
profile runs at a time: a request waits while one runs, and a config window that came meanwhile
is taken for its steps still ahead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from hpcsweep.config import TrainerConfig
from hpcsweep.control import profile_request
from hpcsweep.files.atomic import atomic_write_bytes

log = logging.getLogger(__name__)

MEMORY_HISTORY_ENTRIES = 100_000
"""Allocator events a CUDA memory snapshot keeps (the newest): enough for a few steps of a large model."""


@dataclass(frozen=True)
class Window:
    """Optimizer steps ``start``..``end`` (1-based, inclusive, as ``Trainer.step`` counts them after a step)."""

    start: int
    end: int


def window_from(window: Window | None, step: int) -> Window | None:
    """The part of ``window`` to profile when step ``step`` is about to run: None before it starts or
    once it has passed, else ``step``..``end`` (the whole window when ``step`` is its start, its
    remaining steps after a resume or a profile that ran meanwhile)."""
    if window is None or not window.start <= step <= window.end:
        return None
    return Window(step, window.end)


def request_window(step: int, asked_steps: int, max_steps: int) -> Window | None:
    """The window of a request agreed after step ``step``: its next ``asked_steps`` steps, as many as
    the trial has left; None for no request (``asked_steps`` 0)."""
    if asked_steps <= 0:
        return None
    return Window(step + 1, min(step + asked_steps, max_steps))


@dataclass(frozen=True)
class ProfilerOptions:
    """How ``torch.profiler`` runs on one device: what it records, and whether a CUDA memory snapshot is taken."""

    cuda: bool
    profile_memory: bool
    with_stack: bool
    memory_snapshot: bool

    def activities(self) -> list[ProfilerActivity]:
        return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if self.cuda else [])]


def profiler_options(device_type: str, memory: bool, stacks: bool) -> ProfilerOptions:
    """CPU activity always, CUDA kernels on CUDA; ``memory``: allocations in the trace, and on CUDA
    the caching allocator's history as a snapshot too."""
    cuda = device_type == "cuda"
    return ProfilerOptions(cuda=cuda, profile_memory=memory, with_stack=stacks, memory_snapshot=memory and cuda)


def config_window(tcfg: TrainerConfig) -> Window | None:
    """``trainer.profile_steps`` as a window (validated in ``TrainerConfig``)."""
    return Window(*tcfg.profile_steps) if tcfg.profile_steps else None


class StepProfiler:
    """Profiles the chosen steps of one rank: wrap each step in ``step(n)``.

    ``on_trace(summary)`` is called on every rank once its trace is written (the trainer records
    ``summary`` in metrics.json); rank 0 (``is_reader``) reads requests and answers them.
    """

    def __init__(
        self,
        tcfg: TrainerConfig,
        trial_dir: Path,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        is_reader: bool,
        on_trace: Callable[[dict[str, Any]], None],
    ) -> None:
        self.trial_dir, self.rank, self.world_size, self.is_reader = trial_dir, rank, world_size, is_reader
        self.max_steps, self.on_trace = tcfg.max_steps, on_trace
        self.options = profiler_options(device.type, tcfg.profile_memory, tcfg.profile_stacks)
        self.planned = config_window(tcfg)
        self.requested: Window | None = None
        self.request: profile_request.ProfileRequest | None = None
        """On rank 0: the request seen at this step's boundary, then the one being served."""
        self.running: Window | None = None
        self.profiler: profile | None = None
        self.last_done = 0
        """The last step done inside the running profile."""
        self.first_step = True
        self.inside: int | None = None
        """The profiled step under way: set on entering it, cleared once it returns."""

    # ----- requests ----------------------------------------------------------------------------

    def asked_steps(self) -> int:
        """On rank 0, while no profile runs or waits: the steps a waiting request asks for; else 0."""
        if not self.is_reader or self.running or self.requested:
            return 0
        try:
            self.request = profile_request.read_request(self.trial_dir)
        except ValueError as err:
            log.warning("ignoring %s: %s", profile_request.request_path(self.trial_dir), err)
            profile_request.remove_request(self.trial_dir)
            self.request = None
        return self.request.steps if self.request else 0

    def take_request(self, asked_steps: int, step: int) -> None:
        """Every rank, with the ``asked_steps`` all ranks agreed on after step ``step``: profile them next."""
        window = request_window(step, asked_steps, self.max_steps)
        if window is None:
            return
        self.requested = window
        if self.is_reader:
            profile_request.remove_request(self.trial_dir)
            log.info("profile requested: steps %d-%d", self.requested.start, self.requested.end)

    # ----- steps -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self, n: int) -> Iterator[None]:
        """Run step ``n`` (the step about to run): start, label and end the profile around it as chosen."""
        if self.running is None:
            self.start_if_chosen(n)
        if self.running is None:
            yield
            return
        self.inside = n
        with record_function(f"step {n}"):
            yield
        self.inside = None
        self.last_done = n
        if n == self.running.end:
            self.finish(cut_short=False)

    def write_after_failure(self) -> None:
        """The trial failed inside a profile: write the trace up to the failure, failing step included,
        which is what the user will want to look at (nothing when no profile runs). A failure while
        writing is logged, never raised over the trial's own."""
        if self.running is None:
            return
        failed = self.inside if self.inside is not None else self.last_done
        self.last_done = max(self.last_done, failed)
        try:
            self.finish(cut_short=True, failed_step=failed)
        except Exception as err:  # noqa: BLE001 (the trial's exception is the one to report)
            log.warning("profile not written after the failure in step %d: %s", failed, err)
            self.running = self.profiler = self.requested = None

    def start_if_chosen(self, n: int) -> None:
        """Start the profile when step ``n`` is in the requested window, or else in the config's."""
        window = window_from(self.requested, n) or window_from(self.planned, n)
        if self.first_step and self.planned and self.planned.end < n:
            log.info("profile of steps %d-%d: passed before this run began at step %d, not taken again",
                     self.planned.start, self.planned.end, n)
        self.first_step = False
        if window is None:
            return
        if self.requested is None and self.planned and window.start > self.planned.start:
            log.info("profile of steps %d-%d: taking steps %d-%d, the rest of it (this run began inside it, "
                     "or another profile ran meanwhile)", self.planned.start, self.planned.end, window.start, window.end)
        self.running = window
        if self.options.memory_snapshot:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        self.profiler = profile(activities=self.options.activities(), profile_memory=self.options.profile_memory,
                                with_stack=self.options.with_stack)
        self.profiler.start()

    def close(self) -> None:
        """A stop, early stop or prune: write the steps profiled so far (nothing when no profile runs)."""
        if self.running is not None:
            self.finish(cut_short=True)

    def finish(self, cut_short: bool, failed_step: int | None = None) -> None:
        """Stop the running profile after its last step done (or the step that failed, ``failed_step``),
        write this rank's trace, tell ``on_trace``, and on rank 0 answer the request it served."""
        assert self.running is not None and self.profiler is not None
        start, end = self.running.start, self.last_done
        self.profiler.stop()
        path = profile_request.trace_path(start, end, self.rank)
        write_trace(self.profiler, self.trial_dir / path)
        summary: dict[str, Any] = {
            "steps": [start, end],
            "traces": [profile_request.trace_path(start, end, r) for r in range(self.world_size)],
        }
        if failed_step is not None:
            # A rank that failed alone leaves the others' traces unwritten: they are listed as expected.
            summary["failed_step"] = failed_step
        if self.options.memory_snapshot:
            snapshot = profile_request.memory_snapshot_path(start, end, self.rank)
            atomic_write_bytes(self.trial_dir / snapshot, pickle.dumps(torch.cuda.memory._snapshot()))
            torch.cuda.memory._record_memory_history(enabled=None)
            summary["memory_snapshots"] = [
                profile_request.memory_snapshot_path(start, end, r) for r in range(self.world_size)]
        why = f" (cut short by a failure in or after step {failed_step})" if failed_step is not None else (
            " (cut short by the end of this run)" if cut_short else "")
        log.info("profile of steps %d-%d written to %s%s", start, end, self.trial_dir / path, why)
        served = self.requested is not None
        self.running = self.profiler = self.requested = None
        self.on_trace(summary)
        if served and self.is_reader and self.request is not None:
            profile_request.write_done(self.trial_dir, profile_request.ProfileDone(
                id=self.request.id, steps=(start, end), traces=tuple(summary["traces"]), cut_short=cut_short))
            self.request = None


def write_trace(prof: profile, path: Path) -> None:
    """Export ``prof`` as a Chrome/Perfetto JSON trace at ``path``, atomically (a reader never sees half a trace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
