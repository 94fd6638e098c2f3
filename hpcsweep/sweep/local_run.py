"""Run a checked sweep on this machine: ``hydra.launcher.local_parallelism`` trials at a time,
each in a process of its own that runs it as Hydra's basic launcher does (``local_pool``).

Running the same sweep again with ``hydra.sweep.dir=SWEEP_DIR`` keeps the trials of its
``sweep.json``. What else a rerun does is the app's: hpcsweep's trials that ended are not trained
again, the others resume from their checkpoints, and a stop signal (Ctrl-C) stops the running
trials with a checkpoint and starts no further one (``hpcsweep_hook.HpcsweepTrials.run_locally``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn

from hpcsweep.files.sweep_record import (
    SWEEP_FILE,
    SweepRecord,
    TrialRecord,
    now_iso,
    read_sweep_record,
    write_sweep_record,
)
from hpcsweep.sweep.budget import announce_local_budget
from hpcsweep.sweep.hooks import SweepTrial, hook_of
from hpcsweep.sweep.local_slots import LocalPlan, plan_local_run, trial_gpu_count, visible_gpu_ids
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


def machine_plan(params: Mapping[str, Any], trials: Sequence[SweepTrial]) -> LocalPlan:
    """The plan for this machine's GPUs and CPUs; ``ValueError`` for a bad ``local_parallelism``
    or a trial that asks for more GPUs than there are."""
    from hpcsweep.trial.nccl import list_gpu_models

    gpu_ids = visible_gpu_ids(os.environ, len(list_gpu_models()))
    plan = plan_local_run(params.get("local_parallelism"), gpu_ids, sorted(os.sched_getaffinity(0)))
    for trial in trials:
        try:
            trial_gpu_count(plan, trial.allocation.gpus_per_node, trial.allocation.gpus_key)
        except ValueError as err:
            raise ValueError(f"trial #{trial.num}: {err}") from None
    return plan


def launch_locally(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    """Check every trial and this machine's share for it, write ``sweep.json``, then run the trials.

    Returns Hydra's JobReturns in trial order. A failed trial does not stop the others; Hydra
    reports the first failure once all have run.
    """
    from hpcsweep.sweep.local_pool import run_local_trials
    from hpcsweep.sweep.local_trial import write_sweep_context

    hook = hook_of(launcher.task_function)
    try:
        trials = check_trials(launcher, job_overrides, initial_job_idx, hook)
        plan = machine_plan(launcher.params, trials)
        budget = announce_local_budget(launcher.config.hydra.launcher)
    except ValueError as err:
        exit_with_config_error(err, "no trial was run")
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir)).resolve()
    record = local_sweep_record(sweep_dir, trials, previous_record(sweep_dir))
    write_sweep_record(dataclasses.replace(record, budget_gpu_hours=budget))
    log.info("sweep dir: %s (%d trials, running locally, %d at a time)", sweep_dir, len(trials), plan.parallelism)
    with tempfile.TemporaryDirectory(prefix="hpcsweep-local-") as folder:
        context_file = write_sweep_context(Path(folder), launcher.hydra_context, launcher.config, launcher.task_function)
        # The trials run elsewhere: here the sweep's own config is Hydra's, for what the app says
        # about the whole sweep (a stop names the sweep dir to resume).
        HydraConfig.instance().set_config(copy.deepcopy(launcher.config))
        return hook.run_locally(trials, lambda to_run: run_local_trials(to_run, plan, context_file))
