"""A sweep's GPU-hour budget: what it has spent, whether that reaches the budget, and how status says so.

Spent is every run of every trial, requeues and retries included: elapsed time x GPUs allocated
(nodes on a partition without GPUs). On Slurm it comes from the one ``sacct`` call over the
sweep's arrays (``hpcsweep.slurm.job_states``); locally from each trial's ``usage.json``
(``hpcsweep.files.usage_file``). The arithmetic here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcsweep.files.sweep_record import SweepRecord
from hpcsweep.files.usage_file import USAGE_FILE, local_spending, read_runs
from hpcsweep.slurm.job_states import SACCT_FIELDS, JobState, parse_sacct
from hpcsweep.slurm.usage import Usage

WARN_FRACTION = 0.8
"""Status flags a sweep that has spent this much of its budget."""


def usage_of_states(states: Mapping[str, JobState]) -> Usage:
    """Spending of Slurm tasks: every run's hours, and the units of the tasks running now."""
    return Usage(
        spent_hours=sum(state.used_hours for state in states.values()),
        burn_per_hour=float(sum(state.units for state in states.values() if state.state in ("RUNNING", "COMPLETING"))),
    )


def usage_of_local_trials(trial_dirs: Iterable[Path]) -> Usage:
    """Spending of local trials, from their ``usage.json`` files."""
    spent, burn = local_spending(run for trial_dir in trial_dirs for run in read_runs(trial_dir / USAGE_FILE))
    return Usage(spent_hours=spent, burn_per_hour=burn)


def query_sweep_usage(record: SweepRecord, trial_dirs: Iterable[Path]) -> Usage:
    """What the sweep has spent: one ``sacct`` call for all its arrays on Slurm, the usage files locally.

    Raises ``SlurmCommandError`` when accounting does not answer.
    """
    if record.launcher != "slurm":
        return usage_of_local_trials(trial_dirs)
    from hpcsweep.slurm.commands import sacct

    job_ids = record.job_ids()
    return usage_of_states(parse_sacct(sacct(job_ids, SACCT_FIELDS)) if job_ids else {})


def budget_reached(usage: Usage, budget_hours: float | None, horizon_s: float) -> bool:
    """Whether the budget is spent, or will be within ``horizon_s`` at the current rate.

    The horizon covers the time until the next look and a stop's checkpoint: stopping then keeps the
    total within the budget instead of overrunning it by a poll interval of every running trial.
    """
    if budget_hours is None:
        return False
    return usage.spent_hours + usage.burn_per_hour * horizon_s / 3600.0 >= budget_hours


def budget_flag(spent_hours: float, budget_hours: float | None, stopped_by_budget: bool = False) -> str:
    """``"BUDGET SPENT"`` at 100 % (or once the budget has stopped or skipped a trial: the watches stop
    the sweep a little before 100 %), ``"80% OF BUDGET"`` from 80 %, else ``""``."""
    if budget_hours is None:
        return ""
    if spent_hours >= budget_hours or stopped_by_budget:
        return "BUDGET SPENT"
    if spent_hours >= WARN_FRACTION * budget_hours:
        return f"{round(WARN_FRACTION * 100)}% OF BUDGET"
    return ""


def hours_text(hours: float) -> str:
    """Hours to three significant digits (``0.00123``, ``12.3``), whole hours from 1000 on."""
    return f"{hours:.0f}" if hours >= 1000 else f"{hours:.3g}"


@dataclass(frozen=True)
class BudgetView:
    """What status shows of the budget: spent, the budget (None: none), the flag."""

    spent_hours: float
    budget_hours: float | None
    stopped_by_budget: bool = False
    """Some trial is stopped or skipped by the budget now."""
    hours: str = "GPU"
    """What the hours count: ``CPU`` for a local sweep on CPUs (``efficiency_table.hours_word``), as the report says."""

    @property
    def flag(self) -> str:
        return budget_flag(self.spent_hours, self.budget_hours, self.stopped_by_budget)

    def line(self) -> str:
        """``budget: 1.23 / 2 GPU-hours spent (62%)``, with the flag when there is one."""
        if self.budget_hours is None:
            return f"budget: {hours_text(self.spent_hours)} {self.hours}-hours spent (no budget)"
        share = 100.0 * self.spent_hours / self.budget_hours
        text = (f"budget: {hours_text(self.spent_hours)} / {hours_text(self.budget_hours)} {self.hours}-hours spent "
                f"({share:.0f}%)")
        return f"{text}  {self.flag}" if self.flag else text
