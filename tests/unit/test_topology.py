"""Tests for hpcsweep.slurm.topology: literal scontrol output, brute-force optimality, no Slurm needed."""

import itertools
import random
from pathlib import Path

import pytest
import yaml

from hpcsweep import topology as topology_cli
from hpcsweep.config import TopologyConfig
from hpcsweep.slurm import commands
from hpcsweep.slurm.cluster_info import parse_fields, parse_max_switch_wait
from hpcsweep.slurm.nodes import NodeState, parse_node_states
from hpcsweep.slurm.sweep_placement import PlacementRequest, sweep_placements
from hpcsweep.slurm.topology import (
    capped_max_wait_min,
    choose_nodes,
    fewest_switches,
    parse_topology,
    topology_sbatch_options,
)
from hpcsweep.topology import describe

# Captured from the local test cluster (scripts/slurm-cluster up, Slurm 22.05.8).
LOCAL_TOPOLOGY = """\
SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=node[1-2]
SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=node[3-4]
SwitchName=spine Level=1 LinkSpeed=1 Nodes=node[1-4] Switches=leaf[1-2]
"""

LOCAL_NODES = """\
NodeName=node1 Arch=x86_64 CoresPerSocket=8  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.56 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:8 NodeAddr=127.0.0.1 NodeHostName=vm Port=26821 Version=22.05.8 OS=Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=16000 AllocMem=0 FreeMem=22844 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=batch,urgent  BootTime=2026-11-29T14:15:33 SlurmdStartTime=2026-11-29T14:22:52 LastBusyTime=2026-11-29T14:24:22 CfgTRES=cpu=8,mem=16000M,billing=8,gres/gpu=8 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=node2 Arch=x86_64 CoresPerSocket=8  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.56 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:8 NodeAddr=127.0.0.1 NodeHostName=vm Port=26822 Version=22.05.8 OS=Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=16000 AllocMem=0 FreeMem=22844 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=batch,urgent  BootTime=2026-11-29T14:15:32 SlurmdStartTime=2026-11-29T14:22:52 LastBusyTime=2026-11-29T14:24:22 CfgTRES=cpu=8,mem=16000M,billing=8,gres/gpu=8 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=node3 Arch=x86_64 CoresPerSocket=8  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.54 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:8 NodeAddr=127.0.0.1 NodeHostName=vm Port=26823 Version=22.05.8 OS=Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=16000 AllocMem=0 FreeMem=22809 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=batch,urgent  BootTime=2026-11-29T14:15:32 SlurmdStartTime=2026-11-29T14:22:52 LastBusyTime=2026-11-29T14:22:52 CfgTRES=cpu=8,mem=16000M,billing=8,gres/gpu=8 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=node4 Arch=x86_64 CoresPerSocket=8  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.54 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:8 NodeAddr=127.0.0.1 NodeHostName=vm Port=26824 Version=22.05.8 OS=Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=16000 AllocMem=0 FreeMem=22809 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=batch,urgent  BootTime=2026-11-29T14:15:32 SlurmdStartTime=2026-11-29T14:22:52 LastBusyTime=2026-11-29T14:23:40 CfgTRES=cpu=8,mem=16000M,billing=8,gres/gpu=8 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
"""

# A three-level tree written by hand: two aggregation switches, three leaves, one drained node.
HAND_TOPOLOGY = """\
SwitchName=s0 Level=0 LinkSpeed=1 Nodes=gpu-a[01-04]
SwitchName=s1 Level=0 LinkSpeed=1 Nodes=gpu-a[05-08]
SwitchName=s2 Level=0 LinkSpeed=1 Nodes=gpu-b[01-04]
SwitchName=agg0 Level=1 LinkSpeed=1 Nodes=gpu-a[01-08] Switches=s[0-1]
SwitchName=agg1 Level=1 LinkSpeed=1 Nodes=gpu-b[01-04] Switches=s2
SwitchName=core Level=2 LinkSpeed=1 Nodes=gpu-a[01-08],gpu-b[01-04] Switches=agg[0-1]
"""


def fat_tree_text(aggs: int = 8, leaves_per_agg: int = 8, nodes_per_leaf: int = 16) -> str:
    """``scontrol show topology`` of a three-level fat tree; the default is 64 leaves x 16 = 1,024 nodes."""
    lines = []
    n_leaves = aggs * leaves_per_agg
    for leaf in range(n_leaves):
        first = leaf * nodes_per_leaf + 1
        lines.append(
            f"SwitchName=leaf{leaf:02d} Level=0 LinkSpeed=1 "
            f"Nodes=n[{first:04d}-{first + nodes_per_leaf - 1:04d}]"
        )
    for agg in range(aggs):
        lo = agg * leaves_per_agg
        lines.append(
            f"SwitchName=agg{agg} Level=1 LinkSpeed=1 Switches=leaf[{lo:02d}-{lo + leaves_per_agg - 1:02d}]"
        )
    lines.append(f"SwitchName=spine Level=2 LinkSpeed=1 Switches=agg[0-{aggs - 1}]")
    return "\n".join(lines) + "\n"


FAT_TREE_TEXT = fat_tree_text()


def node_line(name: str, state: str = "IDLE", partitions: str = "batch", cpu_alloc: int = 0, gpus: int = 0) -> str:
    """One ``scontrol show nodes --oneliner`` line in the local cluster's format."""
    alloc = f"cpu={cpu_alloc},gres/gpu={gpus}" if cpu_alloc or gpus else ""
    return (
        f"NodeName={name} Arch=x86_64 CoresPerSocket=8  CPUAlloc={cpu_alloc} CPUEfctv=8 CPUTot=8 "
        f"Gres=gpu:a100:8 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC  State={state} ThreadsPerCore=1 "
        f"Partitions={partitions}  CfgTRES=cpu=8,mem=16000M,billing=8,gres/gpu=8 AllocTRES={alloc} "
        f"Reason=Not responding [slurm@2024-01-01T00:00:00] CapWatts=n/a"
    )


# -- parsing ---------------------------------------------------------------------------------


def test_parse_local_cluster_topology():
    tree = parse_topology(LOCAL_TOPOLOGY)
    assert tree.leaves == ("leaf1", "leaf2")
    assert tree.switches["leaf1"].nodes == ("node1", "node2")
    assert tree.switches["spine"].children == ("leaf1", "leaf2")
    assert tree.switches["spine"].level == 1
    assert tree.parent == {"leaf1": "spine", "leaf2": "spine"}
    assert tree.leaf_of["node4"] == "leaf2"


def test_parse_local_cluster_nodes():
    states = parse_node_states(LOCAL_NODES)
    assert [s.name for s in states] == ["node1", "node2", "node3", "node4"]
    node1 = states[0]
    assert (node1.state, node1.flags, node1.partitions) == ("IDLE", frozenset(), ("batch", "urgent"))
    assert (node1.cpus_total, node1.cpus_alloc, node1.gpus_total, node1.gpus_alloc) == (8, 0, 8, 0)
    assert node1.is_usable and node1.is_free and node1.free_gpus == 8


def test_fields_with_spaces_in_values():
    fields = parse_fields(node_line("x", "DOWN*"))
    assert fields["OS"] == "Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC"
    assert fields["AllocTRES"] == ""
    assert fields["Reason"] == "Not responding [slurm@2024-01-01T00:00:00]"


@pytest.mark.parametrize(
    "state, base, usable, free",
    [
        ("IDLE", "IDLE", True, True),
        ("IDLE+DRAIN", "IDLE", False, False),
        ("MIXED", "MIXED", True, False),
        ("ALLOCATED", "ALLOCATED", True, False),
        ("MIXED+DRAIN", "MIXED", False, False),
        ("DOWN*", "DOWN", False, False),
        ("IDLE*", "IDLE", False, False),
        ("DOWN+DRAIN+NOT_RESPONDING", "DOWN", False, False),
        ("IDLE+COMPLETING", "IDLE", True, False),
        ("IDLE+MAINT+RESERVED", "IDLE", False, False),
    ],
)
def test_node_states(state, base, usable, free):
    (node,) = parse_node_states(node_line("x", state))
    assert (node.state, node.is_usable, node.is_free) == (base, usable, free)


def test_allocated_gpus_and_gres_fallback():
    (mixed,) = parse_node_states(node_line("x", "MIXED", cpu_alloc=2, gpus=3))
    assert (mixed.gpus_alloc, mixed.free_gpus, mixed.cpus_alloc) == (3, 5, 2)
    (bare,) = parse_node_states("NodeName=y CPUAlloc=0 CPUTot=4 Gres=gpu:a100:4(S:0-1),gpu:v100:2 State=IDLE")
    assert bare.gpus_total == 6


def test_parse_hand_written_three_levels():
    tree = parse_topology(HAND_TOPOLOGY)
    assert tree.leaves == ("s0", "s1", "s2")
    assert tree.ancestors("s1") == ["s1", "agg0", "core"]
    assert tree.leaves_under("agg0") == ["s0", "s1"]
    assert tree.switches["s0"].nodes[0] == "gpu-a01"


def test_parse_fat_tree():
    tree = parse_topology(FAT_TREE_TEXT)
    assert len(tree.leaves) == 64
    assert len(tree.leaf_of) == 1024
    assert tree.ancestors("leaf63") == ["leaf63", "agg7", "spine"]


@pytest.mark.parametrize(
    "text",
    ["", "Topology plugin may not be configured\n", "No topology information available\n"],
)
def test_no_topology_means_no_constraint(text):
    tree = parse_topology(text)
    assert tree.is_empty
    assert choose_nodes(tree, ["node1", "node2"], 2) is None
    assert fewest_switches(tree, 2, ["node1", "node2"]) == 0
    states = parse_node_states(LOCAL_NODES)
    for mode in ("switches", "pin", "off"):
        assert topology_sbatch_options(mode, 2, tree, states, max_wait_min=5) == {}


# -- choosing nodes --------------------------------------------------------------------------


def test_choose_on_local_cluster():
    tree = parse_topology(LOCAL_TOPOLOGY)
    assert choose_nodes(tree, ["node1", "node3", "node4"], 2).nodes == ("node3", "node4")
    three = choose_nodes(tree, ["node1", "node2", "node3", "node4"], 3)
    assert (three.leaves, three.lca, three.hops) == (("leaf1", "leaf2"), "spine", 10)
    assert choose_nodes(tree, ["node1"], 2) is None


def test_best_fit_keeps_big_holes_whole():
    tree = parse_topology(HAND_TOPOLOGY)
    free = ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a05", "gpu-a06", "gpu-b01", "gpu-b02"]
    assert choose_nodes(tree, free, 2).nodes == ("gpu-a05", "gpu-a06")  # not the 3-node hole on s0


def test_lowest_common_switch_beats_more_free_nodes_elsewhere():
    tree = parse_topology(HAND_TOPOLOGY)
    # s0 and s1 (under agg0) hold 2+2; s2 under agg1 holds 3. Four nodes need two leaves either
    # way, and staying under agg0 keeps traffic below the core switch.
    free = ["gpu-a01", "gpu-a02", "gpu-a05", "gpu-a06", "gpu-b01", "gpu-b02", "gpu-b03"]
    placement = choose_nodes(tree, free, 4)
    assert placement.lca == "agg0"
    assert placement.nodes == ("gpu-a01", "gpu-a02", "gpu-a05", "gpu-a06")


def tree_key(tree, nodes):
    """Criteria of the module docstring, computed independently of choose_nodes."""
    leaves = sorted({tree.leaf_of[x] for x in nodes}, key=tree.leaves.index)
    chains = [tree.ancestors(leaf) for leaf in leaves]
    common = [s for s in chains[0] if all(s in chain for chain in chains)]
    lca_level = tree.switches[common[0]].level

    def hops(a, b):
        la, lb = tree.leaf_of[a], tree.leaf_of[b]
        ca, cb = tree.ancestors(la), tree.ancestors(lb)
        meet = next(s for s in ca if s in cb)
        return 2 + ca.index(meet) + cb.index(meet)

    total = sum(hops(a, b) for a, b in itertools.combinations(nodes, 2))
    return len(leaves), lca_level, total


def brute_force(tree, free, n):
    best = None
    for combo in itertools.combinations(sorted(free), n):
        leaves = {tree.leaf_of[x] for x in combo}
        leftover = sum(1 for x in free if tree.leaf_of[x] in leaves) - n
        key = (*tree_key(tree, combo), leftover)
        best = key if best is None or key < best else best
    return best


TWO_LEVEL = "\n".join(
    [f"SwitchName=l{i} Level=0 LinkSpeed=1 Nodes=h{i}[1-3]" for i in range(3)]
    + ["SwitchName=top Level=1 LinkSpeed=1 Switches=l[0-2]"]
)


@pytest.mark.parametrize("seed", range(8))
def test_optimal_against_brute_force_two_levels(seed):
    tree = parse_topology(TWO_LEVEL)
    rng = random.Random(seed)
    all_nodes = sorted(tree.leaf_of)
    for _ in range(12):
        free = rng.sample(all_nodes, rng.randint(1, len(all_nodes)))
        for n in range(1, len(free) + 1):
            placement = choose_nodes(tree, free, n)
            assert set(placement.nodes) <= set(free) and len(placement.nodes) == n
            got = (*tree_key(tree, placement.nodes), placement.leftover)
            assert got == brute_force(tree, free, n), (free, n, placement)
            assert got[2] == placement.hops


THREE_LEVEL = "\n".join(
    [f"SwitchName=l{i} Level=0 LinkSpeed=1 Nodes=h{i}[1-3]" for i in range(4)]
    + [
        "SwitchName=a0 Level=1 LinkSpeed=1 Switches=l[0-1]",
        "SwitchName=a1 Level=1 LinkSpeed=1 Switches=l[2-3]",
        "SwitchName=top Level=2 LinkSpeed=1 Switches=a[0-1]",
    ]
)


@pytest.mark.parametrize("seed", range(6))
def test_leaves_and_level_optimal_against_brute_force_three_levels(seed):
    tree = parse_topology(THREE_LEVEL)
    rng = random.Random(100 + seed)
    all_nodes = sorted(tree.leaf_of)
    for _ in range(6):
        free = rng.sample(all_nodes, rng.randint(1, 9))
        for n in range(1, len(free) + 1):
            placement = choose_nodes(tree, free, n)
            got = tree_key(tree, placement.nodes)
            assert got[:2] == brute_force(tree, free, n)[:2], (free, n, placement)
            assert got[2] == placement.hops


def test_fat_tree_fragmented():
    tree = parse_topology(FAT_TREE_TEXT)
    rng = random.Random(7)
    free = [x for x in tree.leaf_of if rng.random() < 0.4]
    placement = choose_nodes(tree, free, 40)
    counts = sorted((sum(tree.leaf_of[x] == leaf for x in free) for leaf in tree.leaves), reverse=True)
    fewest = next(k for k in range(1, 65) if sum(counts[:k]) >= 40)
    assert len(placement.leaves) == fewest
    assert len(set(placement.nodes)) == 40 and set(placement.nodes) <= set(free)


def test_choose_is_deterministic():
    tree = parse_topology(FAT_TREE_TEXT)
    free = sorted(tree.leaf_of)[::3]
    assert choose_nodes(tree, free, 20) == choose_nodes(tree, list(reversed(free)), 20)


# -- sbatch options --------------------------------------------------------------------------


def states_for(spec: dict[str, str], partitions: str = "batch") -> list[NodeState]:
    return parse_node_states("\n".join(node_line(name, state, partitions) for name, state in spec.items()))


def test_switches_mode():
    tree = parse_topology(LOCAL_TOPOLOGY)
    states = parse_node_states(LOCAL_NODES)
    assert topology_sbatch_options("switches", 2, tree, states, max_wait_min=10) == {"switches": "1@00:10:00"}
    assert topology_sbatch_options("switches", 3, tree, states, max_wait_min=90) == {"switches": "2@01:30:00"}
    assert topology_sbatch_options("switches", 1, tree, states, max_wait_min=5) == {}
    assert topology_sbatch_options("off", 4, tree, states, max_wait_min=5) == {}


def test_switches_mode_counts_only_usable_nodes_and_passes_exclude():
    tree = parse_topology(LOCAL_TOPOLOGY)
    states = states_for({"node1": "IDLE", "node2": "IDLE+DRAIN", "node3": "ALLOCATED", "node4": "MIXED"})
    opts = topology_sbatch_options("switches", 2, tree, states, exclude=["node4"], max_wait_min=5)
    assert opts == {"switches": "2@00:05:00", "exclude": "node4"}


def test_pin_mode_never_picks_drained_down_or_excluded():
    tree = parse_topology(LOCAL_TOPOLOGY)
    states = states_for({"node1": "IDLE+DRAIN", "node2": "DOWN*", "node3": "IDLE", "node4": "IDLE"})
    assert topology_sbatch_options("pin", 2, tree, states, max_wait_min=5) == {"nodelist": "node3,node4"}
    states = states_for({"node1": "IDLE", "node2": "IDLE", "node3": "ALLOCATED", "node4": "MIXED"})
    assert topology_sbatch_options("pin", 2, tree, states, max_wait_min=10, exclude=["node1"]) == {
        "switches": "1@00:10:00",
        "exclude": "node1",
    }  # too few free nodes to pin: fall back to the switch constraint


def test_pin_mode_respects_partition():
    tree = parse_topology(LOCAL_TOPOLOGY)
    states = parse_node_states(LOCAL_NODES.replace("Partitions=batch,urgent", "Partitions=batch", 2))
    assert topology_sbatch_options("pin", 2, tree, states, max_wait_min=5, partition="urgent") == {
        "nodelist": "node3,node4"
    }


def test_pin_mode_never_pins_more_leaves_than_switches_would_ask_for():
    tree = parse_topology(TWO_LEVEL)
    # One free node on each leaf: two of them would start now, but across leaves, where
    # --switches=1 waits for a whole leaf.
    states = states_for({f"h{i}{j}": "IDLE" if j == 1 else "ALLOCATED" for i in range(3) for j in range(1, 4)})
    assert topology_sbatch_options("pin", 2, tree, states, max_wait_min=5) == {"switches": "1@00:05:00"}
    # Four nodes need two leaves anyway: pinning to two leaves is as tight as it gets.
    assert topology_sbatch_options("pin", 4, tree, states_for(dict.fromkeys(tree.leaf_of, "IDLE")), max_wait_min=5) == {
        "nodelist": "h01,h02,h03,h11"
    }


def test_bad_mode_names_key_and_allowed_values():
    with pytest.raises(ValueError, match=r"topology\.mode.*switches, pin, off"):
        topology_sbatch_options("spread", 2, parse_topology(LOCAL_TOPOLOGY), [], max_wait_min=5)


def test_describe_local_cluster():
    text = describe(parse_topology(LOCAL_TOPOLOGY), parse_node_states(LOCAL_NODES), 3, None, max_wait_min=5)
    assert "leaf1 (level 0)  free: node1,node2  busy: -  unusable: -" in text
    assert "placement for 3 node(s): node1,node2,node3" in text
    assert "--switches=2@00:05:00" in text


def test_preview_shows_how_a_pin_sweep_spreads(monkeypatch, capsys):
    fake_cluster(monkeypatch, "SchedulerParameters     = (null)\n")
    assert topology_cli.main(["--nodes", "2", "--trials", "3"]) == 0
    out = capsys.readouterr().out
    assert "sbatch options (mode=pin, 3 trial(s)):\n  trial 0: --nodelist=node1,node2\n" in out
    assert "  trial 1: --nodelist=node3,node4\n  trial 2: --switches=1@00:05:00\n" in out
    assert "  topology.mode=pin: 2 trial(s) got free nodes of their own" in out
    with pytest.raises(SystemExit):
        topology_cli.main(["--trials", "0"])
    assert "--trials: must be >= 1, got 0" in capsys.readouterr().err


def test_max_switch_wait_from_scheduler_parameters():
    assert parse_max_switch_wait("SchedulerParameters     = bf_continue,max_switch_wait=900,sched_interval=2\n") == 900
    assert parse_max_switch_wait("SchedulerParameters     = (null)\nMaxArraySize = 1001\n") == 300
    assert parse_max_switch_wait("MaxArraySize = 1001\n") == 300


def test_a_wait_beyond_max_switch_wait_is_capped_with_a_warning_naming_both():
    assert capped_max_wait_min(5, 300) == (5, None)
    minutes, warning = capped_max_wait_min(30, 300)
    assert minutes == 5
    assert "topology.max_wait_min=30" in warning and "max_switch_wait=300 s" in warning and "at most 5 min" in warning


def fake_cluster(monkeypatch, config_text: str) -> None:
    """The three scontrol reads the preview makes, answered with captured text."""
    monkeypatch.setattr(commands, "show_topology", lambda: LOCAL_TOPOLOGY)
    monkeypatch.setattr(commands, "show_nodes", lambda: LOCAL_NODES)
    monkeypatch.setattr(commands, "show_config", lambda: config_text)


def test_preview_submits_the_sweeps_default_wait(monkeypatch, capsys):
    fake_cluster(monkeypatch, "SchedulerParameters     = (null)\n")
    assert topology_cli.main(["--nodes", "2"]) == 0
    assert "sbatch options (mode=switches): --switches=1@00:05:00" in capsys.readouterr().out


def test_preview_caps_the_wait_as_the_sweep_does(monkeypatch, capsys):
    fake_cluster(monkeypatch, "SchedulerParameters     = max_switch_wait=120\n")
    assert topology_cli.main(["--nodes", "2"]) == 0
    out, err = capsys.readouterr()
    assert "--switches=1@00:02:00" in out
    assert err.startswith("warning: topology.max_wait_min=5 is more than this cluster allows")
    assert topology_cli.main(["--nodes", "2", "--max-wait-min", "1"]) == 0
    assert "--switches=1@00:01:00" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        topology_cli.main(["--max-wait-min", "-1"])
    assert "topology.max_wait_min=-1 is not allowed" in capsys.readouterr().err


def test_the_config_file_and_the_dataclass_agree_on_the_wait():
    # The dataclass holds the default, and the preset file leaves it there (test_config_presets.py).
    from hpcsweep.config import config_defaults

    default_yaml = Path(__file__).parents[2] / "configs" / "topology" / "default.yaml"
    assert "max_wait_min" not in (yaml.safe_load(default_yaml.read_text()) or {})
    assert config_defaults()["topology"]["max_wait_min"] == TopologyConfig().max_wait_min == 5


# -- a sweep's placements ------------------------------------------------------------------


def pin_requests(count: int, nodes: int = 2, max_wait_min: int = 5, **kwargs) -> list[PlacementRequest]:
    return [
        PlacementRequest(trial=i, mode="pin", nodes=nodes, max_wait_min=max_wait_min, **kwargs) for i in range(count)
    ]


def test_pinned_trials_of_a_sweep_get_disjoint_leaves_then_fall_back_with_one_message():
    tree = parse_topology(LOCAL_TOPOLOGY)
    options, messages = sweep_placements(pin_requests(4), tree, parse_node_states(LOCAL_NODES))
    assert options == {
        0: {"nodelist": "node1,node2"},
        1: {"nodelist": "node3,node4"},
        2: {"switches": "1@00:05:00"},
        3: {"switches": "1@00:05:00"},
    }
    (message,) = messages
    assert message.startswith("topology.mode=pin: 2 trial(s) got free nodes of their own")
    assert "the other 2 (trial(s) 2, 3)" in message and "fall back to topology.mode=switches" in message


def test_no_message_while_free_nodes_last():
    tree = parse_topology(LOCAL_TOPOLOGY)
    options, messages = sweep_placements(pin_requests(2), tree, parse_node_states(LOCAL_NODES))
    assert (options, messages) == ({0: {"nodelist": "node1,node2"}, 1: {"nodelist": "node3,node4"}}, [])


def test_each_pinned_trial_stays_under_one_leaf_best_fit_first():
    tree = parse_topology(TWO_LEVEL)  # three leaves of three nodes
    states = states_for(dict.fromkeys(tree.leaf_of, "IDLE"))
    options, messages = sweep_placements(pin_requests(4), tree, states)
    assert [options[i] for i in range(3)] == [
        {"nodelist": "h01,h02"},
        {"nodelist": "h11,h12"},
        {"nodelist": "h21,h22"},
    ]
    # One node is left on each leaf: three of them, but no two under one leaf.
    assert options[3] == {"switches": "1@00:05:00"}
    assert "the other 1 (trial(s) 3)" in messages[0]


def test_best_fit_fills_a_partly_busy_leaf_before_an_idle_one():
    tree = parse_topology(TWO_LEVEL)
    states = states_for({**dict.fromkeys(tree.leaf_of, "IDLE"), "h01": "MIXED"})
    options, _ = sweep_placements(pin_requests(2), tree, states)
    assert options == {0: {"nodelist": "h02,h03"}, 1: {"nodelist": "h11,h12"}}


def test_pinned_trials_honour_exclude_and_partition():
    tree = parse_topology(LOCAL_TOPOLOGY)
    states = parse_node_states(LOCAL_NODES)
    requests = [
        PlacementRequest(trial=0, mode="pin", nodes=2, max_wait_min=5, exclude=("node1",)),
        PlacementRequest(trial=1, mode="pin", nodes=2, max_wait_min=5),
    ]
    options, _ = sweep_placements(requests, tree, states)
    assert options == {0: {"nodelist": "node3,node4"}, 1: {"nodelist": "node1,node2"}}
    # node1 is not in "urgent": leaf1 cannot hold a trial of that partition.
    states = parse_node_states(LOCAL_NODES.replace("Partitions=batch,urgent", "Partitions=batch", 1))
    options, messages = sweep_placements(pin_requests(2), tree, states, partition="urgent")
    assert options == {0: {"nodelist": "node3,node4"}, 1: {"switches": "1@00:05:00"}}
    assert "the other 1 (trial(s) 1)" in messages[0]


def test_other_modes_and_single_nodes_are_placed_as_before_and_take_no_nodes():
    tree = parse_topology(LOCAL_TOPOLOGY)
    states = parse_node_states(LOCAL_NODES)
    requests = [
        PlacementRequest(trial=0, mode="switches", nodes=2, max_wait_min=10, exclude=("node4",)),
        PlacementRequest(trial=1, mode="off", nodes=2, max_wait_min=5),
        PlacementRequest(trial=2, mode="pin", nodes=1, max_wait_min=5),
        PlacementRequest(trial=3, mode="pin", nodes=2, max_wait_min=5),
        PlacementRequest(trial=4, mode="pin", nodes=2, max_wait_min=5),
    ]
    options, messages = sweep_placements(requests, tree, states)
    for request in requests[:3]:
        assert options[request.trial] == topology_sbatch_options(
            request.mode, request.nodes, tree, states, max_wait_min=request.max_wait_min, exclude=request.exclude
        )
    assert options[3] == {"nodelist": "node1,node2"} and options[4] == {"nodelist": "node3,node4"}
    assert messages == []


def test_one_request_is_placed_as_topology_sbatch_options_places_it():
    tree = parse_topology(TWO_LEVEL)
    rng = random.Random(3)
    kinds = ["IDLE", "MIXED", "ALLOCATED", "IDLE+DRAIN"]
    for _ in range(40):
        states = states_for({x: rng.choice(kinds) for x in tree.leaf_of})
        for nodes in range(1, 6):
            (request,) = pin_requests(1, nodes=nodes)
            options, _ = sweep_placements([request], tree, states)
            assert options[0] == topology_sbatch_options("pin", nodes, tree, states, max_wait_min=5)


def test_a_fat_tree_gives_every_trial_its_own_leaf_until_none_is_left():
    tree = parse_topology(FAT_TREE_TEXT)
    states = parse_node_states("\n".join(node_line(x) for x in sorted(tree.leaf_of)))
    options, messages = sweep_placements(pin_requests(70, nodes=16), tree, states)
    nodelists = [options[i]["nodelist"].split(",") for i in range(64)]
    assert len({x for nodes in nodelists for x in nodes}) == 64 * 16
    assert all(len({tree.leaf_of[x] for x in nodes}) == 1 for nodes in nodelists)
    assert all(options[i] == {"switches": "1@00:05:00"} for i in range(64, 70))
    assert "the other 6 (trial(s) 64, 65, 66, 67, 68, 69)" in messages[0]


def test_a_long_fallback_names_a_few_trials_and_the_count():
    tree = parse_topology(LOCAL_TOPOLOGY)
    _, (message,) = sweep_placements(pin_requests(14), tree, parse_node_states(LOCAL_NODES))
    assert "the other 12 (trial(s) 2, 3, 4, 5, 6, 7, 8, ... 13 (12 in all))" in message


@pytest.mark.parametrize("text", ["", "Topology plugin may not be configured\n"])
def test_a_sweep_without_a_topology_is_unconstrained(text):
    options, messages = sweep_placements(pin_requests(3), parse_topology(text), parse_node_states(LOCAL_NODES))
    assert (options, messages) == ({0: {}, 1: {}, 2: {}}, [])


def test_a_bad_request_names_the_key():
    tree = parse_topology(LOCAL_TOPOLOGY)
    with pytest.raises(ValueError, match=r"topology\.mode.*allowed: switches, pin, off"):
        sweep_placements([PlacementRequest(trial=0, mode="spread", nodes=2, max_wait_min=5)], tree, [])
    with pytest.raises(ValueError, match=r"topology\.max_wait_min"):
        sweep_placements(pin_requests(1, max_wait_min=-1), tree, parse_node_states(LOCAL_NODES))
