"""The Slurm state of a sweep's array tasks: one ``sacct`` call for every array of the sweep.

Parsing is pure (``parse_sacct``, ``parse_squeue`` take the command's text, ``with_reasons`` and
``with_verdicts`` combine them); ``query_job_states`` is the one side effect. ``squeue`` is asked
when accounting does not answer, or when a task is queued: its ``%r`` is the live reason a task
waits (sacct's ``Reason`` is the last reason other than Priority/Resources that reached the
database, without the ``UnavailableNodes`` detail). ``scontrol show nodes`` is asked only when a
task waits for nodes that are not available (``ReqNodeNotAvail, UnavailableNodes:...``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from hpcsweep.slurm.cluster_info import gpus_from_tres
from hpcsweep.slurm.commands import SlurmCommandError, sacct, show_nodes, squeue
from hpcsweep.slurm.nodes import NodeState, parse_node_states
from hpcsweep.slurm.pending import needs_node_states, never_clears, parse_reason
from hpcsweep.slurm.usage import run_hours, units_from_tres

SACCT_FIELDS = ("JobID", "State", "ElapsedRaw", "AllocTRES", "NodeList")
SQUEUE_FORMAT = "%i|%T|%N|%r"
FAILED_STATES = frozenset(
    {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED", "BOOT_FAIL", "DEADLINE"}
)
"""End states that mean a trial did not finish (a cancel included: ``cancelled`` tells it apart)."""
ACTIVE_STATES = frozenset(
    {
        "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
        "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "PREEMPTED",
    }
)
"""States after which more happens (a preempted task of a requeueing partition comes back)."""
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
"""States of a task waiting in the queue: the ones with a pending reason."""
_ARRAY_RANGE = re.compile(r"^(?P<array>\d+)_\[(?P<ranges>[^\]]+)\]$")


@dataclass(frozen=True)
class JobState:
    """One array task (``ARRAYID_TASK``) as Slurm reports it."""

    job_id: str
    state: str
    elapsed_s: int | None = None
    """Seconds the allocation ran (``ElapsedRaw``); None from squeue."""
    gpus: int | None = None
    """GPUs allocated (``gres/gpu`` of ``AllocTRES``); None when unknown."""
    nodes: str = ""
    """The nodelist expression, empty while pending."""
    reason: str = ""
    """Why a queued task waits (``squeue``'s ``%r``: ``Priority``, ``ReqNodeNotAvail, ...``)."""
    never_starts: str = ""
    """Why waiting will never start it (``hpcsweep.slurm.pending.never_clears``); '' when it may start."""
    used_hours: float = 0.0
    """GPU-hours (node-hours without GPUs) of every run of the task (``hpcsweep.slurm.usage``)."""
    units: int = 0
    """GPUs (nodes without GPUs) the latest run holds: what an hour of it costs."""

    @property
    def failed(self) -> bool:
        """Ended without finishing: failed, timed out, killed or cancelled."""
        return self.state in FAILED_STATES

    @property
    def cancelled(self) -> bool:
        """Cancelled by a user or an admin (``CANCELLED by UID``)."""
        return self.state == "CANCELLED"

    @property
    def queued(self) -> bool:
        """Waiting in the queue, with a pending reason."""
        return self.state in QUEUED_STATES

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def gpu_hours(self) -> float | None:
        """Allocated GPUs times elapsed time, in hours."""
        if self.elapsed_s is None or self.gpus is None:
            return None
        return self.gpus * self.elapsed_s / 3600.0


def base_state(text: str) -> str:
    """``CANCELLED by 1000`` -> ``CANCELLED``; ``RUNNING`` stays."""
    return text.split()[0].rstrip("+") if text.strip() else "UNKNOWN"


def expand_task_ids(job_id: str) -> list[str]:
    """``12_[0-2,5%2]`` -> ``[12_0, 12_1, 12_2, 12_5]`` (a pending array's range); others stay."""
    match = _ARRAY_RANGE.match(job_id)
    if match is None:
        return [job_id]
    ids = []
    for part in match["ranges"].split("%")[0].split(","):
        first, _, last = part.partition("-")
        ids.extend(f"{match['array']}_{task}" for task in range(int(first), int(last or first) + 1))
    return ids


def parse_sacct(text: str) -> dict[str, JobState]:
    """``sacct --duplicates --parsable2 --noheader --format=<SACCT_FIELDS>`` output -> task id -> state.

    A requeued task has one line per run, oldest first: the state and nodes are the last run's,
    the elapsed time is the sum over all runs (every run used its GPUs).
    """
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, state, elapsed, tres, nodes = line.split("|")[: len(SACCT_FIELDS)]
        for task_id in expand_task_ids(job_id):
            seconds = int(elapsed) if elapsed.isdigit() else None
            earlier = states.get(task_id)
            used = run_hours(seconds or 0, tres) + (earlier.used_hours if earlier is not None else 0.0)
            if earlier is not None and earlier.elapsed_s is not None and seconds is not None:
                seconds += earlier.elapsed_s
            states[task_id] = JobState(
                job_id=task_id,
                state=base_state(state),
                elapsed_s=seconds,
                gpus=gpus_from_tres(tres),
                nodes="" if nodes == "None assigned" else nodes,
                used_hours=used,
                units=units_from_tres(tres),
            )
    return states


def parse_squeue(text: str) -> dict[str, JobState]:
    """``squeue --array --noheader --format=<SQUEUE_FORMAT>`` output -> task id -> state.

    A running task's reason is ``None`` in squeue: it is kept only for queued tasks.
    """
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, state, nodes, reason = (line.split("|", 3) + [""])[:4]
        state = base_state(state)
        reason = reason.strip() if state in QUEUED_STATES else ""
        for task_id in expand_task_ids(job_id):
            states[task_id] = JobState(job_id=task_id, state=state, nodes=nodes, reason=reason)
    return states


def with_reasons(states: Mapping[str, JobState], queue: Mapping[str, JobState]) -> dict[str, JobState]:
    """sacct's states with squeue's reasons for the tasks both see queued."""
    merged = dict(states)
    for task_id, state in states.items():
        live = queue.get(task_id)
        if state.queued and live is not None and live.reason:
            merged[task_id] = replace(state, reason=live.reason)
    return merged


def needs_nodes(states: Mapping[str, JobState]) -> bool:
    """Whether some queued task's reason can be judged only from the state of its nodes."""
    return any(s.queued and needs_node_states(parse_reason(s.reason)) for s in states.values() if s.reason)


def with_verdicts(states: Mapping[str, JobState], nodes: Sequence[NodeState] | None) -> dict[str, JobState]:
    """Each queued task with ``never_starts`` set when its reason never clears (``nodes``: None if unknown)."""
    by_name = None if nodes is None else {node.name: node for node in nodes}
    judged = dict(states)
    for task_id, state in states.items():
        if state.queued and state.reason:
            why = never_clears(parse_reason(state.reason), by_name)
            if why:
                judged[task_id] = replace(state, never_starts=why)
    return judged


def query_job_states(array_job_ids: Sequence[str]) -> dict[str, JobState]:
    """The state of every task of the given arrays, and why the queued ones wait.

    One ``sacct`` call, plus one ``squeue`` call only when a task is queued, plus one
    ``scontrol show nodes`` only when a task waits for unavailable nodes. Without accounting,
    the ``squeue`` call alone: it knows only tasks still queued or running. Raises
    ``SlurmCommandError`` when neither sacct nor squeue answers.
    """
    if not array_job_ids:
        return {}
    try:
        states = parse_sacct(sacct(array_job_ids, SACCT_FIELDS))
    except SlurmCommandError:
        states = parse_squeue(squeue(array_job_ids, SQUEUE_FORMAT))
    else:
        if any(state.queued for state in states.values()):
            try:
                states = with_reasons(states, parse_squeue(squeue(array_job_ids, SQUEUE_FORMAT)))
            except SlurmCommandError:
                # The states stand without reasons: accounting answered, the controller did not.
                return states
    try:
        nodes = parse_node_states(show_nodes()) if needs_nodes(states) else None
    except SlurmCommandError:
        # Unknown node states judge no ReqNodeNotAvail as never clearing: no false alarm.
        nodes = None
    return with_verdicts(states, nodes)
