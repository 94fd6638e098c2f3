"""The Hydra application: run the trial of the composed config on this node.

A trial is validated once, where it was composed for checking: on the login node for a sweep (the
launchers hand each task the config it checked, ``HpcsweepTrials.running_checked``), before Hydra starts
for a single run (``hpcsweep.sweep.single_run``). The task re-checks only what may change between that
check and the run: the token file here, the resume guard in the runner. A trial checked nowhere (a
search's chosen parameters, a launcher that is not hpcsweep's) is validated here.

The runner returns an ``Outcome``. A trial that ended (completed, pruned, skipped) returns its
metrics.json to Hydra; a failed one raises ``TrialFailed``, which is how Hydra marks a job FAILED.
A trial whose process must leave (a stop, a requeue, a retry) returns its ``Outcome`` in a sweep, to
the launcher that runs it (the Slurm array task, the local trial process), which ends its process;
a single run ends the command here, through ``hpcsweep.control.exit_codes``, with one line naming
the command that resumes.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hpcsweep.config import ResumeConfig, TrialConfig, resume_config_from_dict
from hpcsweep.control import exit_codes, stop
from hpcsweep.control.outcome import Outcome, ends_the_task
from hpcsweep.model.offline import stay_offline
from hpcsweep.sweep.hooks import trial_hook
from hpcsweep.sweep.hpcsweep_hook import HpcsweepTrials, checked_trial, task_container
from hpcsweep.sweep.prepare import check_model_and_data, validate_composed
from hpcsweep.sweep.resume_hint import stopped_line, this_trial
from hpcsweep.sweep.sweep_trials import exit_with_config_error
from hpcsweep.sweep.text_preparation import prepare_here

# Before anything imports transformers (hpcsweep.model.offline says why); nothing above does.
stay_offline()
log = logging.getLogger("hpcsweep")


def register_plugins() -> None:
    """Register hpcsweep's launchers and sweeper with Hydra explicitly.

    Hydra finds plugins by scanning the ``hydra_plugins`` namespace with pkgutil, which does not
    see packages that an editable install (``pip install -e .``) maps in through an import hook.
    """
    from hydra.core.plugins import Plugins

    # The scan re-executes the modules of the plugins it finds (Hydra's own among them); only
    # classes defined after it subclass the final BasicSweeper and BaseSubmititLauncher.
    plugins = Plugins.instance()
    import hydra_plugins.hpcsweep_plugins.config  # noqa: F401  (stores the launcher configs)
    from hydra_plugins.hpcsweep_plugins.launchers import (
        AutoLauncher,
        LocalLauncher,
        SlurmLauncher,
    )
    from hydra_plugins.hpcsweep_plugins.search_sweeper import SearchSweeper
    from hydra_plugins.hpcsweep_plugins.sweeper import GridSweeper

    for plugin in (AutoLauncher, LocalLauncher, SlurmLauncher, GridSweeper, SearchSweeper):
        plugins.register(plugin)


def run_trial_task(cfg: DictConfig) -> dict[str, Any] | Outcome:
    """Hydra's task function: one trial, on every node of its allocation.

    Runs locally for a single run or a local sweep, and inside each Slurm array task. Returns the
    trial's metrics.json when it ended, else (in a sweep) the ``Outcome`` its launcher acts on.
    """
    from hydra.types import RunMode

    from hpcsweep.search.trial_slot import study_trial_file
    from hpcsweep.trial.attempt import Caps
    from hpcsweep.trial.identity import ConfigMismatch
    from hpcsweep.trial.launch import TrialFailed
    from hpcsweep.trial.runner import run_trial_on_this_node

    try:
        trial, resume = trial_to_run(cfg)
    except ValueError as err:
        exit_with_config_error(err, "the trial did not run")
    hydra_config = HydraConfig.get()
    trial_dir = Path(hydra_config.runtime.output_dir)
    if hydra_config.mode == RunMode.RUN:
        prepare_here([trial])  # a sweep tokenized its text before its first trial; a single run does it here
    try:
        caps = Caps.from_launcher(hydra_config.get("launcher") or {})
    except ValueError as err:
        exit_with_config_error(err, "the trial did not run")
    # A stop signal before the runner's own handlers are in place still stops the trial; one after it (the
    # SIGTERM of a single run's own requeue) does not end the process before its exit code.
    with stop.stop_signals_handled(stop.STOP_REQUESTED.set):
        try:
            outcome = run_trial_on_this_node(with_workers_per_node(trial), trial_dir, caps=caps,
                                             force_resume=resume.force, search_trial=study_trial_file(hydra_config),
                                             container=task_container())
        except ConfigMismatch as err:
            exit_with_config_error(err, "the trial did not run")
        if outcome.kind == "failed":
            raise TrialFailed(outcome.message)
        if not ends_the_task(outcome):
            return outcome.metrics
        outcome = dataclasses.replace(outcome, message=what_stopped(outcome))
        if hydra_config.mode == RunMode.RUN:
            exit_codes.leave(outcome, stopped_line(outcome.message))
    return outcome


def trial_to_run(cfg: DictConfig) -> tuple[TrialConfig, ResumeConfig]:
    """The trial and resume settings to run: those checked before this task (``checked_trial``), with their
    model folder and token file checked again (either may be written or replaced after the check),
    else ``cfg`` validated here.

    ``ValueError`` naming the key when either refuses.
    """
    checked = checked_trial()
    if checked is None:
        return validate_composed(cfg), resume_config_from_dict(cfg)
    trial, resume = checked
    check_model_and_data(trial)
    return trial, resume


def what_stopped(outcome: Outcome) -> str:
    """The line that says how this trial's process leaves (without the command that resumes)."""
    if outcome.kind == "aborted":
        return f"interrupted again: {this_trial()} left without a checkpoint of this step (its older checkpoints are kept)"
    if outcome.kind == "stopped":
        return f"{outcome.reason or 'stopped'}: {this_trial()} stopped at step {outcome.step} with a checkpoint"
    return outcome.message


def with_workers_per_node(trial: TrialConfig) -> TrialConfig:
    """The trial with ``trainer.nproc_per_node=auto`` resolved on this node (one worker per GPU)."""
    from hpcsweep.train.distributed import resolve_nproc_per_node, visible_cuda_devices

    nproc = resolve_nproc_per_node(trial.trainer.nproc_per_node, visible_cuda_devices(trial.trainer.device))
    return dataclasses.replace(trial, trainer=dataclasses.replace(trial.trainer, nproc_per_node=nproc))


@hydra.main(config_path="pkg://hpcsweep.configs", config_name="config", version_base="1.3")
@trial_hook(HpcsweepTrials())
def hydra_main(cfg: DictConfig) -> dict[str, Any]:
    """``python -m hpcsweep``: see ``--help``."""
    return run_trial_task(cfg)


register_plugins()
