"""Stop requests and requeues: Slurm's signals in, a checkpoint and a requeue out.

The signals, the stop request and the stop file live in ``hpcsweep.control.stop`` (every worker
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
   and all exit with ``EXIT_STOPPED``.
4. Node 0's runner decides (``decide_after_stop``): requeue the job itself after a time-limit
   signal, leave the requeue to Slurm after a preemption (``PreemptMode=REQUEUE`` with
   ``--requeue``), or fail the trial once it has been requeued ``max_num_timeout`` times. The
   runner returns that as an ``Outcome`` (``requeue``); the edge (``hpcsweep.control.exit_codes``)
   requeues and ends the process without a result for Hydra or submitit, so the requeued job
   reruns the same pickle into the same trial dir. Outside Slurm, and after a Ctrl-C anywhere,
   nothing requeues: the trial is marked ``stopped`` and the command prints how to resume.
5. A second Ctrl-C while a stop is under way raises ``KeyboardInterrupt``: leave now, without the
   checkpoint of this step (the older checkpoints stay); the outcome is ``aborted``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Literal

from hpcsweep.control.exit_codes import EXIT_INTERRUPTED, EXIT_STOPPED
from hpcsweep.control.stop import BUDGET, INTERRUPTED, PREEMPTED

# ----- pure decisions ---------------------------------------------------------------------------


def over_cap_error(requeues: int, cap: int | None) -> str | None:
    """The ``error`` of a trial that starts again after more requeues than its cap, else None."""
    if cap is None or requeues <= cap:
        return None
    return (
        f"requeued {requeues} times, more than max_num_timeout={cap} allows "
        "(hydra.launcher.max_num_timeout): not resuming"
    )


ExitClass = Literal["completed", "stopped", "failed"]


def classify_exit(exit_codes: Iterable[int], status: str | None) -> ExitClass:
    """What this node's training processes ended as, from their exit codes and metrics.json status.

    torchrun reports a worker's ``EXIT_STOPPED`` as a failure and terminates the others (whose
    codes then are negative signal numbers), so a stop is "some process exited EXIT_STOPPED, and
    metrics.json still says running", or already says ``stopped``: in a multi-node trial node 0 may
    have recorded a stop that nothing requeues (a spent budget) before another node settles.
    """
    codes = list(exit_codes)
    if status == "failed":
        return "failed"
    if codes and all(code == 0 for code in codes):
        return "completed"
    if EXIT_STOPPED in codes and status in ("running", "stopped") and all(
        code in (0, EXIT_STOPPED, EXIT_INTERRUPTED) or code < 0 for code in codes
    ):
        return "stopped"
    return "failed"


@dataclasses.dataclass(frozen=True)
class StopDecision:
    """What node 0 does after a stop: ``requeue`` (scontrol), ``slurm_requeues``, ``exit``, ``fail``."""

    action: Literal["requeue", "slurm_requeues", "exit", "fail"]
    message: str


RESUME_LINE = ("to resume, run the same command again with hydra.sweep.dir=SWEEP_DIR (one trial: hydra.run.dir=ITS_DIR), "
               "as the sweep's last line and status say; without it a new sweep starts from step 0")
"""What a stopped trial's log says of resuming it: the words the sweep and ``status`` use."""


def decide_after_stop(reason: str | None, requeues: int, cap: int | None, under_slurm: bool) -> StopDecision:
    """The pure requeue decision after a checkpointed stop.

    ``requeues`` counts the job's requeues so far (``SLURM_RESTART_COUNT``); the stop being
    handled would be one more. A SIGTERM means Slurm is already requeueing (preemption, node
    down), so requeueing again would count twice. A Ctrl-C is the user's stop, and a spent GPU-hour
    budget the sweep's: never requeued.
    """
    if reason == INTERRUPTED:
        return StopDecision("exit", f"interrupted: checkpoint saved; {RESUME_LINE}")
    if reason == BUDGET:
        return StopDecision("exit", "the sweep's GPU-hour budget is spent: checkpoint saved; retry the trial to resume")
    if not under_slurm:
        return StopDecision("exit", f"checkpoint saved; {RESUME_LINE}")
    if cap is not None and requeues >= cap:
        return StopDecision(
            "fail",
            f"stopped ({reason or 'unknown reason'}) after {requeues} requeue(s); max_num_timeout={cap} "
            "allows no more (hydra.launcher.max_num_timeout)",
        )
    if reason == PREEMPTED:
        return StopDecision("slurm_requeues", "preempted: Slurm requeues the job")
    return StopDecision("requeue", f"{reason or 'stop requested'}: requeueing the job")
