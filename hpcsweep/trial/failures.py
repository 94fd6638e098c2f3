"""What a trial does once its workers failed: record the failure, then retry it elsewhere or fail.

Every node whose workers failed writes what it saw (``workers/nodeN/failure.json``), waits a few
seconds for the other nodes' reports, and picks the root cause (``failure_class.root_cause``): one
crash breaks every rank's collectives, and only the rank that crashed explains the others. The
first node to claim the attempt's decision file acts for the trial: it appends the failure (class,
node, rank, traceback) to metrics.json and decides: for an infrastructure failure under Slurm, while
``hydra.launcher.max_retries`` allows, a ``retry`` outcome that names the job and the failed node, which the
edge (``hpcsweep.control.exit_codes``) requeues and excludes; else ``failed``. The other nodes follow the
decision: on a retry they leave with 0 (``node_done``), so that srun's ``--kill-on-bad-exit`` cannot end the
deciding node before it has requeued the job; on a failure with a non-zero code, which ends whatever still runs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from hpcsweep.control.outcome import Outcome
from hpcsweep.files.atomic import atomic_write_json
from hpcsweep.files.metrics_file import new_report, read_metrics, write_metrics
from hpcsweep.files.sweep_record import now_iso
from hpcsweep.files.trial_files import METRICS_FILE, TrialFiles
from hpcsweep.files.wait import wait_for
from hpcsweep.slurm.env import SlurmJobEnv
from hpcsweep.trial.failure_class import (
    COMMUNICATION,
    Failure,
    classify_exit_code,
    classify_slurm_state,
    root_cause,
    signal_name,
)

log = logging.getLogger(__name__)


# How long a failed node waits for the other nodes' reports before choosing the root cause, and
# how long the nodes that did not claim the decision wait for it to be carried out.
REPORT_WAIT_S = 5.0
SYMPTOM_WAIT_S = 30.0
"""How long, in all, a node that saw only broken collectives waits for the other nodes: a communication
failure is what the other ranks see when one of them died, and the node whose worker died reports
later (its agent first stops its other workers)."""
DECISION_WAIT_S = 30.0
TRACEBACK_LINES = 60


@dataclasses.dataclass(frozen=True)
class WorkerExit:
    """One failed worker of this node as its agent reported it."""

    rank: int
    local_rank: int
    exit_code: int
    message: str
    at: float


# ----- pure decisions ---------------------------------------------------------------------------


def tail(text: str, lines: int = TRACEBACK_LINES) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.strip().splitlines()[-lines:])


def worker_failure(exit: WorkerExit, node: str, error_text: str) -> Failure:
    """The failure of one worker from its exit code and the error it left (traceback or stacks)."""
    text = tail(error_text or exit.message)
    return Failure(classify_exit_code(exit.exit_code, text), node, exit.rank, exit.exit_code, text, exit.at)


def retries_so_far(metrics: Mapping[str, Any]) -> int:
    """How many failures of this trial were retried already."""
    return sum(1 for failure in metrics.get("failures") or () if failure.get("retried"))


@dataclasses.dataclass(frozen=True)
class FailureDecision:
    """``retry`` (requeue the job off the failed node) or ``fail``, with the line that says why."""

    action: Literal["retry", "fail"]
    message: str


def decide_after_failure(cause: Failure, retries: int, max_retries: int, under_slurm: bool) -> FailureDecision:
    """The pure retry decision for a trial whose root cause of failure is ``cause``."""
    what = cause.summary()
    if not cause.retried:
        return FailureDecision("fail", f"{what}: the trial's own code or config failed, not retried")
    if not under_slurm:
        return FailureDecision("fail", f"{what}: an infrastructure failure, retried only under Slurm")
    if retries >= max_retries:
        return FailureDecision(
            "fail", f"{what}: retried {retries} time(s) already, max_retries={max_retries} (hydra.launcher.max_retries)"
        )
    return FailureDecision("retry", f"{what}: retry {retries + 1} of {max_retries}, excluding {cause.node}")


def failure_record(
    cause: Failure, others: Sequence[Failure], decision: FailureDecision, job: SlurmJobEnv | None
) -> dict[str, Any]:
    """The metrics.json entry of one failed run of the trial."""
    return {
        "class": cause.kind,
        "node": cause.node,
        "rank": cause.rank,
        "exit_code": cause.exit_code,
        "signal": None if cause.exit_code is None else signal_name(cause.exit_code),
        "traceback": cause.traceback,
        "retried": decision.action == "retry",
        "message": decision.message,
        "job_id": None if job is None else job.job_label,
        "slurm_restart_count": None if job is None else job.restart_count,
        "at": now_iso(),
        "also": [other.summary() for other in others if other is not cause],
    }


SACCT_RUN_FIELDS = ("State", "NodeList")


def slurm_ended_run(sacct_text: str, restart_count: int) -> Failure | None:
    """The failure Slurm itself saw in the run before this one (``NODE_FAIL``, ``OUT_OF_MEMORY``), if any.

    ``sacct_text`` is ``sacct --duplicates`` of this job with ``SACCT_RUN_FIELDS``, oldest run
    first; Slurm requeues such a run itself (``--requeue``), and no runner lived to record it.
    """
    runs = [line.split("|") for line in sacct_text.splitlines() if line.count("|") == 1]
    if restart_count < 1 or len(runs) < restart_count:
        return None
    state, nodelist = runs[restart_count - 1]
    kind = classify_slurm_state(state)
    if kind is None:
        return None
    return Failure(kind, nodelist, None, None, f"Slurm ended run {restart_count - 1} on {nodelist}: {state}", 0.0)


def record_slurm_failure(trial_dir: Path, job: SlurmJobEnv) -> None:
    """On a requeued job's start, add the last run's ``NODE_FAIL`` or ``OUT_OF_MEMORY`` to metrics.json."""
    from hpcsweep.slurm import commands

    metrics = read_metrics(trial_dir / METRICS_FILE)
    if not metrics or job.restart_count < 1:
        return
    earlier = job.restart_count - 1
    if any(f.get("job_id") == job.job_label and f.get("slurm_restart_count") == earlier
           for f in metrics.get("failures") or ()):
        return
    try:
        cause = slurm_ended_run(commands.sacct([job.job_label], SACCT_RUN_FIELDS), job.restart_count)
    except commands.SlurmCommandError as err:
        log.warning("cannot tell how run %d of job %s ended: %s", earlier, job.job_label, err)
        return
    if cause is None:
        return
    decision = FailureDecision("retry", f"{cause.summary()}: requeued by Slurm (--requeue)")
    record = {**failure_record(cause, [], decision, job), "slurm_restart_count": earlier}
    write_metrics(trial_dir / METRICS_FILE, {**metrics, "failures": [*(metrics.get("failures") or []), record]})


# ----- one failed run ---------------------------------------------------------------------------


def _failure_from_dict(raw: Mapping[str, Any]) -> Failure:
    return Failure(raw["kind"], raw["node"], raw["rank"], raw["exit_code"], raw["traceback"], raw["at"])


def read_reports(workers_dir: Path) -> list[Failure]:
    """Every node's reported failures of this run."""
    found = []
    for path in sorted(workers_dir.glob("node*/failure.json")):
        try:
            found.extend(_failure_from_dict(raw) for raw in json.loads(path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            continue
    return found


def _claim(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def settle_failure(
    trial_dir: Path,
    failures: Sequence[Failure],
    *,
    node_rank: int,
    nnodes: int,
    attempt: str,
    job: SlurmJobEnv | None,
    max_retries: int,
    report_defaults: Mapping[str, Any],
) -> Outcome:
    """Report this node's failures, agree on the root cause, decide once for the trial; this node's outcome.

    ``attempt`` names this run (job and restart count); ``report_defaults`` are metrics.json's
    fields for a trial that failed before it reported anything. The deciding node's ``retry`` names the
    job to requeue and the node to exclude; its ``failed`` message is the trial's error, traceback
    included. A node that follows another's decision returns ``node_done`` for a retry, else ``failed``.
    """
    files = TrialFiles(trial_dir)
    workers_dir = files.workers_dir
    atomic_write_json(
        files.worker_dir(node_rank) / "failure.json",
        [dataclasses.asdict(f) for f in failures],
    )
    def everyone_reported() -> bool | None:
        return len(list(workers_dir.glob("node*/failure.json"))) >= nnodes or None

    wait_for(everyone_reported, REPORT_WAIT_S)
    if root_cause(read_reports(workers_dir) or failures).kind == COMMUNICATION:
        wait_for(everyone_reported, SYMPTOM_WAIT_S - REPORT_WAIT_S)
    reports = read_reports(workers_dir)
    cause = root_cause(reports or failures)
    decided = workers_dir / f"decision-{attempt}.json"
    if not _claim(workers_dir / f"claim-{attempt}"):
        wait_for(lambda: decided.exists() or None, DECISION_WAIT_S)
        action = json.loads(decided.read_text())["action"] if decided.exists() else "fail"
        followed = "node_done" if action == "retry" else "failed"
        return Outcome(followed, f"{cause.summary()}: handled by another node of the trial",
                       read_metrics(trial_dir / METRICS_FILE) or {})
    metrics = read_metrics(trial_dir / METRICS_FILE) or new_report(**report_defaults)
    decision = decide_after_failure(cause, retries_so_far(metrics), max_retries, under_slurm=job is not None)
    record = failure_record(cause, reports, decision, job)
    # Lines, as the workers write a traceback into metrics.json's ``error``.
    error = [decision.message, *cause.traceback.splitlines()]
    log.error("trial %s: %s", trial_dir, "\n".join(error))
    metrics = {**metrics, "status": "failed", "error": error, "failures": [*(metrics.get("failures") or []), record]}
    write_metrics(trial_dir / METRICS_FILE, metrics)
    atomic_write_json(decided, {"action": decision.action, "message": decision.message})
    if decision.action == "retry" and job is not None:
        return Outcome("retry", decision.message, metrics, requeue_job=job.job_label, exclude_nodes=(cause.node,))
    return Outcome("failed", "\n".join(error), metrics)
