"""Pure parsing of ``scontrol show nodes --oneliner``: what state each node is in, what is free."""

from __future__ import annotations

from dataclasses import dataclass

from hpcsweep.slurm.cluster_info import gpus_from_gres, gpus_from_tres, parse_fields


@dataclass(frozen=True)
class NodeState:
    """One node of ``scontrol show nodes --oneliner``."""

    name: str
    state: str
    """Base state: ``IDLE``, ``MIXED``, ``ALLOCATED``, ``DOWN``, ..."""
    flags: frozenset[str]
    """``DRAIN``, ``NOT_RESPONDING`` (the ``*`` of ``DOWN*``), ``COMPLETING``, ..."""
    partitions: tuple[str, ...]
    cpus_total: int
    cpus_alloc: int
    gpus_total: int
    gpus_alloc: int

    @property
    def is_usable(self) -> bool:
        """Whether Slurm may start new work here: not down, drained, failing or unreachable."""
        return self.state not in _UNUSABLE_STATES and not self.flags & _UNUSABLE_FLAGS

    @property
    def free_gpus(self) -> int:
        """GPUs not allocated to any job (0 on an unusable node)."""
        return max(self.gpus_total - self.gpus_alloc, 0) if self.is_usable else 0

    @property
    def is_free(self) -> bool:
        """Usable and wholly idle: no CPU or GPU allocated and no job completing.

        A trial takes whole nodes (one torchrun agent using every GPU), so a node with any
        allocation counts as busy.
        """
        return (
            self.is_usable
            and self.state == "IDLE"
            and "COMPLETING" not in self.flags
            and self.cpus_alloc == 0
            and self.gpus_alloc == 0
        )


_UNUSABLE_STATES = frozenset({"DOWN", "FUTURE", "UNKNOWN", "ERROR"})
_UNUSABLE_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINED",
        "DRAINING",
        "FAIL",
        "FAILING",
        "NOT_RESPONDING",
        "MAINT",
        "MAINTENANCE",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "POWERING_DOWN",
        "POWER_DOWN",
        "INVALID_REG",
        "RESERVED",
    }
)
# sinfo-style suffixes that scontrol also appends to a state, e.g. DOWN*.
_STATE_SUFFIXES = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "!": "POWER_DOWN",
    "-": "PLANNED",
}


def parse_node_states(text: str) -> list[NodeState]:
    """Parse ``scontrol show nodes --oneliner``, one :class:`NodeState` per ``NodeName=`` line."""
    states = []
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        f = parse_fields(line)
        base, flags = _parse_state(f.get("State", "UNKNOWN"))
        partitions = f.get("Partitions", "")
        states.append(
            NodeState(
                name=f["NodeName"],
                state=base,
                flags=flags,
                partitions=tuple(p for p in partitions.split(",") if p and p != "(null)"),
                cpus_total=_int(f.get("CPUTot")),
                cpus_alloc=_int(f.get("CPUAlloc")),
                gpus_total=gpus_from_tres(f.get("CfgTRES", "")) or gpus_from_gres(f.get("Gres", "")),
                gpus_alloc=gpus_from_tres(f.get("AllocTRES", "")),
            )
        )
    return states


def _parse_state(raw: str) -> tuple[str, frozenset[str]]:
    words = raw.upper().split("+")
    flags = set(words[1:])
    base = words[0]
    while base and base[-1] in _STATE_SUFFIXES:
        flags.add(_STATE_SUFFIXES[base[-1]])
        base = base[:-1]
    return base, frozenset(flags)


def _int(raw: str | None) -> int:
    return int(raw) if raw and raw.isdigit() else 0
