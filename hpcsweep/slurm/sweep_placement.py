"""Placing the trials of one sweep together, so that ``pin``-mode trials get nodes of their own.

Pure: it takes the parsed switch tree and node states (:mod:`hpcsweep.slurm.topology`,
:mod:`hpcsweep.slurm.nodes`) and returns sbatch options per trial.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpcsweep.slurm.nodes import NodeState
from hpcsweep.slurm.topology import SwitchTree, check_topology_keys, pin_nodes, topology_sbatch_options


@dataclass(frozen=True)
class PlacementRequest:
    """One trial of a sweep, as far as its placement goes."""

    trial: int
    """The trial's number in the sweep (the key of the answer)."""
    mode: str
    """``topology.mode``."""
    nodes: int
    """``trainer.nodes``."""
    max_wait_min: int
    """``topology.max_wait_min`` after :func:`hpcsweep.slurm.topology.capped_max_wait_min`."""
    exclude: tuple[str, ...] = ()
    """Nodes the trial must not run on (``topology.exclude`` and the launcher's ``exclude``)."""


def sweep_placements(
    requests: Sequence[PlacementRequest],
    tree: SwitchTree,
    node_states: Sequence[NodeState],
    *,
    partition: str | None = None,
) -> tuple[dict[int, dict[str, str]], list[str]]:
    """The sbatch options of every trial of a sweep, and log messages about them.

    ``pin`` trials, in request order, each get nodes of their own from :func:`pin_nodes`: the
    nodes given to one are taken for the rest, so no two trials queue on the same nodes. Once
    no placement remains, the rest fall back to the ``switches`` options, and one message says
    how many. Every other request gets :func:`topology_sbatch_options` unchanged.
    """
    options: dict[int, dict[str, str]] = {}
    taken: set[str] = set()
    pinned: list[int] = []
    fell_back: list[int] = []
    for request in requests:
        check_topology_keys(request.mode, request.max_wait_min)
        mode = request.mode
        if mode == "pin" and request.nodes > 1 and not tree.is_empty:
            placement = pin_nodes(
                tree, node_states, request.nodes, exclude=request.exclude, partition=partition, taken=taken
            )
            if placement is not None:
                taken.update(placement.nodes)
                pinned.append(request.trial)
                options[request.trial] = {"nodelist": placement.nodelist}
                continue
            fell_back.append(request.trial)
            mode = "switches"
        options[request.trial] = topology_sbatch_options(
            mode,
            request.nodes,
            tree,
            node_states,
            max_wait_min=request.max_wait_min,
            exclude=request.exclude,
            partition=partition,
        )
    messages = []
    if fell_back:
        messages.append(
            f"topology.mode=pin: {len(pinned)} trial(s) got free nodes of their own; none as close together "
            f"remain for the other {len(fell_back)} (trial(s) {_numbers(fell_back)}), so they fall back to "
            "topology.mode=switches: Slurm places them, waiting up to topology.max_wait_min for the fewest "
            "leaf switches"
        )
    return options, messages


def _numbers(trials: Sequence[int], shown: int = 8) -> str:
    """Trial numbers for a log line: all of them, or past ``shown`` the first few, the last and the count."""
    if len(trials) <= shown:
        return ", ".join(map(str, trials))
    return f"{', '.join(map(str, trials[: shown - 1]))}, ... {trials[-1]} ({len(trials)} in all)"
