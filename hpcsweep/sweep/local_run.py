"""Run a validated sweep on this machine, one trial after another.

Running the same sweep again with ``hydra.sweep.dir=SWEEP_DIR`` resumes it: trials that ended are
not trained again, the others resume from their checkpoints, and ``sweep.json`` keeps its trials.
A stop signal (Ctrl-C) stops the running trial with a checkpoint and starts no further trial.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.utils import JobReturn

from hpcsweep.files.sweep_record import (
    SWEEP_FILE,
    SweepRecord,
    TrialRecord,
    now_iso,
    read_sweep_record,
    write_sweep_record,
)
from hpcsweep.sweep.prepare import PreparedTrial, exit_with_config_error, prepare_trials
from hpcsweep.sweep.resume_hint import stopped_command
from hpcsweep.train import stop

log = logging.getLogger(__name__)


def local_sweep_record(sweep_dir: Path, trials: Sequence[PreparedTrial], previous: SweepRecord | None) -> SweepRecord:
    """The ``sweep.json`` of a local sweep; a resumed sweep keeps its creation and submission times."""
    submitted = now_iso()
    before = {(t.num, tuple(t.overrides)): t.submitted_at for t in previous.trials} if previous else {}
    return SweepRecord(
        sweep_dir=str(sweep_dir),
        launcher="local",
        created_at=previous.created_at if previous else submitted,
        trials=[
            TrialRecord(t.num, t.overrides, str(t.trial_dir), None, before.get((t.num, tuple(t.overrides)), submitted))
            for t in trials
        ],
    )


def previous_record(sweep_dir: Path) -> SweepRecord | None:
    """The sweep.json of an earlier run of this sweep dir, if it has a readable one."""
    if not (sweep_dir / SWEEP_FILE).exists():
        return None
    try:
        return read_sweep_record(sweep_dir)
    except (ValueError, KeyError, TypeError) as err:
        log.warning("%s/%s is unreadable (%s): writing a new one", sweep_dir, SWEEP_FILE, err)
        return None


def log_resume_state(trials: Sequence[PreparedTrial]) -> None:
    """Say which trials of a resumed sweep have ended and which resume, before anything runs."""
    from hpcsweep.files.metrics_file import read_metrics

    for trial in trials:
        metrics = read_metrics(trial.trial_dir / "metrics.json")
        if metrics:
            log.info("trial #%d: %s at step %s before this run", trial.num, metrics.get("status"), metrics.get("step"))


def launch_locally(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    """Validate every trial, write ``sweep.json``, then run the trials with Hydra's basic launcher.

    A failed trial does not stop the others; Hydra reports the first failure once all have run.
    A stop signal stops the sweep: the running trial checkpoints, no further trial starts.
    """
    try:
        trials = prepare_trials(launcher, job_overrides, initial_job_idx)
    except ValueError as err:
        exit_with_config_error(err, "no trial was run")
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir)).resolve()
    previous = previous_record(sweep_dir)
    write_sweep_record(local_sweep_record(sweep_dir, trials, previous))
    log.info("sweep dir: %s (%d trials, running locally)", sweep_dir, len(trials))
    if previous:
        log_resume_state(trials)
    basic = BasicLauncher()
    basic.setup(hydra_context=launcher.hydra_context, task_function=launcher.task_function, config=launcher.config)
    returns: list[JobReturn] = []
    # Between trials no runner handles the stop signals: a signal then stops the sweep here.
    with stop.stop_signals_handled(stop.STOP_REQUESTED.set):
        for trial in trials:
            reason = stop.STOP_REQUESTED.reason
            if reason:
                code = stop.EXIT_INTERRUPTED if reason == stop.INTERRUPTED else stop.EXIT_REQUEUE
                raise stopped_command(f"{reason}: trial #{trial.num} was not started", code)
            returns.extend(basic.launch([trial.overrides], trial.num))
    return returns
