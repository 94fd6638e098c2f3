"""Submit some trials of a Slurm sweep again, into their own trial dirs: ``python -m hpcsweep.retry``.

``plan_retry`` does every check first (which trials, their state, the launcher changes, the trial
configs through the app's hook, the cluster's limits, the budget) and submits nothing;
``submit_retry`` then submits the chosen trials as one job array (one per allocation shape) with
``slurm_submit.submit_trials``, and records each trial's new attempt in ``sweep.json``. The trials
resume from their newest valid checkpoint, as a requeued trial does.

A retry's launcher overrides apply to that retry only: it starts from the sweep's own settings
(the launcher the first submission stored, which no retry overwrites) and its tasks load a launcher
of their own (``.submitit/retry-N/``). The budget is the exception: it covers the whole sweep and the
running tasks read it from ``sweep.json``, so a retry that names one sets it for the sweep, and a
retry that names none keeps the sweep's current budget.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcsweep.files.metrics_file import read_metrics
from hpcsweep.files.sweep_record import SweepRecord, now_iso, read_sweep_record, write_sweep_record
from hpcsweep.files.trial_files import METRICS_FILE, TrialFiles
from hpcsweep.results.budget import budget_reached, hours_text
from hpcsweep.results.table import load_sweep, resolve_trial_dir
from hpcsweep.slurm import commands
from hpcsweep.slurm.usage import Usage
from hpcsweep.sweep.allocation import check_option_values, check_time_limit
from hpcsweep.sweep.budget import BUDGET_KEY, check_budget, trial_units
from hpcsweep.sweep.containers import check_container, submission_params
from hpcsweep.sweep.hooks import SweepTrial, hook_of
from hpcsweep.sweep.retry_selection import TrialState, launcher_changes, partition_change_line, select_trials
from hpcsweep.sweep.shared_call import LAUNCHER_FILE, load_shared_launcher
from hpcsweep.sweep.slurm_submit import check_against_cluster, submit_trials
from hpcsweep.sweep.snapshot import submission_snapshot
from hpcsweep.sweep.sweep_trials import check_trials
from hpcsweep.sweep.text_preparation import dependency_parameters
from hpcsweep.trial.budget_watch import horizon_s, poll_interval

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RetryPlan:
    """Everything checked, nothing submitted yet."""

    sweep_dir: Path
    record: SweepRecord
    launcher: Any
    params: dict[str, Any]
    trials: list[SweepTrial]
    slurm_config: str
    budget: float | None
    sweep_partition: str | None = None
    """The partition of the sweep's own settings (None: the cluster's default)."""

    @property
    def partition_line(self) -> str | None:
        """What the retry says first when it runs in another partition than the sweep; None when it does not."""
        return partition_change_line(self.sweep_partition, self.params.get("partition"))


class SlurmDidNotAnswer(ValueError):
    """A retry refused because Slurm's commands failed (the command may say why: no configuration)."""


def submission_dir(sweep_dir: str, configured: str) -> Path | None:
    """The directory the sweep was submitted from, when ``hydra.sweep.dir`` was relative to it.

    A retry submits from there, so that every relative path of the sweep's pickled launcher (the
    sweep dir, submitit's folder) means what it meant. None when ``configured`` is absolute;
    ``ValueError`` when the sweep dir no longer ends with it (the sweep was moved).
    """
    if os.path.isabs(configured):
        return None
    recorded, relative = Path(sweep_dir), Path(os.path.normpath(configured))
    if recorded.parts[-len(relative.parts):] != relative.parts:
        raise ValueError(f"{sweep_dir} does not end with hydra.sweep.dir={configured}: was the sweep moved? "
                         "a retry must submit from where the sweep was submitted")
    return Path(*recorded.parts[: -len(relative.parts)])


def _check_again(launcher: Any, record: SweepRecord, sweep_dir: Path, nums: Sequence[int]) -> list[SweepTrial]:
    """Compose and check each chosen trial as its number, through the app's hook; its dir must not move."""
    hook = hook_of(launcher.task_function)
    trials = []
    for trial in (t for t in record.trials if t.num in nums):
        (checked,) = check_trials(launcher, [trial.overrides], trial.num, hook)
        recorded = resolve_trial_dir(sweep_dir, trial).resolve()
        if checked.trial_dir.resolve() != recorded:
            raise ValueError(f"trial #{trial.num} would run in {checked.trial_dir}, not in its own dir {recorded}")
        trials.append(checked)
    return trials


def plan_retry(
    sweep_dir: Path, statuses: Sequence[str] | None, numbers: Sequence[int] | None, overrides: Sequence[str]
) -> RetryPlan:
    """Choose and check the trials to retry; ``ValueError`` (one line) on anything refused. Submits nothing.

    Changes the process's directory to where the sweep was submitted from (see ``submission_dir``).
    """
    from hydra.core.singleton import Singleton
    from hydra.core.utils import setup_globals
    from omegaconf import DictConfig, open_dict

    sweep_dir = sweep_dir.resolve()
    record = read_sweep_record(sweep_dir)
    if record.launcher != "slurm":
        raise ValueError(f"{sweep_dir} is a local sweep: run its command again with hydra.sweep.dir={sweep_dir} "
                         "to resume its trials")
    sweep = load_sweep(sweep_dir, with_scalars=False)
    if sweep.slurm_error:
        raise SlurmDidNotAnswer(f"Slurm did not answer, so which trials still run is unknown: {sweep.slurm_error}")
    nums = select_trials([TrialState(r.num, r.status, r.last_stop_reason) for r in sweep.rows], statuses, numbers)
    launcher, singleton_state = load_shared_launcher(sweep_dir / ".submitit" / LAUNCHER_FILE)
    sweep_partition = launcher.params.get("partition")
    changes = launcher_changes(overrides, launcher.params)
    # The budget covers the whole sweep: without a new one, the sweep's current budget holds.
    params = {**launcher.params, BUDGET_KEY: record.budget_gpu_hours, **changes}
    Singleton.set_state(singleton_state)
    # Hydra's resolvers (``now``, ...), as the array task sets them up: the sweep dir may use them.
    setup_globals()
    origin = submission_dir(record.sweep_dir, str(launcher.config.hydra.sweep.dir))
    if origin is not None:
        os.chdir(origin)
    launcher.params = params
    with open_dict(launcher.config.hydra.launcher):
        node = launcher.config.hydra.launcher
        for key, value in params.items():
            # A settings group (container: a structured ContainerSettings node) takes a mapping by merging.
            if isinstance(node.get(key), DictConfig) and isinstance(value, Mapping):
                node[key].merge_with(value)
            else:
                node[key] = value
    trials = _check_again(launcher, record, sweep_dir, nums)
    check_option_values(params)
    check_time_limit(params)
    check_container(launcher, trials, params, sweep_dir)
    budget = check_budget(params)
    check_budget_left(budget, sweep.usage.spent_hours if sweep.usage else 0.0,
                      sum(trial_units(t, params) for t in trials), horizon_s(poll_interval(os.environ)))
    slurm_config = commands.show_config()
    check_against_cluster(trials, params, slurm_config, hook_of(launcher.task_function))
    return RetryPlan(sweep_dir, record, launcher, params, trials, slurm_config, budget, sweep_partition)


def check_budget_left(budget: float | None, spent_hours: float, units: int, horizon: float) -> None:
    """``ValueError`` unless the budget leaves the retried trials more than the budget watch's look-ahead.

    With less, each task would start and be skipped at once (``hpcsweep.trial.budget_watch``).
    """
    if budget_reached(Usage(spent_hours, float(units)), budget, horizon):
        raise ValueError(
            f"hydra.launcher.budget_gpu_hours={budget:g} is spent: {hours_text(spent_hours)} GPU-hours so far, and "
            f"{units} GPUs of retried trials need {hours_text(units * horizon / 3600.0)} more to start; raise it to retry"
        )


def forget_skipped_start(trial_dir: Path) -> None:
    """Remove the metrics.json of a trial the budget skipped before it trained: it starts afresh."""
    metrics = read_metrics(trial_dir / METRICS_FILE)
    if metrics and metrics.get("status") == "skipped_budget" and not any(TrialFiles(trial_dir).checkpoints.glob("*")):
        (trial_dir / METRICS_FILE).unlink()


def retry_launcher_folder(sweep_dir: Path) -> Path:
    """A new folder for this retry's launcher: ``.submitit/retry-N``, N one more than the retries so far."""
    earlier = [int(p.name.split("-", 1)[1]) for p in (sweep_dir / ".submitit").glob("retry-*")
               if p.name.split("-", 1)[1].isdigit()]
    return sweep_dir / ".submitit" / f"retry-{max(earlier, default=0) + 1}"


def submit_retry(plan: RetryPlan) -> SweepRecord:
    """Submit the planned trials and record their new attempts; returns the new ``sweep.json`` record."""
    # The tasks read the budget from sweep.json: it must hold the new one before the first starts.
    record = dataclasses.replace(plan.record, budget_gpu_hours=plan.budget)
    write_sweep_record(record)
    for trial in plan.trials:
        forget_skipped_start(trial.trial_dir)
    # The sweep's snapshot: a retry runs the code the sweep was submitted with.
    code_dir = submission_snapshot(plan.params, plan.sweep_dir, Path.cwd())
    # A corpus whose preparation failed (or whose cache entry is gone) is tokenized again first.
    preparation = hook_of(plan.launcher.task_function).submit_preparation(
        plan.trials, submission_params(plan.launcher, plan.trials, plan.params, plan.sweep_dir, code_dir), plan.sweep_dir)
    jobs_by_trial, arrays = submit_trials(plan.launcher, plan.trials, plan.params, plan.slurm_config, plan.sweep_dir,
                                          code_dir, retry_launcher_folder(plan.sweep_dir),
                                          extra_sbatch=dependency_parameters(preparation))
    submitted = now_iso()
    record = dataclasses.replace(
        record,
        trials=[t.retried(str(jobs_by_trial[t.num].job_id), submitted) if t.num in jobs_by_trial else t
                for t in record.trials],
        arrays=[*record.arrays, *arrays],
        token_preparation=preparation or record.token_preparation,
    )
    write_sweep_record(record)
    return record
