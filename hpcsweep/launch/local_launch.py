"""Run a validated sweep on this machine, one trial after another."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.utils import JobReturn

from hpcsweep.launch.prepare import exit_with_config_error, prepare_trials
from hpcsweep.sweep_record import SweepRecord, TrialRecord, now_iso, write_sweep_record

log = logging.getLogger(__name__)


def launch_locally(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    """Validate every trial, write ``sweep.json``, then run the trials with Hydra's basic launcher.

    A failed trial does not stop the others; Hydra reports the first failure once all have run.
    """
    try:
        trials = prepare_trials(launcher, job_overrides, initial_job_idx)
    except ValueError as err:
        exit_with_config_error(err, "no trial was run")
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir)).resolve()
    submitted = now_iso()
    record = SweepRecord(
        sweep_dir=str(sweep_dir),
        launcher="local",
        created_at=submitted,
        trials=[TrialRecord(t.num, t.overrides, str(t.trial_dir), None, submitted) for t in trials],
    )
    write_sweep_record(record)
    log.info("sweep dir: %s (%d trials, running locally)", sweep_dir, len(trials))
    basic = BasicLauncher()
    basic.setup(hydra_context=launcher.hydra_context, task_function=launcher.task_function, config=launcher.config)
    return basic.launch(job_overrides, initial_job_idx)
