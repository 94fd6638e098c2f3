"""Run a checked sweep on this machine: ``hydra.launcher.local_parallelism`` trials at a time,
each in a process of its own that runs it as Hydra's basic launcher does (``local_pool``), forked
from a server that has imported torch once (``hydra.launcher.start_method``, ``fork_server``).
A local run has one node: a trial that asks for more is refused before anything runs. The run
ends with a summary and the ``status`` and ``report`` commands for its sweep dir; the trials that
a stop kept from starting say ``not_started`` in their metrics.json until the sweep runs again.

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
from hydra.core.utils import JobReturn, JobStatus

from hpcsweep.files.metrics_file import NOT_STARTED, read_metrics, write_metrics
from hpcsweep.files.sweep_record import (
    SWEEP_FILE,
    SweepRecord,
    TrialRecord,
    now_iso,
    read_sweep_record,
    write_sweep_record,
)
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.sweep.budget import announce_local_budget
from hpcsweep.sweep.containers import check_local_container
from hpcsweep.sweep.fork_server import PRELOAD, TrialStarter, start_method_of
from hpcsweep.sweep.hooks import SweepStopped, SweepTrial, hook_of
from hpcsweep.sweep.hydra_private import BASIC_LAUNCHER_MODULE
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


def refuse_several_nodes(trials: Sequence[SweepTrial]) -> None:
    """``ValueError`` naming the key of the first trial that asks for more than the one node a local run has."""
    for trial in trials:
        if trial.allocation.nodes > 1:
            raise ValueError(
                f"trial #{trial.num}: {trial.allocation.nodes_key}={trial.allocation.nodes} is not allowed here: "
                "a local run has one node; run it where sbatch reaches a Slurm controller (hydra/launcher=auto, "
                "the default, or hydra/launcher=slurm)"
            )


def machine_plan(params: Mapping[str, Any], trials: Sequence[SweepTrial]) -> LocalPlan:
    """The plan for this machine's GPUs and CPUs; ``ValueError`` for a bad ``local_parallelism``,
    a trial that asks for more nodes than one or for more GPUs than there are."""
    from hpcsweep.trial.nccl import list_gpu_models

    refuse_several_nodes(trials)
    gpu_ids = visible_gpu_ids(os.environ, len(list_gpu_models()))
    plan = plan_local_run(params.get("local_parallelism"), gpu_ids, sorted(os.sched_getaffinity(0)))
    for trial in trials:
        try:
            trial_gpu_count(plan, trial.allocation.gpus_per_node, trial.allocation.gpus_key)
        except ValueError as err:
            raise ValueError(f"trial #{trial.num}: {err}") from None
    return plan


def record_not_started(trials: Sequence[SweepTrial]) -> None:
    """Say in each trial's metrics.json that it never started (where it has none of its own)."""
    for trial in trials:
        path = TrialFiles(trial.trial_dir).metrics
        if read_metrics(path) is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_metrics(path, {"status": NOT_STARTED, "step": 0})


def forget_not_started(trials: Sequence[SweepTrial]) -> None:
    """Remove what ``record_not_started`` wrote: those trials run now, as if for the first time."""
    for trial in trials:
        path = TrialFiles(trial.trial_dir).metrics
        if (read_metrics(path) or {}).get("status") == NOT_STARTED:
            path.unlink()


def sweep_summary(returns: Sequence[JobReturn]) -> str:
    """``4 trial(s) ran: 3 completed, 1 failed``, by Hydra's status of each job."""
    failed = sum(1 for job_return in returns if job_return.status == JobStatus.FAILED)
    return f"{len(returns)} trial(s) ran: {len(returns) - failed} completed, {failed} failed"


def log_where_to_look(sweep_dir: Path) -> None:
    """The commands that show the sweep, as the Slurm launcher prints them."""
    log.info("status: python -m hpcsweep.status %s", sweep_dir)
    log.info("report: python -m hpcsweep.report %s", sweep_dir)


def launch_locally(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    """Check every trial and this machine's share for it, write ``sweep.json``, then run the trials.

    Returns Hydra's JobReturns in trial order. A failed trial does not stop the others; Hydra
    reports the first failure once all have run.
    """
    from hpcsweep.sweep.local_pool import run_local_trials
    from hpcsweep.sweep.local_trial import write_sweep_context
    from hpcsweep.control.stop import stop_signals_blocked

    hook = hook_of(launcher.task_function)
    try:
        check_local_container(launcher.config.hydra.launcher)
        trials = check_trials(launcher, job_overrides, initial_job_idx, hook)
        plan = machine_plan(launcher.params, trials)
        start_method = start_method_of(launcher.params)
        budget = announce_local_budget(launcher.config.hydra.launcher)
        app_facts = hook.sweep_facts(trials)
    except ValueError as err:
        exit_with_config_error(err, "no trial was run")
    # Started first, so that its imports overlap with writing the sweep's files.
    with stop_signals_blocked():
        starter = TrialStarter(start_method, (*PRELOAD, BASIC_LAUNCHER_MODULE, *hook.preload))
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir)).resolve()
    record = local_sweep_record(sweep_dir, trials, previous_record(sweep_dir))
    write_sweep_record(dataclasses.replace(record, budget_gpu_hours=budget, app=app_facts))
    log.info("sweep dir: %s (%s, running locally, %d at a time)", sweep_dir,
             "1 trial" if len(trials) == 1 else f"{len(trials)} trials", plan.parallelism)
    forget_not_started(trials)
    with tempfile.TemporaryDirectory(prefix="hpcsweep-local-") as folder:
        context_file = write_sweep_context(Path(folder), launcher.hydra_context, launcher.config, launcher.task_function)
        # The trials run elsewhere: here the sweep's own config is Hydra's, for what the app says
        # about the whole sweep (a stop names the sweep dir to resume).
        HydraConfig.instance().set_config(copy.deepcopy(launcher.config))

        def run_trials(to_run: Sequence[SweepTrial]) -> list[JobReturn] | SweepStopped:
            ran = run_local_trials(to_run, plan, context_file, starter, record_not_started)
            if isinstance(ran, SweepStopped):  # before the line that says how to resume
                log_where_to_look(sweep_dir)
            return ran

        returns = hook.run_locally(trials, run_trials)
    log.info("sweep done: %s", sweep_summary(returns))
    log_where_to_look(sweep_dir)
    return returns
