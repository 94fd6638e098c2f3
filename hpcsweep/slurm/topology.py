"""The cluster's switch tree and where a multi-node trial should run.

Parsing is pure: :func:`parse_topology` takes ``scontrol show topology`` output (Slurm 22.05
format); node states come from :mod:`hpcsweep.slurm.nodes`.
A cluster without a topology plugin parses to an empty :class:`SwitchTree`, which means
"no constraint" everywhere below.

Placement quality, best first (this order is what "optimal" means for :func:`choose_nodes`):

1. fewest leaf switches;
2. lowest level of the lowest common switch of the chosen leaves (how high traffic must climb);
3. fewest hops: the sum over all node pairs of the links on the path between them (2 on one leaf,
   2 + the links up to the lowest common switch and back down otherwise);
4. best fit: the fewest free nodes left over on the leaves it touches, so big holes stay whole;
5. leaves in ``scontrol`` order, then nodes in nodelist order.

Criteria 1 and 2 are always met exactly. 3 and 4 are exact whenever the lowest common switch
sits directly above the leaves (any two-level tree, and any placement under one aggregation
switch); higher up a greedy choice of leaves is used, which keeps the search fast.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hpcsweep.slurm.cluster_info import parse_fields
from hpcsweep.slurm.env import expand_nodelist
from hpcsweep.slurm.nodes import NodeState

TOPOLOGY_MODES = ("switches", "pin", "off")
"""Allowed values of the ``topology.mode`` config key."""


@dataclass(frozen=True)
class Switch:
    """One line of ``scontrol show topology``."""

    name: str
    level: int
    link_speed: int
    nodes: tuple[str, ...]
    """Nodes as reported (upper switches may list every node below them)."""
    children: tuple[str, ...]
    """Child switches; empty for a leaf switch."""


@dataclass(frozen=True)
class SwitchTree:
    """Switches by name in ``scontrol`` order, with the derived parent, leaf and node maps."""

    switches: Mapping[str, Switch]
    parent: Mapping[str, str]
    """Switch → the switch directly above it (absent for a root)."""
    leaves: tuple[str, ...]
    """Leaf switches (no child switches) in ``scontrol`` order."""
    leaf_of: Mapping[str, str]
    """Node → its leaf switch."""

    @classmethod
    def from_switches(cls, switches: Iterable[Switch]) -> SwitchTree:
        """Build the tree and its derived maps from parsed switches."""
        by_name = {s.name: s for s in switches}
        parent = {child: s.name for s in by_name.values() for child in s.children}
        leaves = tuple(s.name for s in by_name.values() if not s.children)
        leaf_of: dict[str, str] = {}
        for leaf in leaves:
            for node in by_name[leaf].nodes:
                leaf_of.setdefault(node, leaf)
        return cls(switches=by_name, parent=parent, leaves=leaves, leaf_of=leaf_of)

    @property
    def is_empty(self) -> bool:
        """True when the cluster reported no switches (no topology plugin)."""
        return not self.leaves

    def ancestors(self, switch: str) -> list[str]:
        """``switch`` and every switch above it, bottom up."""
        chain = [switch]
        while chain[-1] in self.parent and len(chain) <= len(self.switches):
            chain.append(self.parent[chain[-1]])
        return chain

    def leaves_under(self, switch: str) -> list[str]:
        """The leaf switches below ``switch`` (itself for a leaf), in ``scontrol`` order."""
        return [leaf for leaf in self.leaves if switch in self.ancestors(leaf)]


def parse_topology(text: str) -> SwitchTree:
    """Parse ``scontrol show topology``; lines that describe no switch (messages such as
    "Topology plugin may not be configured") are ignored, so such output is an empty tree."""
    switches = []
    for line in text.splitlines():
        if not line.strip().startswith("SwitchName="):
            continue
        f = parse_fields(line)
        switches.append(
            Switch(
                name=f["SwitchName"],
                level=int(f.get("Level", "0")),
                link_speed=int(f.get("LinkSpeed", "1")),
                nodes=tuple(expand_nodelist(f.get("Nodes", "").replace("(null)", ""))),
                children=tuple(expand_nodelist(f.get("Switches", "").replace("(null)", ""))),
            )
        )
    return SwitchTree.from_switches(switches)


@dataclass(frozen=True)
class Placement:
    """Nodes chosen for one trial and how good the choice is (see the module docstring)."""

    nodes: tuple[str, ...]
    leaves: tuple[str, ...]
    lca: str | None
    """Lowest switch above every chosen leaf; ``None`` when they hang under different roots."""
    lca_level: int
    hops: int
    leftover: int
    """Free nodes left unused on the chosen leaves."""

    @property
    def nodelist(self) -> str:
        """The nodes comma-separated, for ``sbatch --nodelist``."""
        return ",".join(self.nodes)


def _min_leaves(counts: Iterable[int], n: int) -> int | None:
    total = 0
    for used, count in enumerate(sorted(counts, reverse=True), start=1):
        total += count
        if total >= n:
            return used
    return None


class _Distances:
    """Hop counts between leaves, memoised per pair."""

    def __init__(self, tree: SwitchTree):
        self._tree = tree
        self._depth = {leaf: {s: d for d, s in enumerate(tree.ancestors(leaf))} for leaf in tree.leaves}
        self._max_depth = 1 + max(len(d) for d in self._depth.values())
        self._memo: dict[tuple[str, str], int] = {}

    def node_hops(self, a: str, b: str) -> int:
        """Links between a node on leaf ``a`` and a node on leaf ``b``."""
        key = (a, b) if a <= b else (b, a)
        if key not in self._memo:
            up_a, up_b = self._depth[a], self._depth[b]
            common = [up_a[s] + up_b[s] for s in up_a if s in up_b]
            # Under different roots: count a virtual root one level above the deepest chain.
            self._memo[key] = 2 + (min(common) if common else 2 * self._max_depth)
        return self._memo[key]

    def total_hops(self, used: Mapping[str, int]) -> int:
        leaves = list(used)
        total = sum(2 * m * (m - 1) // 2 for m in used.values())
        for i, a in enumerate(leaves):
            for b in leaves[i + 1 :]:
                total += used[a] * used[b] * self.node_hops(a, b)
        return total


def choose_nodes(tree: SwitchTree, free: Collection[str], n: int) -> Placement | None:
    """The best placement of ``n`` nodes among ``free`` (see the module docstring for "best").

    ``None`` when the tree is empty or fewer than ``n`` free nodes sit under its leaves.
    Callers pass only nodes that may be used: drained, down and excluded nodes must not be in
    ``free``.
    """
    if n < 1:
        raise ValueError(f"cannot place {n} nodes")
    if tree.is_empty:
        return None
    free_set = set(free)
    avail = {leaf: [x for x in tree.switches[leaf].nodes if x in free_set] for leaf in tree.leaves}
    counts = {leaf: len(nodes) for leaf, nodes in avail.items() if nodes}
    k = _min_leaves(counts.values(), n)
    if k is None:
        return None
    dist = _Distances(tree)
    order = {leaf: i for i, leaf in enumerate(tree.leaves)}
    under: dict[str, list[str]] = {}
    for leaf in counts:
        for switch in tree.ancestors(leaf):
            under.setdefault(switch, []).append(leaf)
    by_level = sorted(under, key=lambda s: tree.switches[s].level)
    best: tuple | None = None
    for switch in by_level:
        level = tree.switches[switch].level
        if best is not None and level > best[0]:
            break
        leaves = under[switch]
        if _min_leaves((counts[leaf] for leaf in leaves), n) != k:
            continue
        candidate = _place(tree, switch, leaves, counts, k, n, dist, order)
        key = (level, *candidate)
        if best is None or key[:4] < best[:4]:
            best = key
    if best is None:  # no common switch can host it: span roots
        best = (-1, *_place(tree, None, list(counts), counts, k, n, dist, order))
    _, hops, leftover, _, used, lca = best
    nodes = tuple(x for leaf in sorted(used, key=order.get) for x in avail[leaf][: used[leaf]])
    leaves_used = tuple(sorted(used, key=order.get))
    return Placement(
        nodes=nodes,
        leaves=leaves_used,
        lca=lca,
        lca_level=tree.switches[lca].level if lca else 1 + max(s.level for s in tree.switches.values()),
        hops=hops,
        leftover=leftover,
    )


def _place(
    tree: SwitchTree,
    lca: str | None,
    leaves: list[str],
    counts: Mapping[str, int],
    k: int,
    n: int,
    dist: _Distances,
    order: Mapping[str, int],
) -> tuple[int, int, tuple[int, ...], dict[str, int], str | None]:
    """k-1 full leaves plus one partial leaf under ``lca``: (hops, leftover, position, used, lca)."""
    two_level = lca is not None and all(not tree.switches[c].children for c in tree.switches[lca].children)
    if two_level:
        ranked = sorted(leaves, key=lambda leaf: (-counts[leaf], order[leaf]))
    else:
        # Greedy: among equal counts prefer leaves whose parent has the most free nodes nearby.
        near: dict[str | None, int] = {}
        for leaf in leaves:
            near[tree.parent.get(leaf)] = near.get(tree.parent.get(leaf), 0) + counts[leaf]
        ranked = sorted(leaves, key=lambda leaf: (-counts[leaf], -near[tree.parent.get(leaf)], order[leaf]))
    full = ranked[: k - 1]
    used = {leaf: counts[leaf] for leaf in full}
    rest = n - sum(used.values())
    # Any leaf with room for the rest keeps criteria 1-2; pick by hops, then best fit, then order.
    partial = min(
        (leaf for leaf in ranked[k - 1 :] if counts[leaf] >= rest),
        key=lambda leaf: (
            sum(m * dist.node_hops(leaf, f) for f, m in used.items()),
            counts[leaf],
            order[leaf],
        ),
    )
    used[partial] = rest
    if not two_level:
        used = _best_partial(used, counts, dist, order)
    position = tuple(sorted(order[leaf] for leaf in used))
    return dist.total_hops(used), counts[partial] - rest, position, used, lca


def _best_partial(
    used: dict[str, int], counts: Mapping[str, int], dist: _Distances, order: Mapping[str, int]
) -> dict[str, int]:
    """With the leaves fixed, move the shortfall to the leaf where it saves the most hops.

    Taking ``short`` nodes off leaf p of a full allocation f lowers the pair hops by
    ``short * (sum_b f_b d(p, b) + 2 f_p - short - 1)``; leftover stays ``short`` wherever it is.
    """
    short = sum(counts[leaf] for leaf in used) - sum(used.values())
    if short == 0:
        return used

    def saving(p: str) -> tuple[int, int]:
        reach = sum(counts[b] * dist.node_hops(p, b) for b in used if b != p)
        return -(reach + 2 * counts[p] - short - 1), order[p]

    partial = min((p for p in used if counts[p] > short), key=saving)
    return {leaf: counts[leaf] - (short if leaf == partial else 0) for leaf in used}


def fewest_switches(tree: SwitchTree, n: int, usable_nodes: Collection[str]) -> int:
    """The fewest leaf switches that can hold ``n`` of ``usable_nodes``: K for ``--switches=K``.

    0 means "no constraint": the tree is empty, or the usable nodes cannot hold ``n`` at all
    (Slurm will hold the job until nodes return; guessing a K then would only mislead).
    """
    usable = set(usable_nodes)
    counts = [sum(1 for x in tree.switches[leaf].nodes if x in usable) for leaf in tree.leaves]
    return _min_leaves((c for c in counts if c), n) or 0


def capped_max_wait_min(max_wait_min: int, max_switch_wait_s: int) -> tuple[int, str | None]:
    """The ``--switches`` wait Slurm will honour, and a warning when that is less than asked.

    Slurm silently caps the wait at ``SchedulerParameters=max_switch_wait``; asking for the cap
    itself keeps the submitted request and what happens the same.
    """
    cap_min = max_switch_wait_s // 60
    if max_wait_min <= cap_min:
        return max_wait_min, None
    return cap_min, (
        f"topology.max_wait_min={max_wait_min} is more than this cluster allows "
        f"(SchedulerParameters=max_switch_wait={max_switch_wait_s} s): multi-node trials wait at most "
        f"{cap_min} min for their fewest leaf switches, then start on more"
    )


def check_topology_keys(mode: str, max_wait_min: int) -> None:
    """Raise ``ValueError`` naming the key when ``topology.mode`` or ``topology.max_wait_min`` is not allowed."""
    if mode not in TOPOLOGY_MODES:
        raise ValueError(f"topology.mode: unknown mode {mode!r}; allowed: {', '.join(TOPOLOGY_MODES)}")
    if max_wait_min < 0:
        raise ValueError(f"topology.max_wait_min: must be >= 0, got {max_wait_min}")


def _candidates(
    node_states: Sequence[NodeState], exclude: Collection[str], partition: str | None
) -> list[NodeState]:
    """Nodes Slurm may give the trial: usable, not excluded, in ``partition`` (any when ``None``)."""
    excluded = set(exclude)
    return [
        s
        for s in node_states
        if s.is_usable and s.name not in excluded and (partition is None or partition in s.partitions)
    ]


def pin_nodes(
    tree: SwitchTree,
    node_states: Sequence[NodeState],
    nodes: int,
    *,
    exclude: Collection[str] = (),
    partition: str | None = None,
    taken: Collection[str] = (),
) -> Placement | None:
    """The nodes a ``pin``-mode trial is given: :func:`choose_nodes` among the free usable nodes
    of ``partition`` that are neither excluded nor ``taken`` by earlier trials of the sweep.

    ``None`` when no such placement is as tight as ``--switches`` would ask for (the fewest leaf
    switches that hold ``nodes`` of the usable nodes): pinning to scattered leftovers would start
    the trial sooner but on a worse placement than the fallback waits for.
    """
    candidates = _candidates(node_states, exclude, partition)
    unavailable = set(taken)
    placement = choose_nodes(tree, [s.name for s in candidates if s.is_free and s.name not in unavailable], nodes)
    if placement is None or len(placement.leaves) > fewest_switches(tree, nodes, [s.name for s in candidates]):
        return None
    return placement


def topology_sbatch_options(
    mode: str,
    nodes: int,
    tree: SwitchTree,
    node_states: Sequence[NodeState],
    *,
    max_wait_min: int,
    exclude: Collection[str] = (),
    partition: str | None = None,
) -> dict[str, str]:
    """Extra sbatch options (long names without ``--``) that place one ``nodes``-node trial.

    ``switches``: ``{"switches": "K@HH:MM:SS"}`` with K from :func:`fewest_switches`, plus
    ``exclude`` when nodes are excluded. ``pin``: ``{"nodelist": ...}`` from :func:`pin_nodes`;
    when it finds none, the ``switches`` options. ``off``, a single node, or a cluster without a
    topology give ``{}``. ``max_wait_min`` is ``topology.max_wait_min`` after
    :func:`capped_max_wait_min`: Slurm caps the wait at ``SchedulerParameters=max_switch_wait``,
    and the request should say what happens. A sweep places its trials together with
    :func:`hpcsweep.slurm.sweep_placement.sweep_placements`, so that pinned trials do not share nodes.
    """
    check_topology_keys(mode, max_wait_min)
    if mode == "off" or nodes <= 1 or tree.is_empty:
        return {}
    if mode == "pin":
        placement = pin_nodes(tree, node_states, nodes, exclude=exclude, partition=partition)
        if placement is not None:
            return {"nodelist": placement.nodelist}
    options: dict[str, str] = {}
    k = fewest_switches(tree, nodes, [s.name for s in _candidates(node_states, exclude, partition)])
    if k:
        hours, minutes = divmod(max_wait_min, 60)
        options["switches"] = f"{k}@{hours:02d}:{minutes:02d}:00"
    if exclude:
        options["exclude"] = ",".join(sorted(set(exclude)))
    return options
