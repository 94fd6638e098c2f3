"""What a partition and a QOS can ever give one job, and the check of a request against it.

Pure: ``sinfo`` and ``sacctmgr`` text in, dataclasses out; a request no node, partition or QOS
could ever satisfy raises ``ValueError`` in one line naming the key, what was asked and what the
cluster has. Slurm itself would queue many such jobs silently (reason ``PartitionConfig``,
``PartitionTimeLimit``, ``QOSMaxWallDurationPerJobLimit``) until someone cancels them, and refuse
others at sbatch, which submitit reports as a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpcsweep.slurm.cluster_info import gpus_from_gres

# One line per partition and node configuration: name (default marked '*'), node count, CPUs,
# memory (MB) and GRES of each node, MaxTime, and the job size in nodes ("1-infinite").
SINFO_FORMAT = "%P|%D|%c|%m|%G|%l|%s"
QOS_FIELDS = ("Name", "MaxTRES", "MaxTRESPerNode", "MaxWall")

_UNLIMITED = {"infinite", "unlimited", "n/a", "none", ""}
_MEM_UNITS_MB = {"m": 1, "g": 1024, "t": 1024 * 1024}


@dataclass(frozen=True)
class NodeShape:
    """``count`` nodes of a partition that share one configuration."""

    count: int
    cpus: int
    mem_mb: int
    gpus: int
    gres: str


@dataclass(frozen=True)
class PartitionShape:
    """A partition's nodes by configuration and the limits it puts on one job."""

    name: str
    default: bool
    nodes: tuple[NodeShape, ...]
    # None: unlimited.
    max_time_min: int | None
    max_nodes: int | None

    @property
    def total_nodes(self) -> int:
        """Every node of the partition, whatever its state (a down node may come back)."""
        return sum(shape.count for shape in self.nodes)


@dataclass(frozen=True)
class QosLimits:
    """Per-job limits of one QOS; TRES amounts keyed ``node``, ``cpu``, ``gres/gpu``, ``mem`` (MB)."""

    name: str
    max_wall_min: int | None = None
    per_job: Mapping[str, int] = field(default_factory=dict)
    per_node: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Asked:
    """One amount of a request with the config key it came from, for the messages."""

    key: str
    # As the user wrote it ("10T"); ``value`` is in the unit the check compares (MB here).
    shown: str
    value: int

    def __str__(self) -> str:
        return f"{self.key}={self.shown}"


@dataclass(frozen=True)
class AllocationRequest:
    """What one job asks for; a per-node amount of None is not asked for (Slurm's default)."""

    nodes: Asked
    time_min: Asked
    cpus_per_node: Asked | None = None
    gpus_per_node: Asked | None = None
    mem_per_node: Asked | None = None
    partition: str | None = None
    qos: str | None = None


def parse_time_min(text: str) -> int | None:
    """Minutes in a Slurm time (``30:00``, ``4:00:00``, ``1-00:00:00``, ``1-12``, ``90``), rounding
    seconds up as Slurm does; None for ``infinite``/``UNLIMITED``. Raises ``ValueError`` otherwise."""
    text = text.strip()
    if text.lower() in _UNLIMITED:
        return None
    days, dash, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    parts = rest.split(":")
    if not (days.isdigit() and 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
        raise ValueError(f"{text!r} is not a Slurm time")
    numbers = [int(p) for p in parts]
    if dash:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (numbers + [0, 0])[:3]
    elif len(numbers) == 3:
        hours, minutes, seconds = numbers
    else:  # minutes[:seconds]
        hours, (minutes, seconds) = 0, (numbers + [0])[:2]
    return int(days) * 1440 + hours * 60 + minutes + (1 if seconds else 0)


def parse_mem_mb(text: str) -> int | None:
    """Megabytes in a ``--mem`` value: ``480G``, ``10T``, ``1024M``, ``512K``, ``500`` (MB);
    None when it is not one."""
    match = re.fullmatch(r"(\d+)([KMGTkmgt]?)", text.strip())
    if not match:
        return None
    number, unit = int(match.group(1)), match.group(2).lower() or "m"
    # Slurm rounds kilobytes up to whole megabytes.
    return -(-number // 1024) if unit == "k" else number * _MEM_UNITS_MB[unit]


def parse_sinfo_partitions(text: str) -> list[PartitionShape]:
    """Partitions from ``sinfo --noheader --format=SINFO_FORMAT``, in sinfo's order.

    A partition whose nodes differ (CPUs, memory, GRES) has one line per configuration.
    """
    lines: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 7:
            lines.setdefault(fields[0], []).append(fields)
    by_name: dict[str, PartitionShape] = {}
    for raw_name, rows in lines.items():
        name = raw_name.rstrip("*")
        shapes = tuple(
            NodeShape(_leading_int(count), _leading_int(cpus), _leading_int(mem), gpus_from_gres(gres), gres)
            for _, count, cpus, mem, gres, _, _ in rows
        )
        first = rows[0]
        previous = by_name.get(name)
        by_name[name] = PartitionShape(
            name=name,
            default=raw_name.endswith("*") or (previous is not None and previous.default),
            nodes=(previous.nodes if previous else ()) + shapes,
            max_time_min=parse_time_min(first[5]),
            max_nodes=_max_job_nodes(first[6]),
        )
    return list(by_name.values())


def parse_qos_limits(text: str) -> list[QosLimits]:
    """QOSes from ``sacctmgr --noheader --parsable2 show qos format=Name,MaxTRES,MaxTRESPerNode,MaxWall``."""
    out = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) >= 4 and fields[0]:
            out.append(QosLimits(fields[0], parse_time_min(fields[3]), _tres(fields[1]), _tres(fields[2])))
    return out


def check_request(
    request: AllocationRequest, partitions: Sequence[PartitionShape], qos: QosLimits | None = None
) -> None:
    """Raise ``ValueError`` when no node, the partition or the QOS can ever satisfy ``request``.

    The partition is the requested one, else the cluster's default. A partition with nodes of
    several configurations satisfies a request when enough nodes of ones that fit exist.
    """
    partition = chosen_partition(request.partition, partitions)
    _check_partition(request, partition)
    if qos is not None:
        _check_qos(request, qos)


def chosen_partition(name: str | None, partitions: Sequence[PartitionShape]) -> PartitionShape:
    """The partition named ``name``, else the cluster's default; ``ValueError`` naming the key."""
    known = {p.name: p for p in partitions}
    if name is not None:
        if name not in known:
            raise ValueError(
                f"hydra.launcher.partition={name!r} is not a partition of this cluster; "
                f"allowed: {', '.join(sorted(known)) or '(none found)'}"
            )
        return known[name]
    default = next((p for p in partitions if p.default), None)
    if default is None:
        raise ValueError(
            "hydra.launcher.partition is not set and this cluster has no default partition; "
            f"allowed: {', '.join(sorted(known)) or '(none found)'}"
        )
    return default


def _check_partition(request: AllocationRequest, partition: PartitionShape) -> None:
    name, nodes = partition.name, request.nodes
    if partition.max_time_min is not None and request.time_min.value > partition.max_time_min:
        raise ValueError(
            f"{request.time_min} is more than partition {name} allows: MaxTime={partition.max_time_min} min"
        )
    per_node = [
        (asked, attr, unit)
        for asked, attr, unit in (
            (request.cpus_per_node, "cpus", "CPUs"),
            (request.gpus_per_node, "gpus", "GPUs"),
            (request.mem_per_node, "mem_mb", "MB of memory"),
        )
        if asked is not None
    ]
    for asked, attr, unit in per_node:
        best = max(partition.nodes, key=lambda shape: getattr(shape, attr), default=None)
        most = getattr(best, attr) if best else 0
        if asked.value > most:
            gres = f" (gres {best.gres})" if attr == "gpus" and best else ""
            raise ValueError(f"{asked}: no node of partition {name} has more than {most} {unit}{gres}")
    if nodes.value > partition.total_nodes:
        raise ValueError(f"{nodes} is more than partition {name} has: {partition.total_nodes} nodes")
    if partition.max_nodes is not None and nodes.value > partition.max_nodes:
        raise ValueError(f"{nodes} is more than partition {name} allows: MaxNodes={partition.max_nodes}")
    fitting = sum(
        shape.count
        for shape in partition.nodes
        if all(asked.value <= getattr(shape, attr) for asked, attr, _ in per_node)
    )
    if nodes.value > fitting:
        together = ", ".join(str(asked) for asked, _, _ in per_node)
        raise ValueError(
            f"{nodes} is more than partition {name} has nodes with {together} on each: {fitting} "
            f"(its nodes: {_describe(partition.nodes)})"
        )


def _check_qos(request: AllocationRequest, qos: QosLimits) -> None:
    if qos.max_wall_min is not None and request.time_min.value > qos.max_wall_min:
        raise ValueError(f"{request.time_min} is more than qos {qos.name} allows: MaxWall={qos.max_wall_min} min")
    nodes = request.nodes
    if "node" in qos.per_job and nodes.value > qos.per_job["node"]:
        raise ValueError(f"{nodes} is more than qos {qos.name} allows: MaxTRESPerJob node={qos.per_job['node']}")
    for asked, tres in (
        (request.cpus_per_node, "cpu"),
        (request.gpus_per_node, "gres/gpu"),
        (request.mem_per_node, "mem"),
    ):
        if asked is None:
            continue
        if tres in qos.per_node and asked.value > qos.per_node[tres]:
            raise ValueError(f"{asked} is more than qos {qos.name} allows: MaxTRESPerNode {tres}={qos.per_node[tres]}")
        total = nodes.value * asked.value
        if tres in qos.per_job and total > qos.per_job[tres]:
            raise ValueError(
                f"{nodes} x {asked} = {total} {tres} per job is more than qos {qos.name} allows: "
                f"MaxTRESPerJob {tres}={qos.per_job[tres]}"
            )


def _describe(shapes: Sequence[NodeShape]) -> str:
    return ", ".join(f"{s.count} x ({s.cpus} CPUs, {s.gpus} GPUs, {s.mem_mb} MB)" for s in shapes)


def _leading_int(text: str) -> int:
    # sinfo appends '+' when the nodes of one line differ ("64+"): the smaller value holds for all.
    match = re.match(r"\d+", text.strip())
    return int(match.group()) if match else 0


def _max_job_nodes(size: str) -> int | None:
    # "%s": "1-infinite", "1-4", or one number when the least and most are equal.
    most = size.strip().rpartition("-")[2]
    return int(most) if most.isdigit() else None


def _tres(text: str) -> dict[str, int]:
    """``cpu=100,gres/gpu=8,mem=100G,node=2`` -> amounts, memory in MB; others (billing=) kept if whole."""
    out: dict[str, int] = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        amount = parse_mem_mb(value) if name == "mem" else (int(value) if value.isdigit() else None)
        if name and amount is not None:
            out[name] = amount
    return out
