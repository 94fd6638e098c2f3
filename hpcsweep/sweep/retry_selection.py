"""Which trials ``python -m hpcsweep.retry`` submits again, and with which launcher settings: pure checks.

Every refusal is a ``ValueError`` with one line, raised before anything is submitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_STATUSES = ("failed", "cancelled")
RETRYABLE_STATUSES = ("failed", "cancelled", "skipped_budget", "stopped")
"""Statuses ``--status`` may name: trials that ended without finishing."""
FINISHED_STATUSES = ("completed", "stopped_early")
"""Statuses of trials that are done: retried only when ``--trials`` names them."""
ACTIVE_STATUSES = ("pending", "running")
"""Statuses of trials Slurm still has: never retried (it would run them twice)."""
LAUNCHER_PREFIX = "hydra.launcher."
BUDGET_STOP = "budget"


@dataclass(frozen=True)
class TrialState:
    """What the selection needs of one trial: its number, status, and why it last stopped."""

    num: int
    status: str
    last_stop_reason: str = ""

    def matches(self, statuses: Sequence[str]) -> bool:
        """Whether ``statuses`` select this trial; ``skipped_budget`` also selects a trial the budget stopped."""
        if self.status in statuses:
            return True
        return "skipped_budget" in statuses and self.status == "stopped" and self.last_stop_reason == BUDGET_STOP


def parse_statuses(text: str) -> tuple[str, ...]:
    """``--status failed,cancelled`` -> the statuses; ``ValueError`` naming one that cannot be retried."""
    statuses = tuple(part.strip() for part in text.split(",") if part.strip())
    for status in statuses:
        if status not in RETRYABLE_STATUSES:
            raise ValueError(f"--status {status!r} is not allowed: one or more of {','.join(RETRYABLE_STATUSES)} "
                             "(name finished trials with --trials)")
    if not statuses:
        raise ValueError(f"--status {text!r} is not allowed: one or more of {','.join(RETRYABLE_STATUSES)}")
    return statuses


def parse_trial_numbers(text: str) -> tuple[int, ...]:
    """``--trials 3,7`` -> ``(3, 7)``; ``ValueError`` unless whole numbers >= 0, comma-separated."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        raise ValueError(f"--trials {text!r} is not allowed: trial numbers separated by commas (3,7)")
    return tuple(dict.fromkeys(int(part) for part in parts))


def _numbers(nums: Sequence[int]) -> str:
    return ",".join(str(num) for num in nums)


def select_trials(
    trials: Sequence[TrialState], statuses: Sequence[str] | None = None, numbers: Sequence[int] | None = None
) -> list[int]:
    """The trial numbers to retry: those ``numbers`` names, else those whose status is in ``statuses``.

    ``ValueError`` when nothing matches, a number is not in the sweep, a selected trial is still
    pending or running, or (``--status``) a selected trial is finished.
    """
    by_num = {trial.num: trial for trial in trials}
    if numbers is not None:
        unknown = [num for num in numbers if num not in by_num]
        if unknown:
            raise ValueError(f"--trials {_numbers(unknown)}: no such trial in this sweep (it has #{min(by_num, default=0)}"
                             f"-#{max(by_num, default=0)})")
        selected = [by_num[num] for num in numbers]
        what = f"--trials {_numbers(numbers)}"
    else:
        statuses = tuple(statuses or DEFAULT_STATUSES)
        selected = [trial for trial in trials if trial.matches(statuses)]
        what = f"--status {','.join(statuses)}"
        finished = [t.num for t in selected if t.status in FINISHED_STATUSES]
        if finished:
            raise ValueError(f"{what}: trial(s) {_numbers(finished)} finished; name them with --trials to run them again")
    active = [t for t in selected if t.status in ACTIVE_STATUSES]
    if active:
        listed = ", ".join(f"#{t.num} is {t.status}" for t in active)
        raise ValueError(f"{what}: {listed}; wait until it ends (or scancel it) before retrying it")
    if not selected:
        counts: dict[str, int] = {}
        for trial in trials:
            counts[trial.status] = counts.get(trial.status, 0) + 1
        here = ", ".join(f"{n} {status}" for status, n in counts.items()) or "no trials"
        raise ValueError(f"{what}: nothing to retry (this sweep has {here})")
    return sorted(t.num for t in selected)


def launcher_changes(overrides: Sequence[str], params: Mapping[str, Any]) -> dict[str, Any]:
    """``hydra.launcher.KEY=VALUE`` overrides -> ``{KEY: VALUE}``, each value read as YAML (``null``, ``60``).

    ``ValueError`` for anything else: a trial config override would make another trial, and a
    launcher key the sweep's launcher does not have is a typo.
    """
    import yaml

    changes: dict[str, Any] = {}
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key:
            raise ValueError(f"{override!r} is not allowed: overrides are hydra.launcher.KEY=VALUE")
        if not key.startswith(LAUNCHER_PREFIX):
            raise ValueError(f"{override} is not allowed: a retry runs the same trials, so only hydra.launcher.* "
                             "settings may change (another trial config is another sweep)")
        name = key[len(LAUNCHER_PREFIX):]
        if name not in params:
            raise ValueError(f"{key} is not allowed: the sweep's launcher has no such setting "
                             f"(it has {', '.join(sorted(k for k in params if not k.startswith('_')))})")
        changes[name] = yaml.safe_load(value) if value else None
    return changes
