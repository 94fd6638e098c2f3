"""The ``nccl`` group: the NCCL environment preset a trial runs under."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from .validation import _require


@dataclass(kw_only=True)
class NcclConfig:
    """The NCCL environment preset a trial runs under (see ``hpcsweep.trial.nccl``)."""

    preset: Literal["a100_ib", "h100_ib", "a100_roce", "ethernet", "none", "auto"] = "auto"
    """Which preset of NCCL variables to export; ``auto``: on a node with an InfiniBand device,
    ``h100_ib`` where the driver names a Hopper GPU and ``a100_ib`` otherwise; ``none`` elsewhere."""
    ib_hca: list[str] = field(default_factory=list)
    """HCAs NCCL may use, e.g. ``[mlx5_0, mlx5_1]`` (exported as ``NCCL_IB_HCA`` with exact
    matching); empty: NCCL chooses. List the compute HCAs to keep NCCL off storage ports."""
    debug: bool = False
    """Also export NCCL_DEBUG=INFO and friends."""
    overrides: dict[str, str] = field(default_factory=dict)
    """Variables that replace or extend the preset's."""
    topo_file: str | None = None
    """A cluster's NCCL topology XML, exported as NCCL_TOPO_FILE."""
    pg_timeout_s: int = 1800
    """Process-group timeout: a hung collective fails the trial after this long."""

    def __post_init__(self) -> None:
        _require(self.pg_timeout_s >= 1, "nccl.pg_timeout_s", self.pg_timeout_s, "seconds >= 1")
        for i, name in enumerate(self.ib_hca):
            _require(
                re.fullmatch(r"[A-Za-z0-9_.-]+(:[0-9]+)?", name) is not None,
                f"nccl.ib_hca[{i}]",
                name,
                "an HCA name as in /sys/class/infiniband, optionally with :port (mlx5_0, mlx5_0:1)",
            )
        _require(
            not (self.ib_hca and self.preset == "ethernet"),
            "nccl.ib_hca",
            self.ib_hca,
            "empty with nccl.preset=ethernet, which turns InfiniBand off",
        )
