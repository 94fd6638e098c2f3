"""Stop requests and requeues: Slurm's signals in, a checkpoint and a requeue out.

The signals, the stop request and the stop file live in ``hpcsweep.train.stop`` (every worker
needs them); this module holds what the trial decides once its workers have stopped.

How a stop flows:

1. Slurm signals the job: ``USR2`` ``signal_delay_s`` before the time limit (``--signal``; NCCL
   may catch USR1, so it is avoided), ``SIGTERM`` when the job is preempted, cancelled, or its
   node is taken down. A terminal's Ctrl-C sends ``SIGINT`` to the whole foreground process
   group (the command and every torchrun worker). ``stop_reason`` names which.
2. On each node the runner's handlers (which replace submitit's for the duration of the trial)
   record the reason and the time, set ``STOP_REQUESTED`` for an in-process trial, and write
   the node's *stop file*, which every worker's step hook checks: workers usually get Slurm's
   signals as well, but nothing here relies on that.
3. Workers finish the current step, agree on the stop across ranks, rank 0 saves a checkpoint,
   and all exit with ``EXIT_REQUEUE``.
4. Node 0's runner decides (``decide_after_stop``): requeue the job itself after a time-limit
   signal, leave the requeue to Slurm after a preemption (``PreemptMode=REQUEUE`` with
   ``--requeue``), or fail the trial once it has been requeued ``max_num_timeout`` times. The
   process then leaves with ``SystemExit`` (``TrialRequeued``) so that neither Hydra nor
   submitit records a result: the requeued job reruns the same pickle into the same trial dir.
   Outside Slurm, and after a Ctrl-C anywhere, nothing requeues: the trial is marked
   ``stopped`` and the process leaves with ``TrialStopped``; the command prints how to resume.
5. A second Ctrl-C while a stop is under way raises ``StopAborted``: leave now, without the
   checkpoint of this step (the older checkpoints stay).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Literal

from hpcsweep.train.stop import BUDGET, EXIT_INTERRUPTED, EXIT_REQUEUE, INTERRUPTED, PREEMPTED

log = logging.getLogger(__name__)


MAX_REQUEUES_VAR = "HPCSWEEP_MAX_REQUEUES"
"""Environment variable carrying the launcher's ``max_num_timeout`` into the trial."""


# ----- pure decisions ---------------------------------------------------------------------------


def max_requeues_from_env(env: Mapping[str, str]) -> int | None:
    """The requeue cap from ``HPCSWEEP_MAX_REQUEUES`` (None: no cap)."""
    raw = env.get(MAX_REQUEUES_VAR, "").strip()
    if not raw:
        return None
    cap = int(raw)
    if cap < 0:
        raise ValueError(f"{MAX_REQUEUES_VAR}={raw!r}: must be >= 0")
    return cap


def over_cap_error(requeues: int, cap: int | None) -> str | None:
    """The ``error`` of a trial that starts again after more requeues than its cap, else None."""
    if cap is None or requeues <= cap:
        return None
    return (
        f"requeued {requeues} times, more than max_num_timeout={cap} allows "
        "(hydra.launcher.max_num_timeout): not resuming"
    )


Outcome = Literal["completed", "stopped", "failed"]


def classify_exit(exit_codes: Iterable[int], status: str | None) -> Outcome:
    """What this node's training processes ended as, from their exit codes and metrics.json status.

    torchrun reports a worker's ``EXIT_REQUEUE`` as a failure and terminates the others (whose
    codes then are negative signal numbers), so a stop is "some process exited EXIT_REQUEUE, and
    metrics.json still says running".
    """
    codes = list(exit_codes)
    if status == "failed":
        return "failed"
    if codes and all(code == 0 for code in codes):
        return "completed"
    if EXIT_REQUEUE in codes and status == "running" and all(
        code in (0, EXIT_REQUEUE, EXIT_INTERRUPTED) or code < 0 for code in codes
    ):
        return "stopped"
    return "failed"


@dataclasses.dataclass(frozen=True)
class StopDecision:
    """What node 0 does after a stop: ``requeue`` (scontrol), ``slurm_requeues``, ``exit``, ``fail``."""

    action: Literal["requeue", "slurm_requeues", "exit", "fail"]
    message: str


def decide_after_stop(reason: str | None, requeues: int, cap: int | None, under_slurm: bool) -> StopDecision:
    """The pure requeue decision after a checkpointed stop.

    ``requeues`` counts the job's requeues so far (``SLURM_RESTART_COUNT``); the stop being
    handled would be one more. A SIGTERM means Slurm is already requeueing (preemption, node
    down), so requeueing again would count twice. A Ctrl-C is the user's stop, and a spent GPU-hour
    budget the sweep's: never requeued.
    """
    if reason == INTERRUPTED:
        return StopDecision("exit", "interrupted: checkpoint saved; run the same trial directory again to resume")
    if reason == BUDGET:
        return StopDecision("exit", "the sweep's GPU-hour budget is spent: checkpoint saved; retry the trial to resume")
    if not under_slurm:
        return StopDecision("exit", "checkpoint saved; run the same trial directory again to resume")
    if cap is not None and requeues >= cap:
        return StopDecision(
            "fail",
            f"stopped ({reason or 'unknown reason'}) after {requeues} requeue(s); max_num_timeout={cap} "
            "allows no more (hydra.launcher.max_num_timeout)",
        )
    if reason == PREEMPTED:
        return StopDecision("slurm_requeues", "preempted: Slurm requeues the job")
    return StopDecision("requeue", f"{reason or 'stop requested'}: requeueing the job")


# ----- stop requests ----------------------------------------------------------------------------


class TrialRequeued(SystemExit):
    """Leave the process after a checkpointed stop, without a result for Hydra or submitit.

    Hydra's ``run_job`` and submitit's ``process_job`` catch ``Exception`` only, so this passes
    through both: no result pickle says "completed" or "failed", and the requeued job reruns.
    """

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_REQUEUE)
        self.message = message

    def __str__(self) -> str:
        return self.message


class TrialStopped(SystemExit):
    """Leave the process after a checkpointed stop that nothing will restart by itself.

    Outside Slurm, or after a Ctrl-C: the trial is marked ``stopped`` at ``step`` and resumes when
    its trial dir runs again. Exits ``EXIT_INTERRUPTED`` after a Ctrl-C, else ``EXIT_REQUEUE``.
    """

    def __init__(self, reason: str | None, step: int | None, message: str) -> None:
        super().__init__(EXIT_INTERRUPTED if reason == INTERRUPTED else EXIT_REQUEUE)
        self.reason, self.step, self.message = reason, step, message

    def __str__(self) -> str:
        return self.message


class NodeFinished(SystemExit):
    """Leave a node other than node 0 after a checkpointed stop: exit 0, without a result.

    A non-zero exit would make srun's ``--kill-on-bad-exit`` end node 0, which records the stop
    and requeues the job.
    """

    def __init__(self, message: str) -> None:
        super().__init__(0)
        self.message = message

    def __str__(self) -> str:
        return self.message


def requeue_job(job_label: str) -> None:
    """``scontrol requeue`` the job (``ARRAYID_TASK`` for an array task); log, not raise, a refusal.

    Slurm refuses a job that is already pending or completing: then it is being requeued already.
    """
    from hpcsweep.slurm import commands

    try:
        commands.requeue(job_label)
        log.info("requeued job %s", job_label)
    except commands.SlurmCommandError as err:
        log.warning("requeue of job %s refused (already requeued?): %s", job_label, err)
