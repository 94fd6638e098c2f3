"""The settle phase: once this node's training processes have exited, what the attempt ended as.

Classify the exits (``preempt.classify_exit``), then record a stop and decide on its requeue, or report a
failure and agree with the other nodes on its retry (``failures.settle_failure``). Every end is an
``Outcome``; the edge (``hpcsweep.control.exit_codes``) carries out its exit code and its requeue (off the
failed node, for a retry).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hpcsweep.control import stop
from hpcsweep.control.outcome import Outcome
from hpcsweep.files.metrics_file import write_metrics
from hpcsweep.train.observe import worker_records
from hpcsweep.trial import failures, preempt
from hpcsweep.trial.attempt import TrialAttempt
from hpcsweep.trial.failure_class import Failure
from hpcsweep.trial.launch import ProcessesResult
from hpcsweep.trial.records import read_metrics

log = logging.getLogger(__name__)


def fail_trial(attempt: TrialAttempt, metrics: dict[str, Any], error: str) -> Outcome:
    """Mark the trial failed in metrics.json with ``error``; its ``failed`` outcome. Node 0 calls it."""
    failed = {**metrics, "status": "failed", "error": error}
    write_metrics(attempt.files.metrics, failed)
    return Outcome("failed", error, failed)


def after_stop(attempt: TrialAttempt, signalled: stop.StopRequest) -> Outcome:
    """Finish a checkpointed stop: record it, and say whether the job is requeued, left to Slurm, or failed.

    Only node 0 writes; the edge carries out the ``requeue`` outcome's ``scontrol requeue``. A trial
    nothing will requeue is marked ``stopped``.
    """
    metrics = read_metrics(attempt.files)
    reason = signalled.reason or metrics.get("last_stop_reason")
    took = None if signalled.requested_at is None else round(time.monotonic() - signalled.requested_at, 3)
    decision = preempt.decide_after_stop(reason, attempt.requeues, attempt.caps.max_requeues,
                                         under_slurm=attempt.under_slurm)
    log.info("stop (%s): checkpoint saved and workers gone %s s after the signal; %s",
             reason, took, decision.message)
    step = metrics.get("step")
    if not attempt.records_for_the_trial:
        return Outcome("node_done", decision.message, metrics, reason, step)
    metrics.update(last_stop_reason=reason, stop_to_exit_s=took)
    if decision.action == "fail":
        return fail_trial(attempt, metrics, decision.message)
    if decision.action == "exit":
        metrics["status"] = "stopped"
    write_metrics(attempt.files.metrics, metrics)
    if decision.action == "exit":
        return Outcome("stopped", decision.message, metrics, reason, step)
    requeue = attempt.job.job_label if decision.action == "requeue" and attempt.job is not None else None
    return Outcome("requeue", decision.message, metrics, reason, step, requeue_job=requeue)


def record_abort(attempt: TrialAttempt) -> Outcome:
    """After a second Ctrl-C: mark the trial ``stopped`` (node 0), since no worker will say so."""
    metrics = read_metrics(attempt.files)
    if attempt.records_for_the_trial and metrics.get("status") == "running":
        metrics = {**metrics, "status": "stopped", "last_stop_reason": "aborted"}
        write_metrics(attempt.files.metrics, metrics)
    return Outcome("aborted", "interrupted again while stopping: left without a checkpoint of this step",
                   metrics, stop.INTERRUPTED, metrics.get("step"))


def node_failures(result: ProcessesResult, attempt: TrialAttempt, metrics: dict[str, Any]) -> list[Failure]:
    """This node's failures: the hang, else each failed worker with the traceback or stacks it left."""
    if result.hang is not None:
        return [result.hang]
    worker_error = metrics.get("error")
    if isinstance(worker_error, list):  # rank 0's traceback lines
        worker_error = "\n".join(worker_error)
    reported = result.error or "training reported status failed"
    exits = result.exits or (failures.WorkerExit(0, 0, 1, reported, time.time()),)
    found = []
    for exit in exits:
        left = [
            path.read_text(errors="replace")
            for path in (worker_records.error_path(attempt.worker_dir, exit.local_rank),
                         worker_records.stacks_path(attempt.worker_dir, exit.local_rank))
            if path.exists() and path.stat().st_size
        ]
        text = left[0] if left else (worker_error if exit.rank == 0 and worker_error else exit.message)
        found.append(failures.worker_failure(exit, attempt.node, text))
    return found


def after_failure(attempt: TrialAttempt, result: ProcessesResult, metrics: dict[str, Any]) -> Outcome:
    """Report this node's failures, agree with the other nodes on the root cause; ``retry`` (its job and the node
    to exclude, for the edge), ``failed``, or ``node_done`` where another node requeues the retry."""
    if result.error:  # torchrun's summary: which ranks failed, how, and when
        log.error("trial %s failed:\n%s", attempt.files.root, result.error)
    rdzv = attempt.rdzv
    return failures.settle_failure(
        attempt.files.root, node_failures(result, attempt, metrics), node_rank=rdzv.node_rank, nnodes=rdzv.nnodes,
        attempt=attempt.label, job=attempt.job, max_retries=attempt.caps.max_retries,
        report_defaults={"max_steps": attempt.trial.trainer.max_steps, "world_size": rdzv.world_size,
                         "restarts": metrics.get("restarts", 0), "env": attempt.env},
    )


def ended(metrics: dict[str, Any]) -> Outcome:
    """The outcome of a trial whose workers exited 0: ``pruned`` when the search stopped it, else ``completed``."""
    return Outcome("pruned" if metrics.get("status") == "pruned" else "completed", str(metrics.get("status")), metrics)


def settle(attempt: TrialAttempt, result: ProcessesResult, signalled: stop.StopRequest) -> Outcome:
    """What the attempt ended as on this node, once its processes have exited."""
    metrics = read_metrics(attempt.files)
    exit_class = "failed" if result.hang else preempt.classify_exit(result.exit_codes, metrics.get("status"))
    if exit_class == "stopped":
        return after_stop(attempt, signalled)
    if exit_class == "failed":
        return after_failure(attempt, result, metrics)
    return ended(metrics)
