"""Run a checked sweep on this machine, one trial after another, with Hydra's basic launcher.

Running the same sweep again with ``hydra.sweep.dir=SWEEP_DIR`` keeps the trials of its
``sweep.json``. What else a rerun does is the app's: hpcsweep's trials that ended are not trained
again, the others resume from their checkpoints, and a stop signal (Ctrl-C) stops the running
trial with a checkpoint and starts no further one (``hpcsweep_hook.HpcsweepTrials.run_locally``).
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
from hpcsweep.sweep.hooks import SweepTrial, hook_of
from hpcsweep.sweep.sweep_trials import check_trials, exit_with_config_error

log = logging.getLogger(__name__)


def local_sweep_record(sweep_dir: Path, trials: Sequence[SweepTrial], previous: SweepRecord | None) -> SweepRecord:
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


def launch_locally(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    """Check every trial, write ``sweep.json``, then run the trials with Hydra's basic launcher.

    Returns Hydra's JobReturns. A failed trial does not stop the others; Hydra reports the first
    failure once all have run.
    """
    hook = hook_of(launcher.task_function)
    try:
        trials = check_trials(launcher, job_overrides, initial_job_idx, hook)
    except ValueError as err:
        exit_with_config_error(err, "no trial was run")
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir)).resolve()
    write_sweep_record(local_sweep_record(sweep_dir, trials, previous_record(sweep_dir)))
    log.info("sweep dir: %s (%d trials, running locally)", sweep_dir, len(trials))
    basic = BasicLauncher()
    basic.setup(hydra_context=launcher.hydra_context, task_function=launcher.task_function, config=launcher.config)
    return hook.run_locally(trials, lambda trial: run_slot(launcher.config, basic, trial))


def run_slot(config: Any, basic: BasicLauncher, trial: SweepTrial) -> Sequence[JobReturn]:
    """Run one trial; a search's slot runs with the parameters its study chooses as it starts."""
    from hpcsweep.search.trial_slot import search_slot

    with search_slot(config, trial.overrides, trial.num) as slot:
        return [slot.ran(job_return) for job_return in basic.launch([slot.overrides], trial.num)]
