"""Run a local sweep's trials several at a time, each in its own process (``hpcsweep.sweep.local_trial``).

Trials start in order as slots and GPUs come free (``hpcsweep.sweep.local_slots``). A trial that
fails does not stop the others. A stop signal to the sweep (Ctrl-C, SIGTERM, USR2) goes on to
every running trial, which stops as its app stops on it (hpcsweep's: with a checkpoint); no
further trial starts, and once the running ones have ended the run returns ``SweepStopped``. A trial
that stops on its own (a signal of its own) ends the sweep the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from hpcsweep.sweep.fork_server import TrialStarter
from hpcsweep.sweep.hooks import SweepStopped, SweepTrial
from hpcsweep.sweep.local_slots import LocalPlan, LocalSlot, take_gpus, trial_environment, trial_gpu_count
from hpcsweep.sweep.local_trial import Exited, NotStarted, Returned, Stopped, TrialOutcome, TrialProcess, start_trial

log = logging.getLogger(__name__)

# How often the sweep looks for ended trial processes; a trial takes seconds at the least.
POLL_S = 0.1


def trials_named(nums: Sequence[int]) -> str:
    """``trial #3`` or ``trials #3, #4``."""
    return ("trial " if len(nums) == 1 else "trials ") + ", ".join(f"#{num}" for num in nums)


def stop_summary(reason: str | None, stopped: Sequence[str], ended: Sequence[int], not_started: Sequence[int]) -> str:
    """One line for a stopped sweep: each stopped trial's own words, then the trials that ended
    without saying how, then those never started.

    ``reason`` is the sweep's stop signal's (None when only a trial stopped); it is said once, first.
    """
    parts = [*stopped[:1], *(part.removeprefix(f"{reason}: ") for part in stopped[1:])]
    if ended:
        parts.append(f"{trials_named(ended)} ended without a checkpoint")
    if not_started:
        parts.append(f"{trials_named(not_started)} {'was' if len(not_started) == 1 else 'were'} not started")
    line = "; ".join(parts)
    return line if stopped else f"{reason}: {line}"


def failed_return(trial: SweepTrial, outcome: Exited) -> JobReturn:
    """The JobReturn of a trial whose process ended without one: failed, saying how it ended."""
    how = f"was killed by signal {-outcome.returncode}" if outcome.returncode < 0 else f"exited with code {outcome.returncode}"
    detail = f" ({outcome.detail})" if outcome.detail else " before it returned (its output is above)"
    error = RuntimeError(f"trial #{trial.num}'s process {how}{detail}")
    return JobReturn(overrides=list(trial.overrides), status=JobStatus.FAILED, _return_value=error)


@dataclass
class _Running:
    trial: SweepTrial
    process: TrialProcess
    slot: LocalSlot
    gpus: tuple[str, ...]


@dataclass
class _StopForwarder:
    """Passes every stop signal the sweep gets on to the running trials, and keeps the first reason."""

    running: dict[int, _Running] = field(default_factory=dict)
    reason: str | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        from hpcsweep.control.stop import stop_reason

        if self.reason is None:
            self.reason = stop_reason(signum)
            log.warning("stop signal (%s): stopping %d running trial(s); no further trial starts",
                        self.reason, len(self.running))
        for running in list(self.running.values()):
            running.process.process.send_signal(signum)


class _LocalRun:
    """One local run's state: the trials waiting in order, those running, how the others ended, what is free."""

    def __init__(
        self, trials: Sequence[SweepTrial], plan: LocalPlan, context_file: Path, starter: TrialStarter
    ) -> None:
        self.trials, self.plan, self.context_file, self.starter = list(trials), plan, context_file, starter
        self.waiting = list(trials)
        self.free_slots, self.free_gpus = list(plan.slots), plan.gpu_ids
        self.forwarder = _StopForwarder()
        self.outcomes: dict[int, TrialOutcome] = {}

    @property
    def stopping(self) -> bool:
        """A stop signal came, or a trial stopped (or refused to start) on a signal of its own."""
        return self.forwarder.reason is not None or any(
            isinstance(outcome, (Stopped, NotStarted)) for outcome in self.outcomes.values()
        )

    def start_ready(self) -> None:
        """Start the next trials in order while a slot and their GPUs are free (none once stopping)."""
        from hpcsweep.control.stop import stop_signals_blocked

        while self.waiting and self.free_slots and not self.stopping:
            trial = self.waiting[0]
            allocation = trial.allocation
            taken = take_gpus(self.free_gpus, trial_gpu_count(self.plan, allocation.gpus_per_node, allocation.gpus_key))
            if taken is None:
                return
            gpus, self.free_gpus = taken
            slot = self.free_slots.pop(0)
            self.waiting.pop(0)
            # Blocked, so that a signal now reaches the new process once, after it is registered.
            with stop_signals_blocked():
                process = start_trial(
                    self.starter.start, self.context_file, trial.overrides, trial.num, slot.cpus,
                    trial_environment(self.plan, gpus), checked=trial.app_config,
                )
                self.forwarder.running[trial.num] = _Running(trial, process, slot, gpus)
            log.info("trial #%d started (pid %d, CPUs %s%s)", trial.num, process.process.pid,
                     ",".join(map(str, slot.cpus)), f", GPUs {','.join(gpus)}" if self.plan.gpu_ids else "")

    def collect_ended(self) -> None:
        """Take the outcome of every trial process that has exited, and free its slot and GPUs."""
        for num, running in list(self.forwarder.running.items()):
            if running.process.process.poll() is None:
                continue
            del self.forwarder.running[num]
            self.free_slots = sorted([*self.free_slots, running.slot], key=lambda slot: slot.index)
            self.free_gpus = tuple(sorted((*self.free_gpus, *running.gpus), key=self.plan.gpu_ids.index))
            self.outcomes[num] = running.process.outcome()

    def not_started(self) -> list[SweepTrial]:
        """The trials that never started, or refused to on a stop signal."""
        return [t for t in self.trials if isinstance(self.outcomes.get(t.num, NotStarted("")), NotStarted)]

    def stopped(self) -> SweepStopped:
        """The sweep's stop, once every started trial has ended."""
        from hpcsweep.control.exit_codes import EXIT_INTERRUPTED, EXIT_STOPPED
        from hpcsweep.control.stop import INTERRUPTED

        outcomes = [self.outcomes.get(trial.num) for trial in self.trials]
        refused = [outcome.reason for outcome in outcomes if isinstance(outcome, NotStarted)]
        reason = self.forwarder.reason or (refused[0] if refused else None)
        stopped = [outcome for outcome in outcomes if isinstance(outcome, Stopped)]
        ended = [t.num for t, outcome in zip(self.trials, outcomes) if isinstance(outcome, Exited)]
        not_started = [t.num for t in self.not_started()]
        code = stopped[0].code if stopped else (EXIT_INTERRUPTED if reason == INTERRUPTED else EXIT_STOPPED)
        what = stop_summary(reason, [outcome.what for outcome in stopped], ended, not_started)
        log.warning("%s", what)
        return SweepStopped(what, code)


def run_local_trials(
    trials: Sequence[SweepTrial],
    plan: LocalPlan,
    context_file: Path,
    starter: TrialStarter,
    record_not_started: Callable[[Sequence[SweepTrial]], None],
) -> list[JobReturn] | SweepStopped:
    """Run ``trials`` with ``plan``, each started by ``starter``, and return their JobReturns in trial order.

    Returns ``SweepStopped`` instead, once the running trials have ended, when a stop signal came or
    a trial stopped, after passing the trials that never started to ``record_not_started``.
    """
    from hpcsweep.control.stop import stop_signals_routed_to

    run = _LocalRun(trials, plan, context_file, starter)
    with stop_signals_routed_to(run.forwarder):
        run.start_ready()
        while run.forwarder.running:
            time.sleep(POLL_S)
            run.collect_ended()
            run.start_ready()
    if run.stopping:
        record_not_started(run.not_started())
        return run.stopped()
    return [job_return_of(trial, run.outcomes[trial.num]) for trial in trials]


def job_return_of(trial: SweepTrial, outcome: TrialOutcome) -> JobReturn:
    """The trial's JobReturn: the one its process sent, else a failed one saying how the process ended."""
    if isinstance(outcome, Returned):
        return outcome.job_return
    assert isinstance(outcome, Exited), outcome
    return failed_return(trial, outcome)
