"""How one trial's attempt on one node ended: a value returned up the stack, never an exception.

The runner's phases return an ``Outcome``; only the edges (``hpcsweep.control.exit_codes``) turn it
into an exit code or a requeue.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from hpcsweep.control.stop import BUDGET

OutcomeKind = Literal["completed", "skipped", "pruned", "stopped", "requeue", "retry", "failed", "node_done", "aborted"]
"""``completed``: trained to its last step. ``skipped``: not trained in this attempt (it had ended before, or
the sweep's budget is spent). ``pruned``: the search stopped it early. ``stopped``: a checkpointed stop that
nothing restarts by itself. ``requeue``: a checkpointed stop whose job runs again. ``retry``: an infrastructure
failure whose job runs again on other nodes. ``failed``: the trial failed. ``node_done``: a node whose share of
a stop or a retry is done while another node of the trial records it and requeues the job (node 0 for a stop,
the node that settled the failure for a retry). ``aborted``: a second Ctrl-C while stopping: left without the
checkpoint of this step."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How an attempt ended on this node, the line that says why, and what the edge still has to do.

    ``requeue_job`` is the Slurm job (``ARRAYID_TASK``) the edge requeues with ``scontrol requeue``; None
    when Slurm requeues it itself (a preemption) or nothing is to be requeued. ``exclude_nodes`` are the nodes
    the requeued job must not run on again (a retry's failed node), added to its ``ExcNodeList``.
    ``reason`` is the stop's (``hpcsweep.control.stop``), ``step`` the step the trial stopped at, ``metrics``
    its ``metrics.json``.
    """

    kind: OutcomeKind
    message: str = ""
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    reason: str | None = None
    step: int | None = None
    requeue_job: str | None = None
    exclude_nodes: tuple[str, ...] = ()


def leaving_outcome(job_return: Any) -> Outcome | None:
    """The ``Outcome`` a Hydra job returned when it ends the task (``ends_the_task``), else None.

    Such a trial has not ended: a search's slot is not told about it, so its study trial stays RUNNING
    for the requeued or resumed task to take up again.
    """
    from hydra.core.utils import JobStatus

    if job_return.status != JobStatus.COMPLETED:
        return None
    returned = job_return.return_value
    return returned if isinstance(returned, Outcome) and ends_the_task(returned) else None


def ends_the_task(outcome: Outcome) -> bool:
    """Whether the process leaves after this trial (no further trial of its task runs).

    A requeue, retry or stop ends the task, so the requeued job reruns it; a budget stop does not: the
    trial is checkpointed and the sweep goes on, skipping the trials the spent budget no longer allows.
    """
    if outcome.kind == "stopped":
        return outcome.reason != BUDGET
    return outcome.kind in ("requeue", "retry", "node_done", "aborted")
