"""``python -m hpcsweep.retry SWEEP_DIR``: submit a Slurm sweep's unfinished trials again, as one job array.

Each trial runs again in its own trial dir and resumes from its newest valid checkpoint. Choose
the trials by status (``--status``, default ``failed,cancelled``) or by number (``--trials 3,7``
or ``0-3,9``, which may name finished trials too). Launcher settings may change for the retry
(``hydra.launcher.partition=...``, ``timeout_min``, ``exclude``): for that retry only, a later
retry starts from the sweep's own settings again, and a retry in another partition says so on its
first line. ``budget_gpu_hours`` is the sweep's: a retry that names it sets it for the whole sweep.
A trial config override may not change: it would be another trial. A trial that is still pending
or running is never submitted twice. On a refusal the command prints one line and submits nothing
(exit 2). ``sweep.json`` keeps every attempt of every trial, its job id, and each array's launcher
settings.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpcsweep.files.sweep_record import SweepRecord, missing_sweep_message
from hpcsweep.sweep.retry_selection import (
    DEFAULT_STATUSES,
    RETRYABLE_STATUSES,
    id_ranges,
    parse_statuses,
    parse_trial_numbers,
)

if TYPE_CHECKING:
    from hpcsweep.sweep.retry_submit import RetryPlan

EXIT_REFUSED = 2


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcsweep.retry",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sweep_dir", type=Path, help="the sweep's multirun dir (holds sweep.json)")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument(
        "--status", metavar="S[,S...]",
        help=f"retry the trials with these statuses: {','.join(RETRYABLE_STATUSES)} (default "
             f"{','.join(DEFAULT_STATUSES)}; skipped_budget includes trials the budget stopped)",
    )
    choice.add_argument("--trials", metavar="N[,N...]",
                        help="retry these trials (3,7 or 0-3,9), finished ones included")
    parser.add_argument("overrides", nargs="*", metavar="hydra.launcher.KEY=VALUE",
                        help="launcher settings for this retry only (partition, timeout_min, exclude ...); "
                             "budget_gpu_hours sets the whole sweep's budget")
    return parser.parse_intermixed_args(argv)


def retried_line(plan: RetryPlan, record: SweepRecord) -> str:
    """``retrying 12 trial(s) 0-3,7,9-12 in DIR: job array 130 (attempt 2: 0-3,7; attempt 3: 9-12)``."""
    retried = {t.num for t in plan.trials}
    by_attempt: dict[int, list[int]] = {}
    for trial in record.trials:
        if trial.num in retried:
            by_attempt.setdefault(len(trial.all_attempts()), []).append(trial.num)
    attempts = "; ".join(f"attempt {n}: {id_ranges(nums)}" for n, nums in sorted(by_attempt.items()))
    if len(by_attempt) == 1:
        attempts = f"attempt {next(iter(by_attempt))}"
    arrays = [array.array_job_id for array in record.arrays[len(plan.record.arrays):]]
    return (f"retrying {len(retried)} trial(s) {id_ranges(sorted(retried))} in {plan.sweep_dir}: "
            f"job array{'s' if len(arrays) > 1 else ''} {', '.join(arrays)} ({attempts})")


def main(argv: Sequence[str] | None = None) -> int:
    """Check, then submit; 0 once submitted, ``EXIT_REFUSED`` with one line when refused."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    missing = missing_sweep_message(args.sweep_dir)
    if missing or not (args.sweep_dir / "sweep.json").exists():
        print(missing or f"{args.sweep_dir}: no sweep.json; pass a sweep's multirun dir", file=sys.stderr)
        return EXIT_REFUSED
    from hpcsweep.results.slurm_config import this_shells_hint
    from hpcsweep.slurm.commands import SlurmCommandError
    from hpcsweep.sweep.retry_submit import SlurmDidNotAnswer, plan_retry, submit_retry

    try:
        statuses = parse_statuses(args.status) if args.status else None
        numbers = parse_trial_numbers(args.trials) if args.trials else None
        plan = plan_retry(args.sweep_dir, statuses, numbers, args.overrides)
    except (ValueError, SlurmCommandError) as err:
        print(f"retry refused: {err}; nothing was submitted", file=sys.stderr)
        hint = this_shells_hint() if isinstance(err, (SlurmCommandError, SlurmDidNotAnswer)) else None
        if hint:
            print(hint, file=sys.stderr)
        return EXIT_REFUSED
    if plan.partition_line:
        print(plan.partition_line, flush=True)
    record = submit_retry(plan)
    print(retried_line(plan, record))
    if plan.budget is not None:
        print(f"budget {plan.budget:g} GPU-hours for the whole sweep, earlier attempts included")
    print(f"status: python -m hpcsweep.status {plan.sweep_dir}")
    return 0


if __name__ == "__main__":
    from hpcsweep.results.closed_pipe import exit_code

    sys.exit(exit_code(main))

