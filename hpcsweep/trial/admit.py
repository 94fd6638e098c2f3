"""The admit phase: whether this attempt trains at all, decided before any worker starts.

In order: the resume guard (a trial dir trained with another config is refused, ``ConfigMismatch``),
a trial that has ended is not trained again, the sweep's GPU-hour budget (node 0 decides, the others
follow its word), and the requeue cap. The search slot (a search trial's parameters) is chosen
before the attempt exists, by the launcher (``hpcsweep.search.trial_slot``). A malformed
``HPCSWEEP_FAULT`` is refused here too, before any worker could trip on it.
"""

from __future__ import annotations

import logging

from hpcsweep.control.outcome import Outcome
from hpcsweep.train import fault
from hpcsweep.train.checkpoint.manager import trial_already_done
from hpcsweep.trial import budget_watch, failures, preempt
from hpcsweep.trial.attempt import TrialAttempt
from hpcsweep.trial.records import check_trial_config, read_metrics
from hpcsweep.trial.settle import fail_trial

log = logging.getLogger(__name__)


def admit(attempt: TrialAttempt) -> Outcome | None:
    """None when the attempt may train; else the outcome it ends with before training (skipped or failed)."""
    fault.fault_from_env(attempt.env)
    check_trial_config(attempt.trial, attempt.files, attempt.force_resume, attempt.records_for_the_trial,
                       attempt.model)
    previous = read_metrics(attempt.files)
    if trial_already_done(attempt.files.root, previous):
        log.info("trial %s is already %s: not training it again", attempt.files.root, previous["status"])
        return Outcome("skipped", f"already {previous['status']}", previous)
    if budget_watch.skip_if_spent(attempt.trial, attempt.files.root, attempt.rdzv, attempt.env):
        return Outcome("skipped", "the sweep's GPU-hour budget is spent", read_metrics(attempt.files))
    attempt.files.root.mkdir(parents=True, exist_ok=True)
    over_cap = preempt.over_cap_error(attempt.requeues, attempt.caps.max_requeues)
    if over_cap:
        log.error("trial %s: %s", attempt.files.root, over_cap)
        if attempt.records_for_the_trial:
            return fail_trial(attempt, read_metrics(attempt.files), over_cap)
        return Outcome("failed", over_cap)
    if attempt.job is not None and attempt.records_for_the_trial:
        failures.record_slurm_failure(attempt.files.root, attempt.job)
    return None
