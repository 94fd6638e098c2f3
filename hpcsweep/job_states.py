"""The Slurm state of a sweep's array tasks: one ``sacct`` call for every array of the sweep.

Parsing is pure (``parse_sacct``, ``parse_squeue`` take the command's text); ``query_job_states``
is the one side effect. ``squeue`` is asked only when accounting does not answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hpcsweep.slurm.cluster_info import gpus_from_tres
from hpcsweep.slurm.commands import SlurmCommandError, sacct, squeue

SACCT_FIELDS = ("JobID", "State", "ElapsedRaw", "AllocTRES", "NodeList")
SQUEUE_FORMAT = "%i|%T|%N"
FAILED_STATES = frozenset(
    {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED", "BOOT_FAIL", "DEADLINE"}
)
"""End states that mean a trial did not finish."""
ACTIVE_STATES = frozenset(
    {
        "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
        "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "PREEMPTED",
    }
)
"""States after which more happens (a preempted task of a requeueing partition comes back)."""
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

    @property
    def failed(self) -> bool:
        return self.state in FAILED_STATES

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
            if earlier is not None and earlier.elapsed_s is not None and seconds is not None:
                seconds += earlier.elapsed_s
            states[task_id] = JobState(
                job_id=task_id,
                state=base_state(state),
                elapsed_s=seconds,
                gpus=gpus_from_tres(tres),
                nodes="" if nodes == "None assigned" else nodes,
            )
    return states


def parse_squeue(text: str) -> dict[str, JobState]:
    """``squeue --array --noheader --format=<SQUEUE_FORMAT>`` output -> task id -> state."""
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, state, nodes = line.split("|")[:3]
        for task_id in expand_task_ids(job_id):
            states[task_id] = JobState(job_id=task_id, state=base_state(state), nodes=nodes)
    return states


def query_job_states(array_job_ids: Sequence[str]) -> dict[str, JobState]:
    """The state of every task of the given arrays from one ``sacct`` call.

    Without accounting, one ``squeue`` call instead: it knows only tasks still queued or running.
    Raises ``SlurmCommandError`` when neither answers.
    """
    if not array_job_ids:
        return {}
    try:
        return parse_sacct(sacct(array_job_ids, SACCT_FIELDS))
    except SlurmCommandError:
        return parse_squeue(squeue(array_job_ids, SQUEUE_FORMAT))
