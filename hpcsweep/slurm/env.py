"""Pure parsing of the ``SLURM_*`` environment of a job, and of Slurm nodelist expressions.

Nothing here reads ``os.environ`` or runs a command: callers pass the environment as a mapping,
so tests feed literal dictionaries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import product

SLURM_ENV_VARS: Mapping[str, tuple[str, ...]] = {
    "job_id": ("SLURM_JOB_ID", "SLURM_JOBID"),
    "array_job_id": ("SLURM_ARRAY_JOB_ID",),
    "array_task_id": ("SLURM_ARRAY_TASK_ID",),
    "job_name": ("SLURM_JOB_NAME",),
    "partition": ("SLURM_JOB_PARTITION",),
    "node_id": ("SLURM_NODEID",),
    "procid": ("SLURM_PROCID",),
    "localid": ("SLURM_LOCALID",),
    "ntasks": ("SLURM_NTASKS",),
    "num_nodes": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    "nodelist": ("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "restart_count": ("SLURM_RESTART_COUNT",),
    "node_name": ("SLURMD_NODENAME",),
    "cpus_per_task": ("SLURM_CPUS_PER_TASK",),
    "gpus_on_node": ("SLURM_GPUS_ON_NODE",),
    "submit_dir": ("SLURM_SUBMIT_DIR",),
}
"""Field of :class:`SlurmJobEnv` → the variables it is read from, first one set wins
(older Slurm releases spell some of them differently)."""


@dataclass(frozen=True)
class SlurmJobEnv:
    """What one process learns about its Slurm job from the environment.

    Counts that Slurm leaves unset in some contexts (a batch script has no ``SLURM_PROCID`` before
    ``srun``) default to the value they would have on the first node: ranks 0, one node.
    """

    job_id: str
    array_job_id: str | None = None
    array_task_id: int | None = None
    job_name: str | None = None
    partition: str | None = None
    node_id: int = 0
    procid: int = 0
    localid: int = 0
    ntasks: int | None = None
    num_nodes: int = 1
    nodelist: str | None = None
    restart_count: int = 0
    node_name: str | None = None
    cpus_per_task: int | None = None
    gpus_on_node: int | None = None
    submit_dir: str | None = None

    @property
    def is_array_task(self) -> bool:
        """Whether this job is one task of a job array."""
        return self.array_job_id is not None and self.array_task_id is not None

    @property
    def job_label(self) -> str:
        """``ARRAYID_TASK`` for an array task (the id ``scontrol``/``sacct`` accept), else the job id."""
        if self.is_array_task:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    @property
    def hostnames(self) -> list[str]:
        """The job's nodes, expanded from :attr:`nodelist` (empty when Slurm did not set it)."""
        return expand_nodelist(self.nodelist) if self.nodelist else []


_INT_FIELDS = frozenset(
    {
        "array_task_id",
        "node_id",
        "procid",
        "localid",
        "ntasks",
        "num_nodes",
        "restart_count",
        "cpus_per_task",
        "gpus_on_node",
    }
)


def _lookup(env: Mapping[str, str], field: str) -> tuple[str, str] | None:
    for name in SLURM_ENV_VARS[field]:
        value = env.get(name)
        if value is not None and value != "":
            return name, value
    return None


def slurm_job_env(env: Mapping[str, str]) -> SlurmJobEnv | None:
    """Parse the Slurm variables of ``env``; ``None`` when ``env`` is not inside a Slurm job.

    Raises ``ValueError`` naming the variable when a count is not an integer.
    """
    if _lookup(env, "job_id") is None:
        return None
    values: dict[str, object] = {}
    for field in SLURM_ENV_VARS:
        found = _lookup(env, field)
        if found is None:
            continue
        name, raw = found
        if field in _INT_FIELDS:
            values[field] = _parse_int(name, raw)
        else:
            values[field] = raw
    if "num_nodes" not in values and "nodelist" in values:
        values["num_nodes"] = len(expand_nodelist(str(values["nodelist"])))
    return SlurmJobEnv(**values)  # type: ignore[arg-type]


def _parse_int(name: str, raw: str) -> int:
    # SLURM_GPUS_ON_NODE and SLURM_CPUS_PER_TASK are plain counts, but be strict: a typo in a
    # hand-exported variable should stop the trial, not silently become 0.
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def expand_nodelist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression the way ``scontrol show hostnames`` does.

    ``node[1-3,7]`` → node1 node2 node3 node7; ``gpu-a[01-04]`` keeps the zero padding;
    ``a[1-2],b3`` → a1 a2 b3; ``rack[1-2]-n[1-2]`` → rack1-n1 rack1-n2 rack2-n1 rack2-n2.
    Raises ``ValueError`` on an unbalanced bracket or a bad range.
    """
    hosts: list[str] = []
    for part in _split_top_level(expr.strip()):
        hosts.extend(_expand_one(part))
    return hosts


def _split_top_level(expr: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in nodelist {expr!r}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in nodelist {expr!r}")
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_one(pattern: str) -> list[str]:
    pieces: list[list[str]] = []
    pos = 0
    for match in _BRACKET.finditer(pattern):
        pieces.append([pattern[pos : match.start()]])
        pieces.append(_expand_ranges(match.group(1), pattern))
        pos = match.end()
    pieces.append([pattern[pos:]])
    if any(ch in "[]" for piece in pieces if len(piece) == 1 for ch in piece[0]):
        raise ValueError(f"nested or unbalanced brackets in nodelist {pattern!r}")
    return ["".join(combo) for combo in product(*pieces)]


def _expand_ranges(body: str, pattern: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {item!r} in nodelist {pattern!r}")
        if not sep:
            out.append(lo)
            continue
        start, stop = int(lo), int(hi)
        if stop < start:
            raise ValueError(f"descending range {item!r} in nodelist {pattern!r}")
        # Slurm pads every number to the width of the lower bound: gpu-a[01-04], y[09-11].
        width = len(lo)
        out.extend(str(i).zfill(width) for i in range(start, stop + 1))
    return out
