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
    """``--trials 3,7`` -> ``(3, 7)``; ranges as ``id_ranges`` prints them: ``0-2,7`` -> ``(0, 1, 2, 7)``.

    ``ValueError`` unless whole numbers >= 0 (or ``FIRST-LAST`` with FIRST <= LAST), comma-separated.
    """
    numbers: list[int] = []
    parts = [part.strip() for part in text.split(",") if part.strip()]
    for part in parts:
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or (dash and int(last) < int(first)):
            parts = []
            break
        numbers.extend(range(int(first), int(last or first) + 1))
    if not parts:
        raise ValueError(
            f"--trials {text!r} is not allowed: trial numbers or ranges separated by commas (3,7 or 0-9,12)")
    return tuple(dict.fromkeys(numbers))


def id_ranges(nums: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 7, 9, 10]`` -> ``0-3,7,9,10``: trial numbers, sorted, runs of three or more as ranges."""
    ordered = sorted(set(nums))
    parts: list[str] = []
    start = previous = None
    for num in [*ordered, None]:
        if num is not None and previous is not None and num == previous + 1:
            previous = num
            continue
        if start is not None and previous - start >= 2:
            parts.append(f"{start}-{previous}")
        elif start is not None:
            parts.extend(str(n) for n in range(start, previous + 1))
        start = previous = num
    return ",".join(parts)


def _numbers(nums: Sequence[int]) -> str:
    return id_ranges(nums)


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
        by_status: dict[str, list[int]] = {}
        for t in active:
            by_status.setdefault(t.status, []).append(t.num)
        listed = ", ".join(f"#{_numbers(nums)} {'is' if len(nums) == 1 else 'are'} {status}"
                           for status, nums in by_status.items())
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


def _where(partition: str | None) -> str:
    return f"partition {partition}" if partition else "the cluster's default partition"


def partition_change_line(sweep_partition: str | None, partition: str | None) -> str | None:
    """``this retry runs in partition urgent, where the sweep ran in partition batch; ...``; None when the same."""
    if partition == sweep_partition:
        return None
    return (f"this retry runs in {_where(partition)}, where the sweep ran in {_where(sweep_partition)}: "
            f"hydra.launcher.partition={partition or 'null'} applies to this retry only")
