"""``python -m hpcsweep.topology``: show the switch tree, free and busy nodes, and a placement.

``--trials N`` also shows how a sweep of N trials in ``topology.mode=pin`` would be spread: the
nodes each trial would be pinned to, and which would fall back to ``switches``.

The ``--switches`` option it previews is the one a sweep submits: ``topology.max_wait_min`` (the
config's default unless ``--max-wait-min`` says otherwise), capped at the cluster's
``max_switch_wait`` by the same :func:`hpcsweep.slurm.topology.capped_max_wait_min`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hpcsweep.config import TopologyConfig
from hpcsweep.slurm import commands
from hpcsweep.slurm.cluster_info import parse_max_switch_wait
from hpcsweep.slurm.nodes import NodeState, parse_node_states
from hpcsweep.slurm.sweep_placement import PlacementRequest, sweep_placements
from hpcsweep.slurm.topology import (
    SwitchTree,
    capped_max_wait_min,
    choose_nodes,
    parse_topology,
    topology_sbatch_options,
)


def describe(
    tree: SwitchTree,
    states: Sequence[NodeState],
    nodes: int,
    partition: str | None,
    *,
    max_wait_min: int,
    trials: int = 1,
) -> str:
    """The report the CLI prints, from parsed Slurm output (pure, so it can be tested)."""
    if tree.is_empty:
        return "no switch tree: the cluster has no topology plugin, so placement is unconstrained\n"
    by_name = {s.name: s for s in states}
    in_partition = {s.name for s in states if partition is None or partition in s.partitions}
    lines = []
    for switch in sorted(tree.switches.values(), key=lambda s: -s.level):
        depth = len(tree.ancestors(switch.name)) - 1
        line = f"{'  ' * depth}{switch.name} (level {switch.level})"
        if not switch.children:
            groups: dict[str, list[str]] = {"free": [], "busy": [], "unusable": []}
            for node in switch.nodes:
                state = by_name.get(node)
                if state is None or node not in in_partition or not state.is_usable:
                    groups["unusable"].append(node)
                else:
                    groups["free" if state.is_free else "busy"].append(node)
            line += "  " + "  ".join(f"{k}: {','.join(v) or '-'}" for k, v in groups.items())
        lines.append((tree.ancestors(switch.name)[::-1], line))
    out = [line for _, line in sorted(lines, key=lambda item: item[0])]
    free = [s.name for s in states if s.is_free and s.name in in_partition]
    placement = choose_nodes(tree, free, nodes)
    if placement is None:
        out.append(f"placement for {nodes} node(s): not enough free nodes now")
    else:
        out.append(
            f"placement for {nodes} node(s): {placement.nodelist}  "
            f"(leaves {','.join(placement.leaves)}, common switch {placement.lca}, "
            f"{placement.hops} pair hops)"
        )
    options = topology_sbatch_options("switches", nodes, tree, states, max_wait_min=max_wait_min, partition=partition)
    out.append("sbatch options (mode=switches): " + _options_text(options))
    requests = [PlacementRequest(trial=i, mode="pin", nodes=nodes, max_wait_min=max_wait_min) for i in range(trials)]
    pinned, messages = sweep_placements(requests, tree, states, partition=partition)
    out.append(f"sbatch options (mode=pin, {trials} trial(s)):")
    out.extend(f"  trial {i}: {_options_text(pinned[i])}" for i in range(trials))
    out.extend(f"  {message}" for message in messages)
    return "\n".join(out) + "\n"


def _options_text(options: dict[str, str]) -> str:
    return " ".join(f"--{k}={v}" for k, v in options.items()) or "none"


def main(argv: Sequence[str] | None = None) -> int:
    """Read the live cluster through ``hpcsweep.slurm.commands`` and print :func:`describe`."""
    parser = argparse.ArgumentParser(prog="python -m hpcsweep.topology", description=__doc__)
    parser.add_argument("--nodes", type=int, default=2, help="nodes per trial (default 2)")
    parser.add_argument(
        "--trials", type=int, default=1, help="trials of a pin-mode sweep to spread over free nodes (default 1)"
    )
    parser.add_argument("--partition", default=None, help="only nodes of this partition")
    parser.add_argument(
        "--max-wait-min",
        type=int,
        default=TopologyConfig().max_wait_min,
        help="topology.max_wait_min of the sweep to preview (default: the config's, %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        TopologyConfig(max_wait_min=args.max_wait_min)  # the sweep's own check of the value
    except ValueError as err:
        parser.error(str(err))
    if args.trials < 1:
        parser.error(f"--trials: must be >= 1, got {args.trials}")
    try:
        tree = parse_topology(commands.show_topology())
        states = parse_node_states(commands.show_nodes())
        max_switch_wait_s = parse_max_switch_wait(commands.show_config())
    except commands.SlurmCommandError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    max_wait_min, warning = capped_max_wait_min(args.max_wait_min, max_switch_wait_s)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write(describe(tree, states, args.nodes, args.partition, max_wait_min=max_wait_min, trials=args.trials))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
