"""Everything known about a sweep's trials, as rows: what the report and status commands show.

``build_row`` is pure: one trial's record, metrics.json, Slurm state, scalars and error text in,
one ``TrialRow`` out. ``load_sweep`` does the reading: sweep.json, each trial's metrics.json and
event files, and one ``sacct`` call for the whole sweep (none for a local sweep). A trial dir
without sweep.json (``sbatch slurm/train.sbatch`` writes one) loads as a sweep of that one trial.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcsweep.files.metric_keys import TASKS_KEY, metric_value, task_score_keys
from hpcsweep.files.metrics_file import NOT_STARTED, read_metrics
from hpcsweep.files.sweep_record import (
    SWEEP_FILE,
    ArrayRecord,
    SweepRecord,
    TrialRecord,
    read_sweep_record,
    resolve_trial_dir,
)
from hpcsweep.files.tb_runs import run_event_files
from hpcsweep.files.trial_files import CONFIG_FILE, ENVIRONMENT_FILE, TrialFiles
from hpcsweep.files.usage_file import USAGE_FILE, read_runs
from hpcsweep.results.budget import usage_of_local_trials, usage_of_states
from hpcsweep.results.efficiency import TrialEfficiency, efficiency_of
from hpcsweep.results.failure import summarize_error, trial_error_text
from hpcsweep.results.gpu_hours import allocated_hours_by_trial
from hpcsweep.results.never_started import NEVER_STARTED_STATUSES, never_started, never_started_line
from hpcsweep.results.token_preparation import last_line
from hpcsweep.results.overrides import override_values, trained_values
from hpcsweep.slurm.commands import SlurmCommandError
from hpcsweep.slurm.job_states import JobState, query_job_states
from hpcsweep.slurm.usage import Usage

if TYPE_CHECKING:
    from hpcsweep.results.event_reader import ScalarSeries

FINAL_STATUSES = (
    "completed", "stopped_early", "pruned", "failed", "cancelled", "stopped", "skipped_budget", NOT_STARTED,
)
"""Statuses after which a trial changes no more (a ``stopped`` trial resumes only when run again)."""
FINISHED_STATUSES = ("completed", "stopped_early", "pruned")
"""Statuses the trainer writes when a trial is done, whatever Slurm says afterwards."""
OVERRIDES_FILE = ".hydra/overrides.yaml"
CONFIG_BEFORE_GLOB = "config.before-*.yaml"
"""The configs a trial trained with before a ``resume.force=true`` run (``hpcsweep.trial.runner``)."""
METRICS = (
    "best_val_loss", "val_loss", "train_loss", "mean_tokens_per_s", "tokens_per_s", "gpu_hours", "own_gpu_hours",
    "step", "restarts",
)
"""Row fields ``--metric`` may sort by."""
REWARD_METRICS = ("val_reward_accuracy", "val_reward_margin")
"""``objective=dpo``'s validation scores (``hpcsweep.train.trainer.Trainer.evaluate_pairs``), row fields where measured."""
HIGHER_IS_BETTER = ("val_accuracy", *REWARD_METRICS, "mean_tokens_per_s", "tokens_per_s")
"""Row fields whose best value is the largest (task scores are, too: ``higher_is_better``)."""
SCALAR_FALLBACKS = {"train_loss": "train/loss", "val_loss": "val/loss", "tokens_per_s": "perf/tokens_per_s",
                    "val_accuracy": "val/accuracy", "val_reward_accuracy": "val/reward_accuracy",
                    "val_reward_margin": "val/reward_margin"}
"""Where a metric comes from when metrics.json lacks it: the latest point of this scalar tag."""

JobQuery = Callable[[Sequence[str]], Mapping[str, JobState]]


@dataclass(frozen=True)
class TrialRow:
    """One trial as the report shows it."""

    num: int
    overrides: dict[str, str]
    status: str
    """``completed``, ``stopped_early``, ``pruned``, ``failed``, ``cancelled``, ``stopped``, ``running`` or ``pending``."""
    job_id: str | None = None
    slurm_state: str | None = None
    step: int | None = None
    max_steps: int | None = None
    train_loss: float | None = None
    val_loss: float | None = None
    best_val_loss: float | None = None
    val_accuracy: float | None = None
    """Next-token accuracy on the validation split at the last evaluation (metrics.json ``val_accuracy``)."""
    val_reward_accuracy: float | None = None
    """``objective=dpo``: the share of validation pairs whose chosen answer's reward beats the rejected one's, at the
    last evaluation (metrics.json ``val_reward_accuracy``)."""
    val_reward_margin: float | None = None
    """``objective=dpo``: the validation pairs' mean reward margin (metrics.json ``val_reward_margin``)."""
    task_scores: dict[str, float] = field(default_factory=dict)
    """The latest task scores by ``tasks.NAME.METRIC`` (metrics.json ``tasks``;
    ``hpcsweep.train.scores.task_scorer``)."""
    tokens_per_s: float | None = None
    """The latest logged window's throughput (metrics.json's ``tokens_per_s``)."""
    mean_tokens_per_s: float | None = None
    """Throughput over the whole run, every attempt (:func:`mean_tokens_per_s`)."""
    restarts: int | None = None
    gpu_hours: float | None = None
    """Allocated GPU-hours of the trial's tasks, its part of a shared one (``hpcsweep.results.gpu_hours``)."""
    own_gpu_hours: float | None = None
    """The trial's own compute share: its latest run's wall time x its workers (``hpcsweep.results.gpu_hours``)."""
    world_size: int | None = None
    nodes: str = ""
    error: str = ""
    """For a failed trial: why, in one line; for a cancelled one whose run never started, why, when known."""
    trial_dir: str = ""
    reason: str = ""
    """For a pending trial: why Slurm has not started it (``Priority``, ``PartitionConfig`` ...)."""
    never_starts: str = ""
    """For a pending trial whose reason never clears: why waiting will not start it, in one line."""
    attempt: int = 1
    """Which submission of the trial this is (``python -m hpcsweep.retry`` adds one)."""
    last_stop_reason: str = ""
    """Why the trial last stopped with a checkpoint (``time_limit``, ``preempted``, ``budget`` ...)."""
    memory_plan_bytes: int | None = None
    """The memory plan's tensors per GPU (metrics.json ``memory_plan.tensors_bytes``; ``hpcsweep.memory_plan``)."""
    memory_peak_bytes: int | None = None
    """What rank 0 measured: ``torch.cuda.max_memory_allocated`` on GPU, the peak resident set on CPU."""
    efficiency: TrialEfficiency = field(default_factory=TrialEfficiency)
    """How the trial used its hardware (``hpcsweep.results.efficiency``): ``report --efficiency``'s row."""
    profile_dir: str = ""
    """Where the trial's latest profiler traces are, relative to its trial dir (``profile/steps-3-4``; metrics.json ``profile``)."""


@dataclass(frozen=True)
class SweepData:
    """A sweep's rows and every scalar of every trial (trial number -> tag -> points)."""

    record: SweepRecord
    rows: list[TrialRow]
    scalars: dict[int, dict[str, ScalarSeries]] = field(default_factory=dict)
    slurm_error: str | None = None
    """Why Slurm states are missing (accounting unreachable), if they are."""
    usage: Usage | None = None
    """What every run of every trial has spent (None when accounting did not answer)."""


def mean_tokens_per_s(window_rates: Sequence[float]) -> float | None:
    """The trial's mean throughput from its ``perf/tokens_per_s`` points; None without any.

    Each point is the rate of one window of ``trainer.log_every`` steps, and every full window
    holds the same number of tokens, so total tokens over total time is the harmonic mean of the
    rates (the arithmetic mean would let a fast window count as much as a slow one that took
    longer). The first window after a start or resume and the last one may be shorter; they count
    as full ones. Points from every attempt of a resumed trial are in its events, so the mean
    covers the whole run.
    """
    rates = [rate for rate in window_rates if rate > 0 and math.isfinite(rate)]
    # Not statistics.harmonic_mean: its exact sum of fractions is 10x slower, for at most one ulp.
    return len(rates) / math.fsum(1.0 / rate for rate in rates) if rates else None


def trial_status(metrics_status: str | None, job: JobState | None, on_slurm: bool) -> str:
    """The one status of a trial, from metrics.json and the Slurm state of its task.

    A trial the trainer finished keeps its status, and so does one that the budget stopped or
    skipped once its task has ended (its exit code says nothing more). One that someone cancelled (Slurm's
    ``CANCELLED by UID``, or metrics.json's ``cancelled`` for a local trial) is ``cancelled``: a
    person ended it, nothing failed. A task Slurm ended badly otherwise is ``failed``. A trial that
    stopped after a checkpoint is ``stopped`` once nothing requeues it; while Slurm has it queued or
    running, Slurm's state says where it is. A task Slurm ended while metrics.json is missing or
    says running never reported its end: ``failed`` too.
    """
    if metrics_status in FINISHED_STATUSES:
        return metrics_status
    if metrics_status in ("stopped", "skipped_budget") and (job is None or not job.active):
        return metrics_status
    if (job is not None and job.cancelled) or metrics_status == "cancelled":
        return "cancelled"
    if (job is not None and job.failed) or metrics_status == "failed":
        return "failed"
    if metrics_status == "running" and (job is None or job.state == "RUNNING"):
        return "running"
    if job is not None and job.active:
        return "running" if job.state in ("RUNNING", "COMPLETING") else "pending"
    if metrics_status == "stopped":
        return "stopped"
    if job is not None:
        return "failed"
    return "pending" if on_slurm or metrics_status is None else metrics_status


PACKED_WAIT_REASON = "runs after the trials before it in its array task (trials_per_task)"


def packed_trial_job(job: JobState | None, metrics_status: str | None) -> JobState | None:
    """The Slurm state of a trial that shares its array task with others (``trials_per_task``).

    The task's state is that of the trial it runs: while the task runs, one not started yet (no
    ``metrics.json``) waits for those before it. The task's GPU-hours are shared between its trials
    (``hpcsweep.results.gpu_hours``), so the state carries none of them.
    """
    if job is None:
        return None
    if metrics_status is None and job.active and not job.queued:
        return replace(job, state="PENDING", reason=PACKED_WAIT_REASON, never_starts="", gpus=None)
    return replace(job, gpus=None)


def recorded_seconds(metrics: Mapping[str, Any]) -> float | None:
    """The wall time metrics.json spans, ``started_at`` to ``updated_at`` (the trial's latest run), in seconds;
    None when either is missing."""
    start, end = metrics.get("started_at"), metrics.get("updated_at")
    if not start or not end:
        return None
    return (dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds()


def own_gpu_hours(metrics: Mapping[str, Any]) -> float | None:
    """The trial's own compute share: the wall time metrics.json spans (its latest run) x the world size, in hours."""
    seconds = recorded_seconds(metrics)
    world_size = metrics.get("world_size")
    if seconds is None or world_size is None:
        return None
    return seconds * world_size / 3600.0


def _last(series: ScalarSeries | None) -> float | None:
    return series.values[-1] if series and series.values else None


def build_row(
    trial: TrialRecord,
    metrics: Mapping[str, Any] | None,
    job: JobState | None,
    scalars: Mapping[str, ScalarSeries],
    error_text: str,
    on_slurm: bool,
    allocated_hours: float | None = None,
    trained_config: Mapping[str, Any] | None = None,
    why_not_started: str = "",
) -> TrialRow:
    """One trial's row. Metrics missing from metrics.json come from the trial's scalars.

    ``allocated_hours``: the trial's part of its tasks' allocated GPU-hours (None: unknown);
    ``trained_config``: its ``config.yaml``, which values its label (``trained_values``);
    ``why_not_started``: for a cancelled trial whose run never started, why (``hpcsweep.results.never_started``).
    """
    metrics = metrics or {}
    values: dict[str, Any] = {name: metrics.get(name) for name in SCALAR_FALLBACKS}
    for name, tag in SCALAR_FALLBACKS.items():
        if values[name] is None:
            values[name] = _last(scalars.get(tag))
    best = metrics.get("best_val_loss")
    val_series = scalars.get("val/loss")
    if best is None and val_series and val_series.values:
        best = min(val_series.values)
    step = metrics.get("step")
    if step is None and scalars:
        step = max((s.steps[-1] for s in scalars.values() if s.steps), default=None)
    status = trial_status(metrics.get("status"), job, on_slurm)
    throughput = scalars.get("perf/tokens_per_s")
    mean_rate = mean_tokens_per_s(throughput.values if throughput else ())
    nodes = job.nodes if job is not None and job.nodes else ",".join(metrics.get("nodes") or [])
    waiting = job if status == "pending" and job is not None else None
    return TrialRow(
        num=trial.num,
        overrides=trained_values(override_values(trial.overrides), trained_config),
        status=status,
        job_id=trial.job_id,
        slurm_state=job.state if job is not None else None,
        step=step,
        max_steps=metrics.get("max_steps"),
        best_val_loss=best,
        mean_tokens_per_s=mean_rate,
        restarts=metrics.get("restarts"),
        gpu_hours=allocated_hours,
        own_gpu_hours=own_gpu_hours(metrics),
        world_size=metrics.get("world_size"),
        nodes=nodes,
        error=summarize_error(error_text) if status == "failed" else why_not_started,
        trial_dir=trial.trial_dir,
        reason=waiting.reason if waiting is not None else "",
        never_starts=waiting.never_starts if waiting is not None else "",
        attempt=len(trial.all_attempts()),
        last_stop_reason=metrics.get("last_stop_reason") or "",
        memory_plan_bytes=planned_bytes(metrics),
        memory_peak_bytes=(metrics.get("memory_peak") or {}).get("bytes"),
        efficiency=efficiency_of(metrics, mean_rate if mean_rate is not None else values["tokens_per_s"]),
        profile_dir=str(Path(traces[0]).parent) if (traces := (metrics.get("profile") or {}).get("traces")) else "",
        task_scores={key: metric_value(metrics, key) for key in task_score_keys(metrics)},
        **values,
    )


def planned_bytes(metrics: Mapping[str, Any]) -> int | None:
    """The memory plan's bytes per GPU that compare with the trial's measured peak: its tensors against
    CUDA's allocator peak, its total (interpreter included) against a CPU process's resident set."""
    plan, peak = metrics.get("memory_plan") or {}, metrics.get("memory_peak") or {}
    on_cuda = str(peak.get("source", "")).startswith("torch.cuda")
    return plan.get("tensors_bytes" if on_cuda else "total_bytes")


def memory_text(row: TrialRow) -> str:
    """``18.5/16.2``: the memory plan's GB per GPU against the measured peak's (``-`` for either unknown)."""
    if row.memory_plan_bytes is None and row.memory_peak_bytes is None:
        return "-"
    plan = "-" if row.memory_plan_bytes is None else f"{row.memory_plan_bytes / 2**30:.1f}"
    peak = "-" if row.memory_peak_bytes is None else f"{row.memory_peak_bytes / 2**30:.1f}"
    return f"{plan}/{peak}"


def row_metric(row: TrialRow, metric: str) -> float | None:
    """A row's value of ``metric``: a field (``best_val_loss``) or a task score (``tasks.NAME.METRIC``)."""
    if metric in row.task_scores:
        return row.task_scores[metric]
    value = getattr(row, metric, None) if metric in TrialRow.__dataclass_fields__ else None
    return value if isinstance(value, (int, float)) else None


def sort_keys(rows: Sequence[TrialRow]) -> list[str]:
    """Every key ``report --sort`` takes for these rows: the fields of ``METRICS``, ``val_accuracy``, the DPO rewards
    ``val_reward_accuracy`` and ``val_reward_margin`` where a row has them, and their task scores."""
    rewards = [key for key in REWARD_METRICS if any(getattr(row, key) is not None for row in rows)]
    return [*METRICS, "val_accuracy", *rewards, *sorted({k for row in rows for k in row.task_scores})]


def higher_is_better(metric: str) -> bool:
    """Whether the best value of ``metric`` is its largest: accuracies, task scores, throughput."""
    return metric in HIGHER_IS_BETTER or metric.startswith(f"{TASKS_KEY}.")


def sort_rows(rows: Sequence[TrialRow], metric: str, descending: bool = False) -> list[TrialRow]:
    """Rows by ``metric``: failed trials last, then trials without the metric, then by number."""

    def key(row: TrialRow) -> tuple:
        value = row_metric(row, metric)
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        ordered = 0.0 if missing else (-value if descending else value)
        return (row.status == "failed", missing, ordered, row.num)

    return sorted(rows, key=key)


def swept_keys(rows: Sequence[TrialRow]) -> list[str]:
    """Override keys whose values differ between trials (all keys when every trial agrees)."""
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row.overrides if k not in keys)
    varying = [k for k in keys if len({row.overrides.get(k) for row in rows}) > 1]
    return varying or keys


def single_trial_record(
    trial_dir: str, environment: Mapping[str, Any] | None, overrides: Sequence[str]
) -> SweepRecord:
    """A trial dir without sweep.json as a sweep of one trial (number 0).

    Its job is the one ``environment.json``'s ``slurm`` block names (``ARRAYID_TASK`` for an array
    task, the plain job id for ``sbatch slurm/train.sbatch``); without that block it ran locally.
    """
    environment = environment or {}
    slurm = environment.get("slurm") or {}
    job_id = slurm.get("job_label") or slurm.get("job_id")
    recorded_at = environment.get("recorded_at", "")
    trial = TrialRecord(0, list(overrides), trial_dir, job_id, recorded_at)
    return SweepRecord(
        sweep_dir=trial_dir,
        launcher="slurm" if job_id else "local",
        created_at=recorded_at,
        trials=[trial],
        arrays=[ArrayRecord(job_id, [0])] if job_id else [],
    )


def read_record(path: Path) -> SweepRecord:
    """``path/sweep.json``, or (no sweep.json) ``path`` read as a single trial dir."""
    if (path / SWEEP_FILE).exists():
        return read_sweep_record(path)
    environment_path, overrides_path = path / ENVIRONMENT_FILE, path / OVERRIDES_FILE
    environment = json.loads(environment_path.read_text()) if environment_path.exists() else None
    import yaml  # here: only a single trial dir needs it, and status must start fast

    overrides = yaml.safe_load(overrides_path.read_text()) if overrides_path.exists() else None
    # Absolute, so that resolve_trial_dir finds it whatever directory a report is made from.
    return single_trial_record(str(path.resolve()), environment, overrides or [])


def load_sweep(sweep_dir: str | Path, query: JobQuery = query_job_states, with_scalars: bool = True) -> SweepData:
    """Read a sweep (or a single trial dir), running or finished: its rows and all trials' scalars."""
    sweep_dir = Path(sweep_dir)
    record = read_record(sweep_dir)
    on_slurm = record.launcher == "slurm"
    jobs: Mapping[str, JobState] = {}
    slurm_error = None
    preparation = record.token_preparation
    if on_slurm:
        try:
            jobs = query(record.job_ids())
        except SlurmCommandError as err:
            slurm_error = str(err)
    trial_dirs = [resolve_trial_dir(sweep_dir, trial) for trial in record.trials]
    if with_scalars:
        from hpcsweep.results.event_reader import read_runs  # numpy and protobuf: not for status

        trial_scalars = read_runs([run_event_files(trial_dir) for trial_dir in trial_dirs])
    else:
        trial_scalars = [{} for _ in trial_dirs]
    tasks = Counter(trial.job_id for trial in record.trials if trial.job_id)
    read = []
    for trial, trial_dir in zip(record.trials, trial_dirs):
        metrics = read_metrics(TrialFiles(trial_dir).metrics)
        job = jobs.get(trial.job_id) if trial.job_id else None
        if trial.job_id and tasks[trial.job_id] > 1:
            job = packed_trial_job(job, (metrics or {}).get("status"))
        read.append((metrics, job))
    allocated = trial_allocated_hours(record, trial_dirs, [metrics for metrics, _ in read], jobs, slurm_error)
    preparation_state = None
    if preparation is not None and not slurm_error and any(
            trial_status((m or {}).get("status"), job, on_slurm) in NEVER_STARTED_STATUSES and never_started(m)
            for m, job in read):
        # Asked only when a trial never started: then the preparation job may be why.
        preparation_state = preparation_job_state(query, preparation.job_id)
    rows, all_scalars = [], {}
    for trial, trial_dir, scalars, (metrics, job) in zip(record.trials, trial_dirs, trial_scalars, read):
        provisional = trial_status((metrics or {}).get("status"), job, on_slurm)
        error = (
            trial_error_text(trial_dir, sweep_dir, trial.job_id, (metrics or {}).get("error"))
            if provisional == "failed"
            else ""
        )
        why_not = ""
        if provisional in NEVER_STARTED_STATUSES and never_started(metrics):
            why_not = never_started_line(
                metrics, preparation.job_id if preparation else None,
                preparation_state.state if preparation_state else None,
                last_line(Path(preparation.log)) if preparation and preparation_state and preparation_state.failed else None,
            )
        config = read_trained_config(trial_dir) if metrics and may_differ(record, trial, trial_dir) else None
        rows.append(build_row(trial, metrics, job, scalars, error, on_slurm, allocated.get(trial.num), config, why_not))
        all_scalars[trial.num] = scalars
    if not on_slurm:
        usage: Usage | None = usage_of_local_trials(trial_dirs)
    else:
        usage = None if slurm_error else usage_of_states(jobs)
    return SweepData(record=record, rows=rows, scalars=all_scalars, slurm_error=slurm_error, usage=usage)


def preparation_job_state(query: JobQuery, job_id: str) -> JobState | None:
    """The token preparation job's state (None when accounting does not answer or know it)."""
    try:
        return query([job_id]).get(job_id)
    except SlurmCommandError:
        return None


def trial_allocated_hours(
    record: SweepRecord,
    trial_dirs: Sequence[Path],
    metrics: Sequence[Mapping[str, Any] | None],
    jobs: Mapping[str, JobState],
    slurm_error: str | None,
) -> dict[int, float]:
    """Each trial's allocated GPU-hours: its part of its tasks' (sacct) or its ``usage.json`` (local).

    Empty when accounting did not answer: unknown, not zero.
    """
    if record.launcher != "slurm":
        return {trial.num: sum(run.hours for run in runs)
                for trial, trial_dir in zip(record.trials, trial_dirs) if (runs := read_runs(trial_dir / USAGE_FILE))}
    if slurm_error:
        return {}
    own = {trial.num: own_gpu_hours(m or {}) for trial, m in zip(record.trials, metrics)}
    trial_tasks = {trial.num: [a.job_id for a in trial.all_attempts() if a.job_id] for trial in record.trials}
    return allocated_hours_by_trial({task: state.used_hours for task, state in jobs.items()}, trial_tasks, own)


def may_differ(record: SweepRecord, trial: TrialRecord, trial_dir: Path) -> bool:
    """Whether a trial's recorded overrides may not be what it trained with, so its config.yaml must say.

    A single trial dir's ``.hydra/overrides.yaml`` is rewritten by every run in it, one that trains
    nothing included; a sweep's ``sweep.json`` keeps what was submitted, and only a run with
    ``resume.force=true`` trains under another config, which leaves ``config.before-*.yaml``
    beside it. Status reads no other config.yaml: a thousand of them would double its time.
    """
    return record.sweep_dir == trial.trial_dir or any(trial_dir.glob(CONFIG_BEFORE_GLOB))


def read_trained_config(trial_dir: Path) -> Mapping[str, Any] | None:
    """The trial's ``config.yaml`` (what it trained with), or None before it exists or when unreadable."""
    try:
        text = (trial_dir / CONFIG_FILE).read_text()
    except FileNotFoundError:
        return None
    import yaml  # here: only trials that started have a config.yaml

    try:
        # libyaml's loader where PyYAML has it: the pure-Python one takes 5 ms a config.
        config = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return None
    return config if isinstance(config, Mapping) else None
