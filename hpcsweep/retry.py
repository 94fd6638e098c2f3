"""``python -m hpcsweep.retry SWEEP_DIR``: submit a Slurm sweep's unfinished trials again, as one job array.

Each trial runs again in its own trial dir and resumes from its newest valid checkpoint. Choose
the trials by status (``--status``, default ``failed,cancelled``) or by number (``--trials 3,7``,
which may name finished trials too). Launcher settings may change for the retry
(``hydra.launcher.partition=...``, ``timeout_min``, ``exclude``, ``budget_gpu_hours``); a trial
config override may not: it would be another trial. A trial that is still pending or running is
never submitted twice. On a refusal the command prints one line and submits nothing (exit 2).
``sweep.json`` keeps every attempt of every trial and its job id.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from hpcsweep.files.sweep_record import missing_sweep_message
from hpcsweep.sweep.retry_selection import (
    DEFAULT_STATUSES,
    RETRYABLE_STATUSES,
    parse_statuses,
    parse_trial_numbers,
)

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
    choice.add_argument("--trials", metavar="N[,N...]", help="retry these trials, finished ones included")
    parser.add_argument("overrides", nargs="*", metavar="hydra.launcher.KEY=VALUE",
                        help="launcher settings for this retry (partition, timeout_min, exclude, budget_gpu_hours ...)")
    return parser.parse_intermixed_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Check, then submit; 0 once submitted, ``EXIT_REFUSED`` with one line when refused."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    missing = missing_sweep_message(args.sweep_dir)
    if missing or not (args.sweep_dir / "sweep.json").exists():
        print(missing or f"{args.sweep_dir}: no sweep.json; pass a sweep's multirun dir", file=sys.stderr)
        return EXIT_REFUSED
    from hpcsweep.slurm.commands import SlurmCommandError
    from hpcsweep.sweep.retry_submit import plan_retry, submit_retry

    try:
        statuses = parse_statuses(args.status) if args.status else None
        numbers = parse_trial_numbers(args.trials) if args.trials else None
        plan = plan_retry(args.sweep_dir, statuses, numbers, args.overrides)
    except (ValueError, SlurmCommandError) as err:
        print(f"retry refused: {err}; nothing was submitted", file=sys.stderr)
        return EXIT_REFUSED
    record = submit_retry(plan)
    retried = {t.num for t in plan.trials}
    attempts = {t.num: len(t.all_attempts()) for t in record.trials if t.num in retried}
    jobs = ", ".join(f"#{t.num} {t.job_id} (attempt {attempts[t.num]})" for t in record.trials if t.num in retried)
    print(f"retrying {len(retried)} trial(s) in {plan.sweep_dir}: {jobs}")
    if plan.budget is not None:
        print(f"budget {plan.budget:g} GPU-hours for the whole sweep, earlier attempts included")
    print(f"status: python -m hpcsweep.status {plan.sweep_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

