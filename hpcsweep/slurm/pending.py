"""Pure reading of why a job pends (``squeue``'s ``%r``), and whether waiting can ever start it.

Most reasons clear on their own (``Priority``, ``Resources``, ``JobArrayTaskLimit``, ``BeginTime``,
``Dependency``, ``QOSMaxJobsPerUserLimit`` ...): other jobs end and the job starts. The reasons in
``NEVER_CLEARS`` say the job asks for something the cluster's configuration or the account's
limits will never give; such a job pends until someone cancels it or an administrator changes
the configuration. ``ReqNodeNotAvail`` is one of them only while the nodes it needs are down or
drained, which only ``scontrol show nodes`` can tell.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpcsweep.slurm.env import expand_nodelist
from hpcsweep.slurm.nodes import NodeState

REQ_NODE_NOT_AVAIL = "ReqNodeNotAvail"
_UNAVAILABLE_NODES = "UnavailableNodes:"

NEVER_CLEARS: Mapping[str, str] = {
    "PartitionConfig": (
        "its partition cannot give what the job asks for (more nodes, GPUs, CPUs or memory per node than it has)"
    ),
    "PartitionNodeLimit": "the job's node count is outside the partition's MinNodes/MaxNodes",
    "PartitionTimeLimit": "the job's time limit is longer than the partition's MaxTime",
    "QOSMaxWallDurationPerJobLimit": "the job's time limit is longer than its QOS's MaxWall",
    "QOSMaxNodePerJobLimit": "the job asks for more nodes than its QOS allows one job",
    "QOSMaxGRESPerJob": "the job asks for more GPUs (GRES) than its QOS allows one job",
    "AssocMaxWallDurationPerJobLimit": "the job's time limit is longer than its account association's MaxWall",
    "InvalidAccount": "the job's account does not exist or the user is not in it",
    "InvalidQOS": "the job's QOS does not exist or its account may not use it",
    "BadConstraints": "no node has the requested features (--constraint) together with the requested resources",
    "DependencyNeverSatisfied": "a job it depends on ended in a way the dependency excludes (afterok on a failed job)",
}
"""Reasons that never clear by waiting, each with why: the request itself exceeds a limit that no
job ending, no node freeing up and no time passing changes. Slurm keeps such jobs queued (rather
than rejecting them at submission) unless ``EnforcePartLimits`` or ``DenyOnLimit`` is set."""

_PER_JOB_LIMIT = re.compile(r"^(?:QOS|Assoc)Max\w+PerJob(?:Limit)?$")
# Every per-job maximum of a QOS or association (QOSMaxCpuPerJobLimit, AssocMaxGRESPerJob, ...) is
# a property of the job's own request, unlike per-user or group limits (QOSMaxJobsPerUserLimit,
# AssocGrpGRES) that clear when the user's other jobs end.
_PER_JOB_LIMIT_WHY = "the job asks for more than its QOS or account allows one job"


@dataclass(frozen=True)
class PendingReason:
    """One ``%r`` text, split: ``ReqNodeNotAvail, UnavailableNodes:node[3-4]``."""

    code: str
    """The reason's name: ``Priority``, ``PartitionConfig``, ``ReqNodeNotAvail`` ..."""
    detail: str = ""
    """What follows the code: ``UnavailableNodes:node[3-4]``, ``Reserved for maintenance``."""
    unavailable_nodes: tuple[str, ...] = ()
    """The hosts ``UnavailableNodes:`` names, expanded."""


def parse_reason(text: str) -> PendingReason:
    """``squeue --format=%r`` text of one job -> its code, detail and unavailable nodes.

    ``squeue`` prints the job's state description when it has one, so a reason can carry detail
    after a comma: ``ReqNodeNotAvail, UnavailableNodes:node3`` or
    ``ReqNodeNotAvail, May be reserved for other job``.
    """
    code, _, detail = text.strip().strip("()").partition(",")
    detail = detail.strip()
    nodes: tuple[str, ...] = ()
    if detail.startswith(_UNAVAILABLE_NODES):
        try:
            nodes = tuple(expand_nodelist(detail[len(_UNAVAILABLE_NODES) :]))
        except ValueError:
            # A list squeue cut short names no nodes we can check: the reason then counts as
            # one that may clear, never as a false alarm.
            nodes = ()
    return PendingReason(code=code.strip(), detail=detail, unavailable_nodes=nodes)


def needs_node_states(reason: PendingReason) -> bool:
    """Whether deciding ``never_clears`` for this reason needs the state of its nodes."""
    return reason.code == REQ_NODE_NOT_AVAIL and bool(reason.unavailable_nodes)


def is_down_or_drained(node: NodeState) -> bool:
    """DOWN (``DOWN``, ``DOWN*``) or drained/draining: Slurm starts nothing there until an admin resumes it."""
    return node.state == "DOWN" or bool(node.flags & {"DRAIN", "DRAINED", "DRAINING", "FAIL"})


def never_clears(reason: PendingReason, nodes: Mapping[str, NodeState] | None = None) -> str | None:
    """Why a job pending for ``reason`` will never start by waiting, or None when it may start.

    ``nodes`` (node name -> state, from ``scontrol show nodes``) matters only for
    ``ReqNodeNotAvail, UnavailableNodes:...``: Slurm gives that reason when the job could run
    only on nodes that are not available now. If every one of them is DOWN or DRAINED, only an
    administrator's ``scontrol update State=RESUME`` can start the job; if any is merely
    rebooting, powering up or reserved, or its state is unknown, the job may still start.
    """
    if reason.code in NEVER_CLEARS:
        return NEVER_CLEARS[reason.code]
    if _PER_JOB_LIMIT.match(reason.code):
        return _PER_JOB_LIMIT_WHY
    if needs_node_states(reason) and nodes is not None:
        known = [nodes.get(name) for name in reason.unavailable_nodes]
        if all(node is not None and is_down_or_drained(node) for node in known):
            names = ",".join(reason.unavailable_nodes)
            return f"the nodes it needs ({names}) are DOWN or DRAINED; it starts only after an admin resumes them"
    return None
