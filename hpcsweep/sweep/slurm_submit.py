"""Submit a validated sweep as Slurm job arrays, one array per allocation shape."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus

from hpcsweep.files.sweep_record import (
    ArrayRecord,
    SweepRecord,
    TrialRecord,
    now_iso,
    write_sweep_record,
)
from hpcsweep.slurm import commands
from hpcsweep.slurm.cluster_info import (
    parse_max_array_size,
    parse_max_switch_wait,
    qos_limits_enforced,
)
from hpcsweep.slurm.nodes import parse_node_states
from hpcsweep.slurm.partition_limits import (
    QOS_FIELDS,
    SINFO_FORMAT,
    QosLimits,
    check_request,
    chosen_partition,
    parse_qos_limits,
    parse_sinfo_partitions,
)
from hpcsweep.slurm.sweep_placement import PlacementRequest, sweep_placements
from hpcsweep.slurm.topology import (
    capped_max_wait_min,
    parse_topology,
)
from hpcsweep.sweep.allocation import (
    allocation_key,
    allocation_request,
    check_option_values,
    check_time_limit,
    chunk,
    executor_parameters,
)
from hpcsweep.sweep.budget import announce_budget
from hpcsweep.sweep.containers import RECORD_KEY, check_container, record_for_tasks, submission_params
from hpcsweep.sweep.hooks import Placement, SweepTrial, TrialHook, hook_of
from hpcsweep.sweep.snapshot import chosen_files, submission_snapshot
from hpcsweep.sweep.shared_call import SharedLauncherCall, TaskTrial, write_shared_launcher
from hpcsweep.sweep.sweep_trials import check_trials, exit_with_config_error
from hpcsweep.sweep.text_preparation import dependency_parameters

log = logging.getLogger(__name__)


def _placement_options(
    trials: Sequence[SweepTrial], params: dict[str, Any], max_switch_wait_s: int
) -> dict[int, dict[str, str]]:
    """Switch-tree constraints per trial, from one look at the topology and node states.

    No Slurm command runs when no trial asks for a placement.
    """
    placed = [t for t in trials if t.allocation.placement is not None and t.allocation.nodes > 1]
    if not placed:
        return {}
    requests = []
    warned: set[str] = set()
    launcher_exclude = [name for name in (params.get("exclude") or "").split(",") if name]
    for trial in placed:
        allocation = trial.allocation
        placement = allocation.placement or Placement()
        max_wait_min, warning = capped_max_wait_min(placement.max_wait_min, max_switch_wait_s)
        if warning and warning not in warned:
            warned.add(warning)
            log.warning(warning)
        requests.append(PlacementRequest(
            trial=trial.num, mode=placement.mode, nodes=allocation.nodes, max_wait_min=max_wait_min,
            exclude=(*allocation.exclude, *launcher_exclude),
        ))
    # One placement for the whole sweep, so that pin mode hands each trial its own nodes.
    options, messages = sweep_placements(
        requests,
        parse_topology(commands.show_topology()),
        parse_node_states(commands.show_nodes()),
        partition=params.get("partition"),
    )
    for message in messages:
        log.warning(message)
    return options


def _qos_limits(name: str | None, slurm_config: str) -> QosLimits | None:
    """The requested QOS's limits, when the cluster enforces them and accounting answers."""
    if name is None or not qos_limits_enforced(slurm_config):
        return None
    try:
        found = parse_qos_limits(commands.show_qos(name, QOS_FIELDS))
    except commands.SlurmCommandError as err:
        log.warning("limits of qos %s not checked: %s", name, err)
        return None
    return next((qos for qos in found if qos.name == name), None)


def check_against_cluster(
    trials: Sequence[SweepTrial], params: dict[str, Any], slurm_config: str, hook: TrialHook | None = None
) -> None:
    """Raise ``ValueError`` when a distinct allocation of the sweep could never start, or when the
    app's ``hook`` refuses the sweep on the partition's nodes (hpcsweep's: a trial's memory plan).

    One ``sinfo`` call (and a ``sacctmgr`` one when a QOS is named and its limits are enforced).
    """
    requests = dict.fromkeys(allocation_request(t.allocation, params) for t in trials)
    partitions = parse_sinfo_partitions(commands.sinfo_partitions(SINFO_FORMAT))
    qos = _qos_limits(params.get("qos"), slurm_config)
    for request in requests:
        check_request(request, partitions, qos)
    if hook is not None and trials:
        partition = chosen_partition(params.get("partition"), partitions)
        hook.check_cluster(trials, params, [shape.gres for shape in partition.nodes])


def _group_by_allocation(
    trials: Sequence[SweepTrial], params: dict[str, Any], max_switch_wait_s: int
) -> list[tuple[dict[str, Any], list[SweepTrial]]]:
    placement = _placement_options(trials, params, max_switch_wait_s)
    groups: dict[tuple, tuple[dict[str, Any], list[SweepTrial]]] = {}
    for trial in trials:
        parameters = executor_parameters(trial.allocation, params, placement.get(trial.num))
        groups.setdefault(allocation_key(parameters), (parameters, []))[1].append(trial)
    return list(groups.values())


def trials_per_task(params: dict[str, Any]) -> int:
    """``hydra.launcher.trials_per_task`` (absent: 1); ``ValueError`` unless a whole number >= 1."""
    value = params.get("trials_per_task", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"hydra.launcher.trials_per_task={value!r} is not allowed: a whole number >= 1 "
            "(trials one array task runs one after another)"
        )
    return value


def slurm_executor(params: Mapping[str, Any], parameters: Mapping[str, Any]) -> Any:
    """The submitit executor of one array: ``parameters`` (``executor_parameters``'s) in the folder and with
    the requeue cap of the launcher settings ``params``."""
    import submitit

    parameters = dict(parameters)
    # The command that starts Python (a container's): an executor argument, not an update_parameters one.
    python = {"slurm_python": parameters.pop("slurm_python")} if "slurm_python" in parameters else {}
    executor = submitit.AutoExecutor(
        folder=params["submitit_folder"],
        cluster="slurm",
        slurm_max_num_timeout=params["max_num_timeout"],
        **python,
    )
    executor.update_parameters(**parameters)
    return executor


def _submit_array(
    launcher: Any, call: SharedLauncherCall, parameters: dict[str, Any], tasks: Sequence[Sequence[SweepTrial]]
) -> list[Any]:
    executor = slurm_executor(launcher.params, parameters)
    return executor.map_array(call, [[TaskTrial(t.overrides, t.num, t.app_config) for t in task] for task in tasks])


def for_tasks(launcher: Any, params: Mapping[str, Any]) -> Any:
    """The launcher as each array task gets it: a copy whose settings carry what the tasks record of this
    submission, whose launcher settings are ``params`` (the container's image and identity,
    ``containers.record_for_tasks``)."""
    handed = copy.copy(launcher)
    handed.params = {**launcher.params, RECORD_KEY: record_for_tasks(params)[RECORD_KEY]}
    return handed


def recorded_settings(params: Mapping[str, Any]) -> dict[str, Any]:
    """The launcher settings as ``sweep.json`` records them: public keys, values as JSON holds them."""
    import json

    public = {key: value for key, value in params.items() if not key.startswith("_")}
    return json.loads(json.dumps(public, default=str))


def submit_trials(
    launcher: Any, trials: Sequence[SweepTrial], params: dict[str, Any], slurm_config: str, sweep_dir: Path,
    code_dir: Path | None, launcher_folder: Path | None = None, extra_sbatch: Mapping[str, str] | None = None,
) -> tuple[dict[int, Any], list[ArrayRecord]]:
    """Submit checked trials into ``sweep_dir`` as job arrays, one per allocation shape and size cap.

    Each array task runs ``trials_per_task`` consecutive trials of one allocation shape (the last
    task of a shape may run fewer). ``params`` are the launcher settings to submit with (a retry
    may change them); ``slurm_config`` is ``scontrol show config``'s text. The tasks load the
    launcher from ``launcher_folder`` (default ``SWEEP_DIR/.submitit``): a retry gives its own, so
    that its settings never reach the sweep's tasks nor a later retry. Returns each trial's
    submitit job (trials packed into one task share it) and the arrays, each recording ``params``.
    ``code_dir`` is the code snapshot the tasks import (``submission_snapshot``; None: the installed
    code). ``extra_sbatch`` (the token preparation's dependency) reaches this submission's sbatch only,
    never the recorded settings a retry reuses. A container (``hydra.launcher.container``) comes in
    through ``submission_params``, as for the token preparation.
    """
    per_task = trials_per_task(params)
    max_array_size = parse_max_array_size(slurm_config)
    if params.get("max_array_size"):
        max_array_size = min(max_array_size, int(params["max_array_size"]))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    settings = recorded_settings(params)
    params = submission_params(launcher, trials, params, sweep_dir, code_dir)
    folder = sweep_dir / ".submitit" if launcher_folder is None else launcher_folder
    folder.mkdir(parents=True, exist_ok=True)
    shared = write_shared_launcher(folder, for_tasks(launcher, settings), Singleton.get_state())
    call = SharedLauncherCall(str(shared))
    jobs_by_trial: dict[int, Any] = {}
    arrays: list[ArrayRecord] = []
    for parameters, group in _group_by_allocation(trials, params, parse_max_switch_wait(slurm_config)):
        if extra_sbatch:
            parameters = {**parameters, "slurm_additional_parameters": {
                **parameters["slurm_additional_parameters"], **extra_sbatch}}
        for tasks in chunk(chunk(group, per_task), max_array_size):
            jobs = _submit_array(launcher, call, parameters, tasks)
            for task, job in zip(tasks, jobs, strict=True):
                jobs_by_trial.update((trial.num, job) for trial in task)
            arrays.append(ArrayRecord(str(jobs[0].job_id).split("_")[0], [t.num for task in tasks for t in task],
                                      per_task, settings))
    return jobs_by_trial, arrays


def launch_on_slurm(
    launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> Sequence[JobReturn]:
    """Check every trial (through the app's hook) and the launcher settings, submit, write ``sweep.json``.

    Returns at once with each trial's job id as its return value, unless ``wait`` is set, in
    which case it blocks on every trial's result and returns Hydra's usual JobReturns.
    """
    params = launcher.params
    try:
        hook = hook_of(launcher.task_function)
        trials = check_trials(launcher, job_overrides, initial_job_idx, hook)
        check_option_values(params)
        check_time_limit(params)
        trials_per_task(params)
        sweep_dir = Path(str(launcher.config.hydra.sweep.dir)).resolve()
        check_container(launcher, trials, params, sweep_dir)
        slurm_config = commands.show_config()
        check_against_cluster(trials, params, slurm_config, hook)
        budget = announce_budget(trials, params)
        app_facts = hook_of(launcher.task_function).sweep_facts(trials)
        if params.get("code_snapshot", True):  # a snapshot too large to be code is refused here
            chosen_files(sweep_dir, Path.cwd())
    except ValueError as err:
        exit_with_config_error(err, "nothing was submitted")
    code_dir = submission_snapshot(params, sweep_dir, Path.cwd())
    preparation = hook_of(launcher.task_function).submit_preparation(
        trials, submission_params(launcher, trials, params, sweep_dir, code_dir), sweep_dir)
    jobs_by_trial, arrays = submit_trials(launcher, trials, params, slurm_config, sweep_dir, code_dir,
                                          extra_sbatch=dependency_parameters(preparation))

    submitted = now_iso()
    record = SweepRecord(
        sweep_dir=str(sweep_dir),
        launcher="slurm",
        created_at=submitted,
        trials=[
            TrialRecord(t.num, t.overrides, str(t.trial_dir), str(jobs_by_trial[t.num].job_id), submitted)
            for t in trials
        ],
        arrays=arrays,
        budget_gpu_hours=budget,
        app=app_facts,
        token_preparation=preparation,
    )
    write_sweep_record(record)
    log.info("sweep dir: %s", sweep_dir)
    arrays_text = ", ".join(record.job_ids())
    log.info("submitted %s as job %s %s", "1 trial" if len(trials) == 1 else f"{len(trials)} trials",
             "array" if len(record.job_ids()) == 1 else "arrays", arrays_text)
    log.info("status: python -m hpcsweep.status %s", sweep_dir)
    log.info("report: python -m hpcsweep.report %s", sweep_dir)

    if params.get("wait"):
        return await_results(jobs_by_trial, trials)
    return [
        JobReturn(
            overrides=t.overrides,
            working_dir=str(t.trial_dir),
            status=JobStatus.COMPLETED,
            _return_value=str(jobs_by_trial[t.num].job_id),
        )
        for t in trials
    ]


def await_results(jobs_by_trial: dict[int, Any], trials: Sequence[SweepTrial]) -> list[JobReturn]:
    """Every trial's JobReturn, as the array task's ``run_job`` built it, once all have ended.

    A task that failed, or ended without a result (cancelled, requeued too often), gives each of
    its trials a FAILED JobReturn holding the task's error (its trials' own ends are in their
    ``metrics.json``), so that every trial is waited for and Hydra's sweeper reports the first
    failure, as it does with Hydra's own launchers.
    """
    from submitit.core.utils import UncompletedJobError

    returns = []
    for trial in trials:
        try:
            returns.append(jobs_by_trial[trial.num].results()[0][trial.num])
        except UncompletedJobError as err:
            returns.append(
                JobReturn(overrides=trial.overrides, working_dir=str(trial.trial_dir), status=JobStatus.FAILED,
                          _return_value=err)
            )
    return returns
