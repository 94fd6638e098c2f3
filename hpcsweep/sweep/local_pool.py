"""Run a local sweep's trials several at a time, each in its own process (``hpcsweep.sweep.local_trial``).

Trials start in order as slots and GPUs come free (``hpcsweep.sweep.local_slots``). A trial that
fails does not stop the others. A stop signal to the sweep (Ctrl-C, SIGTERM, USR2) goes on to
every running trial, which stops as its app stops on it (hpcsweep's: with a checkpoint); no
further trial starts, and once the running ones have ended the sweep ends with
``LocalSweepStopped``. A trial that stops on its own (a signal of its own) ends the sweep the same way.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from hpcsweep.sweep.hooks import SweepTrial
from hpcsweep.sweep.local_slots import LocalPlan, LocalSlot, take_gpus, trial_environment, trial_gpu_count
from hpcsweep.sweep.local_trial import Exited, NotStarted, Returned, Stopped, TrialOutcome, TrialProcess, start_trial

log = logging.getLogger(__name__)

# How often the sweep looks for ended trial processes; a trial takes seconds at the least.
POLL_S = 0.1


class LocalSweepStopped(SystemExit):
    """A stop ended the local sweep before every trial ran; ``what`` says which stopped and which did not start.

    A ``SystemExit`` with the exit status of the first stopped trial (else that of
    ``hpcsweep.train.stop`` for the signal), so that an app without a hook ends as a stopped command.
    """

    def __init__(self, what: str, code: int) -> None:
        super().__init__(code)
        self.what = what

    def __str__(self) -> str:
        return self.what


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
        from hpcsweep.train.stop import stop_reason

        if self.reason is None:
            self.reason = stop_reason(signum)
            log.warning("stop signal (%s): stopping %d running trial(s); no further trial starts",
                        self.reason, len(self.running))
        for running in list(self.running.values()):
            if running.process.process.poll() is None:
                running.process.process.send_signal(signum)


@contextmanager
def _forwarding(forwarder: _StopForwarder) -> Iterator[None]:
    from hpcsweep.train.stop import SIGNAL_REASONS

    previous = {sig: signal.signal(sig, forwarder) for sig in SIGNAL_REASONS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_local_trials(trials: Sequence[SweepTrial], plan: LocalPlan, context_file: Path) -> list[JobReturn]:
    """Run ``trials`` with ``plan`` and return their JobReturns in trial order.

    Raises ``LocalSweepStopped`` once the running trials have ended when a stop signal came or a
    trial stopped.
    """
    from hpcsweep.train.stop import EXIT_INTERRUPTED, EXIT_REQUEUE, INTERRUPTED, stop_signals_blocked

    waiting = list(trials)
    free_slots, free_gpus = list(plan.slots), plan.gpu_ids
    forwarder = _StopForwarder()
    outcomes: dict[int, TrialOutcome] = {}
    a_trial_stopped = False
    with _forwarding(forwarder):
        while waiting or forwarder.running:
            while waiting and free_slots and forwarder.reason is None and not a_trial_stopped:
                trial = waiting[0]
                taken = take_gpus(free_gpus, trial_gpu_count(plan, trial.allocation.gpus_per_node, trial.allocation.gpus_key))
                if taken is None:
                    break
                gpus, free_gpus = taken
                slot = free_slots.pop(0)
                waiting.pop(0)
                # Blocked, so that a signal now reaches the new process once, after it is registered.
                with stop_signals_blocked():
                    process = start_trial(context_file, trial.overrides, trial.num, slot.cpus, trial_environment(plan, gpus))
                    forwarder.running[trial.num] = _Running(trial, process, slot, gpus)
                log.info("trial #%d started (pid %d, CPUs %s%s)", trial.num, process.process.pid,
                         ",".join(map(str, slot.cpus)), f", GPUs {','.join(gpus)}" if plan.gpu_ids else "")
            if not forwarder.running:
                break
            for num, running in list(forwarder.running.items()):
                if running.process.process.poll() is None:
                    continue
                del forwarder.running[num]
                free_slots.append(running.slot)
                free_slots.sort(key=lambda slot: slot.index)
                free_gpus = tuple(sorted((*free_gpus, *running.gpus), key=plan.gpu_ids.index))
                outcomes[num] = running.process.outcome()
                a_trial_stopped = a_trial_stopped or isinstance(outcomes[num], (Stopped, NotStarted))
            time.sleep(POLL_S)
    if forwarder.reason is None and not a_trial_stopped:
        return [job_return_of(trial, outcomes[trial.num]) for trial in trials]
    reason = forwarder.reason or next((o.reason for o in outcomes.values() if isinstance(o, NotStarted)), None)
    stopped = [o.what for t in trials if isinstance(o := outcomes.get(t.num), Stopped)]
    ended = [t.num for t in trials if isinstance(outcomes.get(t.num), Exited)]
    not_started = [t.num for t in trials if t.num not in outcomes or isinstance(outcomes[t.num], NotStarted)]
    first_stop = next((o for t in trials if isinstance(o := outcomes.get(t.num), Stopped)), None)
    code = first_stop.code if first_stop else (EXIT_INTERRUPTED if reason == INTERRUPTED else EXIT_REQUEUE)
    what = stop_summary(reason, stopped, ended, not_started)
    log.warning("%s", what)
    raise LocalSweepStopped(what, code)


def job_return_of(trial: SweepTrial, outcome: TrialOutcome) -> JobReturn:
    """The trial's JobReturn: the one its process sent, else a failed one saying how the process ended."""
    if isinstance(outcome, Returned):
        return outcome.job_return
    assert isinstance(outcome, Exited), outcome
    return failed_return(trial, outcome)
