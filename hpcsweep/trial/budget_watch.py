"""The sweep's GPU-hour budget, seen from one trial: skip the trial when it is spent, stop it when it runs out.

A trial of a sweep finds its ``sweep.json`` (and there the budget, ``budget_gpu_hours``) in a
directory above its own. Then:

- ``skip_if_spent``: a trial that starts once the budget is spent trains nothing; node 0 marks it
  ``skipped_budget`` and cancels the sweep's tasks that have not started.
- ``watching``: while the trial runs, node 0 looks at the sweep's spending every
  ``HPCSWEEP_BUDGET_POLL_S`` seconds (on Slurm the look its trials share: one ``sacct`` call per
  interval for the whole sweep, ``hpcsweep.trial.spending_look``). Once the budget is spent, or
  would be before the next look, it stops the trial the way a stop signal does (a checkpoint, then
  ``last_stop_reason: budget``; ``hpcsweep.trial.preempt`` never requeues it), writes the stop
  file of every other running trial of the sweep, and cancels the pending tasks. Locally it also
  records the trial's wall time in ``usage.json``, which is what a local sweep's spending is made of.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from hpcsweep.config import TrialConfig
from hpcsweep.control.stop import BUDGET, write_stop_file
from hpcsweep.files.atomic import atomic_write_json
from hpcsweep.files.metrics_file import new_report, read_metrics, write_metrics
from hpcsweep.files.sweep_record import SWEEP_FILE, SweepRecord, read_sweep_record
from hpcsweep.files.trial_files import METRICS_FILE, TrialFiles
from hpcsweep.files.usage_file import USAGE_FILE, start_run, touch_run
from hpcsweep.files.wait import wait_for
from hpcsweep.results.budget import budget_reached, query_sweep_usage
from hpcsweep.slurm import commands
from hpcsweep.slurm.usage import Usage
from hpcsweep.trial.rendezvous import Rendezvous
from hpcsweep.trial.spending_look import shared_usage

log = logging.getLogger(__name__)

POLL_VAR = "HPCSWEEP_BUDGET_POLL_S"
"""Seconds between two looks at the sweep's spending (default ``DEFAULT_POLL_S``): a site's setting, in the
environment of the login node and the jobs, since each look is one ``sacct`` call on the site's controller
(shared by the sweep's running trials) and the login node's budget horizon must match the trials' look."""
DEFAULT_POLL_S = 60.0
ARRAY_JOB_VAR = "SLURM_ARRAY_JOB_ID"
"""Set in a Slurm array task: a trial of a sweep, whose ``sweep.json`` may not be written yet."""
SKIPPED = "skipped_budget"
"""metrics.json status of a trial that did not start because the budget was spent."""


def poll_interval(env: Mapping[str, str]) -> float:
    """``HPCSWEEP_BUDGET_POLL_S``, else ``DEFAULT_POLL_S``; ``ValueError`` unless a number > 0."""
    raw = env.get(POLL_VAR, "").strip()
    if not raw:
        return DEFAULT_POLL_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ValueError(f"{POLL_VAR}={raw!r} is not allowed: a number of seconds > 0")
    return value


STOP_ALLOWANCE_S = 10.0
"""Seconds from a stop request to the end of the job in accounting: the step, the checkpoint, the
exit, and Slurm's end of the job (4 s on the loaded local cluster, after a 0.5 s stop)."""


def horizon_s(poll_s: float) -> float:
    """How far ahead a look at the spending reaches: a poll until the next look (by this trial or
    another), one more for a look that just missed it (on Slurm, a shared look up to a poll old), and
    the stop itself (``STOP_ALLOWANCE_S``)."""
    return 2 * poll_s + STOP_ALLOWANCE_S


FileVersion = tuple[int, int, int]


def file_version(path: Path) -> FileVersion | None:
    """What tells one ``sweep.json`` from the next (each write is an atomic rename: a new inode); None
    when there is none."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def find_sweep(trial_dir: Path) -> tuple[Path, SweepRecord] | None:
    """The sweep dir above ``trial_dir`` whose ``sweep.json`` lists it, and that record; None outside a sweep."""
    found = find_sweep_version(trial_dir)
    return None if found is None else (found[0], found[1])


def find_sweep_version(trial_dir: Path) -> tuple[Path, SweepRecord, FileVersion] | None:
    """``find_sweep``, and the version of the ``sweep.json`` it read (``file_version``, taken before
    the read: a write after it reads as a change)."""
    target = trial_dir.resolve()
    for folder in target.parents:
        version = file_version(folder / SWEEP_FILE)
        if version is None:
            continue
        try:
            record = read_sweep_record(folder)
        except (ValueError, KeyError, TypeError, OSError) as err:
            log.warning("budget: %s/%s unreadable: %s", folder, SWEEP_FILE, err)
            return None
        if lists_trial(folder, record, target):
            return folder, record, version
    return None


def lists_trial(sweep_dir: Path, record: SweepRecord, target: Path) -> bool:
    """Whether ``record`` lists the (resolved) trial dir ``target``. Compared as written first, which
    costs no system call; only then is every entry resolved (a symlink in a recorded path), since on a
    parallel filesystem each resolution is a metadata round trip and a sweep may list 10,000 trials."""
    if any(Path(os.path.normpath(_joined(sweep_dir, t.trial_dir))) == target for t in record.trials):
        return True
    return any(_resolved(sweep_dir, t.trial_dir) == target for t in record.trials)


def _joined(sweep_dir: Path, trial_dir: str) -> Path:
    path = Path(trial_dir)
    return path if path.is_absolute() else sweep_dir / path


def _resolved(sweep_dir: Path, trial_dir: str) -> Path:
    return _joined(sweep_dir, trial_dir).resolve()


class SweepLookup:
    """``find_sweep`` for a watch that asks every poll: the answer stands while its ``sweep.json`` is
    the same file, so a poll costs one stat, not a read of the whole record (5 MB at 10,000 trials)."""

    def __init__(self, trial_dir: Path) -> None:
        self.trial_dir = trial_dir
        self.found: tuple[Path, SweepRecord] | None = None
        self.version: FileVersion | None = None

    def find(self) -> tuple[Path, SweepRecord] | None:
        if self.found is not None and file_version(self.found[0] / SWEEP_FILE) == self.version:
            return self.found
        found = find_sweep_version(self.trial_dir)
        self.found, self.version = (None, None) if found is None else ((found[0], found[1]), found[2])
        return self.found


def _trial_dirs(sweep_dir: Path, record: SweepRecord) -> list[Path]:
    return [_resolved(sweep_dir, t.trial_dir) for t in record.trials]


def cancel_pending_tasks(record: SweepRecord) -> None:
    """Cancel the sweep's array tasks that have not started (Slurm only); log a refusal."""
    if record.launcher != "slurm" or not record.job_ids():
        return
    try:
        commands.cancel_pending(record.job_ids())
        log.warning("budget spent: cancelled the pending tasks of array(s) %s", ", ".join(record.job_ids()))
    except commands.SlurmCommandError as err:
        log.warning("budget spent, but the pending tasks were not cancelled: %s", err)


def stop_running_trials(sweep_dir: Path, record: SweepRecord) -> None:
    """Ask every running trial of the sweep to stop (its node 0 stop file): they all stop within a step.

    Each running trial's own watch would notice too, but up to a poll later, each spending meanwhile.
    """
    for trial_dir in _trial_dirs(sweep_dir, record):
        if (read_metrics(trial_dir / METRICS_FILE) or {}).get("status") == "running":
            write_stop_file(TrialFiles(trial_dir).stop_file(0), BUDGET)


def sweep_usage(sweep_dir: Path, record: SweepRecord, poll_s: float) -> Usage:
    """The sweep's spending. On Slurm, the look its trials share (``spending_look``): one ``sacct``
    call per poll interval for the whole sweep, however many trials watch it. Locally, the usage
    files, read afresh: they cost no controller anything."""
    def query() -> Usage:
        return query_sweep_usage(record, _trial_dirs(sweep_dir, record))

    return shared_usage(sweep_dir, query, max_age_s=poll_s) if record.launcher == "slurm" else query()


def budget_spent(sweep_dir: Path, record: SweepRecord, poll_s: float, starting_units: int = 0) -> bool:
    """Whether the sweep's budget is spent, or will be within ``horizon_s(poll_s)`` at the current rate
    (plus ``starting_units`` about to start). False when accounting does not answer."""
    if record.budget_gpu_hours is None:
        return False
    horizon = horizon_s(poll_s)
    try:
        usage = sweep_usage(sweep_dir, record, poll_s)
    except commands.SlurmCommandError as err:
        log.warning("budget: spending unknown this time (%s)", err)
        return False
    usage = Usage(usage.spent_hours, usage.burn_per_hour + starting_units)
    reached = budget_reached(usage, record.budget_gpu_hours, horizon)
    if reached:
        log.warning("budget spent: %.4f of %.4f GPU-hours, %.0f GPUs running",
                    usage.spent_hours, record.budget_gpu_hours, usage.burn_per_hour)
    return reached


def skip_if_spent(trial: TrialConfig, trial_dir: Path, rdzv: Rendezvous, env: Mapping[str, str]) -> bool:
    """True (and, on node 0, metrics.json says ``skipped_budget``) when the sweep's budget is spent.

    Spent as the running trials' watches judge it, looking as far ahead: a trial they would stop at
    once does not start. A local trial adds its own GPUs to the rate; an array task is running
    already, so accounting counts it. Node 0 decides for a multi-node trial and the other nodes
    follow (``START_DECISION_FILE``): nodes judging apart could split at the moment the budget runs
    out, one skipping while another waits at the rendezvous for it.
    """
    found = find_sweep(trial_dir)
    if found is None or found[1].budget_gpu_hours is None:
        return False
    attempt = f"{rdzv.rdzv_id}.{env.get('SLURM_RESTART_COUNT', '0')}"
    decided = None if rdzv.node_rank == 0 else read_start_decision(trial_dir, attempt, DECISION_WAIT_S)
    if decided is not None:
        spent = decided
    else:
        starting = local_units(trial, rdzv) if found[1].launcher != "slurm" else 0
        spent = budget_spent(*found, poll_s=poll_interval(env), starting_units=starting)
    if rdzv.node_rank == 0 and rdzv.nnodes > 1:
        write_start_decision(trial_dir, attempt, spent)
    if not spent:
        return False
    if rdzv.node_rank == 0:
        previous = read_metrics(trial_dir / METRICS_FILE)
        base = previous or new_report(
            max_steps=trial.trainer.max_steps, world_size=rdzv.world_size, restarts=0, env=env)
        write_metrics(trial_dir / METRICS_FILE, {**base, "status": SKIPPED})
        cancel_pending_tasks(found[1])
    log.warning("trial %s not started: the sweep's GPU-hour budget is spent", trial_dir)
    return True


START_DECISION_FILE = "budget_start.json"
"""Node 0's word to the other nodes of a multi-node trial: whether this attempt starts or is skipped."""
DECISION_WAIT_S = 300.0
"""How long the other nodes wait for node 0's word before they judge the budget themselves."""


def write_start_decision(trial_dir: Path, attempt: str, skip: bool) -> None:
    """Record node 0's decision for ``attempt`` (the job label and its restart count)."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(trial_dir / START_DECISION_FILE, {"attempt": attempt, "skip": skip})


def read_start_decision(trial_dir: Path, attempt: str, timeout_s: float) -> bool | None:
    """Node 0's decision for ``attempt`` (True: skip), waiting up to ``timeout_s``; None if none came."""
    def decision() -> bool | None:
        try:
            record = json.loads((trial_dir / START_DECISION_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return bool(record["skip"]) if record.get("attempt") == attempt else None

    skip = wait_for(decision, timeout_s)
    if skip is None:
        log.warning("budget: node 0 of %s said nothing within %.0f s; judging the budget here", trial_dir, timeout_s)
    return skip


@contextmanager
def watching(
    trial: TrialConfig, trial_dir: Path, rdzv: Rendezvous, on_stop: Callable[[str], None], env: Mapping[str, str],
) -> Iterator[None]:
    """While the block runs, node 0 stops the trial through ``on_stop(BUDGET)`` once the budget is spent.

    An array task may start before its sweep's ``sweep.json`` is written: it looks for it again at
    every poll, and reads the budget afresh each time.
    """
    lookup = SweepLookup(trial_dir)
    found = lookup.find() if rdzv.node_rank == 0 else None
    array_task = bool(env.get(ARRAY_JOB_VAR))
    if rdzv.node_rank != 0 or (found is None and not array_task):
        yield
        return
    local = found is not None and found[1].launcher != "slurm"
    usage_path = trial_dir / USAGE_FILE
    if local:
        start_run(usage_path, local_units(trial, rdzv), time.time())
    poll = poll_interval(env)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(poll):
            if local:
                touch_run(usage_path, time.time())
            sweep = lookup.find()
            if sweep is not None and budget_spent(*sweep, poll_s=poll):
                on_stop(BUDGET)
                stop_running_trials(*sweep)
                cancel_pending_tasks(sweep[1])
                break
        while local and not done.wait(poll):
            touch_run(usage_path, time.time())

    thread = threading.Thread(target=watch, name="budget-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if local:
            touch_run(usage_path, time.time(), ended=True)


def local_units(trial: TrialConfig, rdzv: Rendezvous) -> int:
    """GPUs a local trial holds (one per worker on CUDA), else its nodes."""
    if trial.trainer.device == "cpu":
        return rdzv.nnodes
    import torch

    return rdzv.world_size if torch.cuda.is_available() else rdzv.nnodes
