"""What a run costs against a budget: GPU-hours, or node-hours on a partition without GPUs.

Pure: the units of an allocation come from sacct's ``AllocTRES``; ``job_states.parse_sacct`` adds
them up over every run of every task (a requeued task's earlier runs included).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcsweep.slurm.cluster_info import gpus_from_tres


@dataclass(frozen=True)
class Usage:
    """A sweep's spending: what all runs have used, and what the running ones add per hour."""

    spent_hours: float
    """GPU-hours (node-hours without GPUs) of every run so far."""
    burn_per_hour: float
    """GPUs (nodes without GPUs) of the runs now running: the hours they add per hour."""


def nodes_from_tres(tres: str) -> int:
    """Nodes in a TRES list: ``cpu=64,gres/gpu=8,node=2`` -> 2; none listed -> 0."""
    for item in tres.split(","):
        name, _, count = item.partition("=")
        if name == "node" and count.isdigit():
            return int(count)
    return 0


def units_from_tres(tres: str) -> int:
    """What one hour of an allocation costs: its GPUs, or its nodes when it holds no GPU.

    ``billing=8,cpu=8,gres/gpu=2,node=1`` -> 2; ``cpu=64,node=2`` -> 2; a pending task's ``''`` -> 0.
    """
    if not tres.strip():
        return 0
    gpus = gpus_from_tres(tres)
    return gpus if gpus > 0 else nodes_from_tres(tres)


def run_hours(elapsed_s: int, tres: str) -> float:
    """The GPU-hours (node-hours without GPUs) one run used: elapsed time x ``units_from_tres``."""
    return units_from_tres(tres) * elapsed_s / 3600.0
