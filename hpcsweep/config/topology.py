"""The ``topology`` group: how multi-node trials are placed on the switch tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .validation import _require


@dataclass(kw_only=True)
class TopologyConfig:
    """How multi-node trials are placed on the switch tree (see ``hpcsweep.slurm.topology``)."""

    mode: Literal["switches", "pin", "off"] = "switches"
    """``switches``: --switches=K@max_wait; ``pin``: an explicit --nodelist; ``off``: no constraint."""
    max_wait_min: int = 5
    """How long Slurm may hold a trial waiting for the fewest-switch placement."""
    exclude: list[str] = field(default_factory=list)
    """Nodes never to choose."""

    def __post_init__(self) -> None:
        _require(self.max_wait_min >= 0, "topology.max_wait_min", self.max_wait_min, "minutes >= 0")
