"""hpcsweep's own trials through the launchers' hook: their schema, size, placement, resumes and stops.

``hpcsweep.app`` decorates its task function with ``trial_hook(HpcsweepTrials())``; another
Hydra app's trials never pass through here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn

from hpcsweep.config import ResumeConfig, TrialConfig, resume_config_from_dict
from hpcsweep.files.sweep_record import TokenPreparationRecord
from hpcsweep.sweep.hooks import Allocation, CheckedTrial, Placement, SweepStopped, SweepTrial, TrialHook
from hpcsweep.sweep.model_records import SweepModelRecords
from hpcsweep.sweep.prepare import PreparedTrial, check_resumes, validate_composed
from hpcsweep.sweep.tracker_check import check_trackers, create_default_mlflow_stores
from hpcsweep.sweep.text_preparation import prepare_here, submit_preparation

log = logging.getLogger(__name__)

CheckedConfig = tuple[TrialConfig, ResumeConfig]
"""What ``HpcsweepTrials.check_trial`` makes of a trial's config: its trial and resume settings, validated."""

# Module-wide, not the hook's: the task function unpickled in an array task carries a copy of its hook.
_CHECKED: ContextVar[CheckedConfig | None] = ContextVar("hpcsweep_checked_trial", default=None)


def checked_trial() -> CheckedConfig | None:
    """The checked config of the trial whose task function runs now (``HpcsweepTrials.running_checked``), else None."""
    return _CHECKED.get()


_CONTAINER: ContextVar[dict[str, Any] | None] = ContextVar("hpcsweep_task_container", default=None)


def task_container() -> dict[str, Any] | None:
    """The container this array task was submitted to run in, with its image's identity at submission
    (``hpcsweep.sweep.containers.record_of``; ``HpcsweepTrials.task_context``); None outside one."""
    return _CONTAINER.get()


# Launcher keys that size or place a job of another app; hpcsweep's trials set these themselves.
_TRIAL_SET_KEYS = {
    "nodes": "trainer.nodes (one task per node runs the trial's torchrun agent)",
    "tasks_per_node": "trainer.nodes (one task per node runs the trial's torchrun agent)",
    "placement": "topology.mode",
    "placement_max_wait_min": "topology.max_wait_min",
}
_LAUNCHER_DEFAULTS = {"nodes": 1, "tasks_per_node": 1, "placement": None, "placement_max_wait_min": None}


def refuse_launcher_size(params: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` when the launcher sets what an hpcsweep trial's own config sets.

    One number for one thing: a trial's nodes and placement come from its config, never from
    ``hydra.launcher`` as well.
    """
    for key, default in _LAUNCHER_DEFAULTS.items():
        value = params.get(key, default)
        if value != default:
            raise ValueError(
                f"hydra.launcher.{key}={value!r} is not allowed: hpcsweep's trials set it with {_TRIAL_SET_KEYS[key]}"
            )


def trial_allocation(trial: TrialConfig) -> Allocation:
    """The allocation of an hpcsweep trial: ``trainer.nodes`` nodes with one task each.

    GPUs: one per worker when ``trainer.nproc_per_node`` is a number, else the launcher's (the
    workers then follow the GPUs). Multi-node trials are placed by ``topology.*``.
    """
    nodes, nproc, topology = trial.trainer.nodes, trial.trainer.nproc_per_node, trial.topology
    return Allocation(
        nodes=nodes,
        tasks_per_node=1,
        gpus_per_node=None if nproc == "auto" else nproc,
        exclude=tuple(topology.exclude),
        placement=None if nodes == 1 or topology.mode == "off" else Placement(topology.mode, topology.max_wait_min),
        nodes_key="trainer.nodes",
        gpus_key="trainer.nproc_per_node",
    )


def log_resume_state(trials: Sequence[SweepTrial]) -> None:
    """Say which trials of a resumed sweep have ended and which resume, before anything runs."""
    from hpcsweep.files.metrics_file import read_metrics
    from hpcsweep.files.trial_files import TrialFiles

    for trial in trials:
        metrics = read_metrics(TrialFiles(trial.trial_dir).metrics)
        if metrics:
            log.info("trial #%d: %s at step %s before this run", trial.num, metrics.get("status"), metrics.get("step"))


class HpcsweepTrials(TrialHook):
    """hpcsweep's trial checks, sizes, local stop handling and array-task signal handling.

    The model folders the trials load are read once per sweep (``begin_sweep``), into records every
    check of that sweep reads (``hpcsweep.sweep.model_records``).
    """

    plain_values = True
    preload = (
        "numpy",
        "torch",
        "torch.nn.parallel",
        # The checkpoints': about 0.7 s of torch.distributed on their own.
        "torch.distributed.checkpoint.state_dict",
        "torch.distributed.checkpoint.staging",
        "torch.utils.tensorboard",
        "transformers",
        # The model classes a trial builds, which transformers imports lazily: about 1 s.
        "transformers.models.llama.modeling_llama",
        "transformers.models.deepseek_v3.modeling_deepseek_v3",
    )

    def __init__(self) -> None:
        self._sweep: object | None = None
        self._records = SweepModelRecords()

    def __reduce__(self) -> tuple[type, tuple[()]]:
        # A task unpickles a new hook: the login node's launcher and the folders it read stay there.
        return type(self), ()

    def begin_sweep(self, sweep: object) -> None:
        """A new ``sweep`` (launcher) reads its model folders afresh: they may have changed since the last."""
        if sweep is not self._sweep:
            self._sweep, self._records = sweep, SweepModelRecords()

    def check_trial(self, config: Mapping[str, Any], launcher: Mapping[str, Any]) -> CheckedTrial:
        """The trial schema (``hpcsweep.config``), then the allocation its config asks for.

        The app config, kept for ``check_sweep`` and handed to the trial's task (``running_checked``), is the
        pair ``(TrialConfig, ResumeConfig)``.
        """
        trial = validate_composed(config, self._records)
        check_trackers(trial.logging)
        resume = resume_config_from_dict(config)
        refuse_launcher_size(launcher)
        return CheckedTrial(trial_allocation(trial), (trial, resume))

    def check_sweep(self, trials: Sequence[SweepTrial]) -> None:
        """No trial fine-tunes a model folder on synthetic tokens unless its command line says so
        (``hpcsweep.sweep.fine_tune_data``); every trial dir that holds a checkpoint was trained with this
        trial's config (or ``resume.force``); the sweep's default MLflow store exists before its trials start.
        Then, locally and on Slurm alike, it says whether an earlier sweep dir of this command holds
        unfinished trials, with the line that resumes it (``hpcsweep.sweep.earlier_sweep``)."""
        from hpcsweep.sweep.fine_tune_data import refuse_synthetic_fine_tuning
        from hpcsweep.sweep.sweep_trials import SweepConfigError, trial_label

        for t in trials:
            try:
                refuse_synthetic_fine_tuning(t.app_config[0], t.overrides)
            except ValueError as err:
                raise SweepConfigError(f"trial #{t.num} ({trial_label(t.overrides)}): {err}") from None
        check_resumes([PreparedTrial(t.num, t.overrides, t.trial_dir, *t.app_config) for t in trials], self._records)
        create_default_mlflow_stores((t.app_config[0].logging, Path(t.trial_dir)) for t in trials)
        # Said once the sweep is accepted, before it runs here or is submitted: a Slurm sweep cancelled
        # (scancel) and typed again has the same stopped trials in its earlier dir as a Ctrl-C'd local one.
        from hpcsweep.sweep.earlier_sweep import say_if_an_earlier_sweep_stopped

        sweep_dir = getattr(getattr(self._sweep, "config", None), "hydra", {}).get("sweep", {}).get("dir")
        if sweep_dir:  # a launcher's sweep (begin_sweep); not a hook driven without one
            say_if_an_earlier_sweep_stopped(Path(str(sweep_dir)), [t.overrides for t in trials])

    def sweep_facts(self, trials: Sequence[SweepTrial]) -> dict[str, Any]:
        """``models``: the identity of each model folder the trials load, by ``model.path``, as submitted."""
        models = {t.app_config[0].model.path: self._records.identity(t.app_config[0]) for t in trials}
        models.pop(None, None)
        return {"models": models} if models else {}

    def check_cluster(self, trials: Sequence[SweepTrial], launcher: Mapping[str, Any], partition_gres: Sequence[str]) -> None:
        """Every trial's memory plan fits the GPUs it will get (``hpcsweep.sweep.memory_check``)."""
        from hpcsweep.sweep.memory_check import check_memory_plans

        check_memory_plans(trials, launcher, partition_gres, self._records)

    def check_objective(self, trial: CheckedTrial, objective: str) -> None:
        """A task score objective (``tasks.NAME.METRIC``) names a task of the trial's ``tasks.names``."""
        parts, names = objective.split("."), trial.app_config[0].tasks.names
        if parts[0] == "tasks" and (len(parts) != 3 or parts[1] not in names):
            raise ValueError(f"hydra.sweeper.objective={objective} is not allowed: a task score is tasks.NAME.METRIC "
                             f"with NAME one of tasks.names={names}")

    def objective_steps(self, trial: CheckedTrial) -> tuple[int, int]:
        """The trainer evaluates every ``trainer.eval_every`` steps and at ``trainer.max_steps``, and
        runs a trial's tasks every ``tasks.every`` steps (0: at the end only)."""
        trainer, tasks = trial.app_config[0].trainer, trial.app_config[0].tasks
        task_every = tasks.every if tasks.names and tasks.every > 0 else trainer.max_steps
        return min(trainer.eval_every, task_every, trainer.max_steps), trainer.max_steps

    def run_locally(
        self, trials: Sequence[SweepTrial], run_trials: Callable[[Sequence[SweepTrial]], list[JobReturn] | SweepStopped]
    ) -> list[JobReturn]:
        """Say which trials resume, then run them; a stop signal (Ctrl-C) stops the running trials with a
        checkpoint and starts no further one, and the command says in one line how to resume."""
        log_resume_state(trials)
        prepare_here([t.app_config[0] for t in trials])
        return super().run_locally(trials, run_trials)

    def submit_preparation(
        self, trials: Sequence[SweepTrial], launcher: Mapping[str, Any], sweep_dir: Path
    ) -> TokenPreparationRecord | None:
        """The job that tokenizes a ``data=text`` corpus with no cache entry yet (``hpcsweep.sweep.text_preparation``)."""
        return submit_preparation([t.app_config[0] for t in trials], launcher, sweep_dir, [t.trial_dir for t in trials])

    def container_paths(self, trials: Sequence[SweepTrial]) -> list[tuple[str, str]]:
        """Each trial's model folder, data, token cache, tokenizer, template, task folder, NCCL topology and
        local MLflow store (``hpcsweep.sweep.containers.trial_paths``)."""
        from hpcsweep.sweep.containers import trial_paths

        return list(dict.fromkeys(path for t in trials for path in trial_paths(t.app_config[0])))

    def stopped_line(self, what: str) -> str:
        """``what``, and the command that resumes the sweep."""
        from hpcsweep.sweep.resume_hint import stopped_line

        return stopped_line(what)

    @contextmanager
    def running_checked(self, app_config: CheckedConfig | None) -> Iterator[None]:
        """The task function runs ``app_config``, checked on the login node, instead of validating its
        composition again (``checked_trial``)."""
        token = _CHECKED.set(app_config)
        try:
            yield
        finally:
            _CHECKED.reset(token)

    @contextmanager
    def task_context(self, launcher: Mapping[str, Any]) -> Iterator[None]:
        """The stop signals are the trial runner's from here on; it takes its caps (requeues, retries,
        the signal's lead) from the launcher's config itself (``hpcsweep.trial.attempt.Caps``).

        submitit's handlers (USR2: requeue and ``sys.exit`` at once) are replaced from here on, so
        a signal during start-up is kept for the runner instead. The task's container record
        (``task_container``) is the one the submission handed it in ``launcher``.
        """
        from hpcsweep.control.stop import STOP_REQUESTED, stop_signals_handled
        from hpcsweep.sweep.containers import record_of

        token = _CONTAINER.set(record_of(launcher))
        try:
            with stop_signals_handled(STOP_REQUESTED.set):
                yield
        finally:
            _CONTAINER.reset(token)
