"""The pure parts of ``scripts/slurm-cluster`` that find the cluster's processes in /proc.

The script is a standalone file without a ``.py`` suffix (it runs before the project is installed),
so it is loaded by path. ``tests/cluster/test_cluster_down.py`` covers the same code on real daemons.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-cluster"


def load_script():
    loader = importlib.machinery.SourceFileLoader("slurm_cluster_script", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    # dataclasses look their module up in sys.modules while the module runs.
    sys.modules[loader.name] = module
    loader.exec_module(module)
    return module


sc = load_script()
LAY = sc.Layout(Path("/tmp/hpcsweep-cluster"))
CONF = str(LAY.slurm_conf)
OTHER_CONF = "/tmp/other-cluster/etc/slurm.conf"


def stat_line(pid: int, comm: str, state: str = "S", ppid: int = 1, start: int = 1000) -> str:
    # Fields 3..22 of /proc/PID/stat; only state (3), ppid (4) and starttime (22) are read.
    fields = [state, str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 30
    return f"{pid} ({comm}) {' '.join(fields)}\n"


def test_parse_proc_stat_takes_the_name_up_to_the_last_parenthesis():
    parsed = sc.parse_proc_stat(stat_line(42, "odd) (name", state="Z", ppid=7, start=123456))
    assert parsed == sc.ProcStat(comm="odd) (name", state="Z", ppid=7, start_time=123456)


def test_parse_environ_splits_on_nul_and_the_first_equals_sign():
    raw = b"SLURM_CONF=/a/b\0OPTS=x=y\0EMPTY=\0"
    assert sc.parse_environ(raw) == {"SLURM_CONF": "/a/b", "OPTS": "x=y", "EMPTY": ""}


@pytest.mark.parametrize(
    ("comm", "argv", "environ", "expected"),
    [
        ("slurmd", ["/usr/sbin/slurmd", "-N", "node3", "-f", CONF], {}, "slurmd node3"),
        # A system slurmd started from a shell that had eval'd our env: -f wins, as in Slurm.
        ("slurmd", ["/usr/sbin/slurmd", "-f", "/etc/slurm/slurm.conf"], {"SLURM_CONF": CONF}, None),
        ("slurmd", ["/usr/sbin/slurmd"], {}, None),
        ("slurmd", ["/usr/sbin/slurmd", "-N", "node1", "-f", OTHER_CONF], {}, None),
        ("slurmctld", ["/usr/sbin/slurmctld", "-f", CONF], {}, "slurmctld"),
        ("slurmctld", ["/usr/sbin/slurmctld"], {"SLURM_CONF": OTHER_CONF}, None),
        ("slurmscriptd", ["slurmctld: slurmscriptd"], {"SLURM_CONF": CONF}, "slurmctld slurmscriptd"),
        ("slurmdbd", ["/usr/sbin/slurmdbd"], {"SLURM_CONF": CONF}, "slurmdbd"),
        ("slurmdbd", ["/usr/sbin/slurmdbd"], {}, None),
        ("slurmstepd", ["slurmstepd: [12.0]"], {"SLURM_CONF": CONF}, "slurmstepd [12.0]"),
        ("slurmstepd", ["slurmstepd: [12.batch]"], {"SLURM_CONF": OTHER_CONF}, None),
        # Not root: the environment cannot be read, so the step cannot be claimed.
        ("slurmstepd", ["slurmstepd: [12.0]"], None, None),
        ("munged", ["/usr/sbin/munged", "--force", f"--socket={LAY.munge_socket}"], {}, "munged"),
        # The system munged, even with our SLURM_CONF in its environment.
        ("munged", ["/usr/sbin/munged"], {"SLURM_CONF": CONF}, None),
        ("mariadbd", ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={LAY.db}"], {}, "mariadb"),
        ("mariadbd", ["/usr/sbin/mariadbd", "--datadir=/var/lib/mysql"], {}, None),
        # A user's shell or test run with our SLURM_CONF exported is never the cluster's.
        ("python3", ["python3", "-m", "pytest"], {"SLURM_CONF": CONF}, None),
    ],
)
def test_cluster_process_name_claims_only_this_clusters_processes(comm, argv, environ, expected):
    assert sc.cluster_process_name(comm, argv, environ, LAY) == expected


def test_descendants_walks_the_whole_tree_below_the_roots():
    parents = {10: 1, 11: 10, 12: 11, 13: 11, 20: 1, 21: 20}
    assert sc.descendants(parents, {10}) == {11, 12, 13}
    assert sc.descendants(parents, {10, 20}) == {11, 12, 13, 21}
    assert sc.descendants(parents, {99}) == set()


def fake_proc(root: Path, pid: int, comm: str, argv: list[str], environ: dict[str, str],
              state: str = "S", ppid: int = 1, start: int = 1000) -> None:
    folder = root / str(pid)
    folder.mkdir()
    (folder / "stat").write_text(stat_line(pid, comm, state, ppid, start))
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A /proc with this cluster's daemons and a job step, a zombie, and another cluster's slurmd."""
    ours = {"SLURM_CONF": CONF}
    fake_proc(tmp_path, 100, "munged", ["/usr/sbin/munged", f"--socket={LAY.munge_socket}"], ours)
    fake_proc(tmp_path, 200, "slurmd", ["/usr/sbin/slurmd", "-N", "node2", "-f", CONF], ours)
    fake_proc(tmp_path, 201, "slurmd", ["/usr/sbin/slurmd", "-N", "node1", "-f", CONF], ours)
    fake_proc(tmp_path, 300, "slurmstepd", ["slurmstepd: [7.0]"], ours)
    fake_proc(tmp_path, 301, "python3", ["python3", "train.py"], ours, ppid=300)
    fake_proc(tmp_path, 302, "python3", ["python3", "worker"], ours, ppid=301)
    fake_proc(tmp_path, 400, "slurmctld", ["/usr/sbin/slurmctld", "-f", CONF], ours, state="Z")
    fake_proc(tmp_path, 500, "slurmd", ["/usr/sbin/slurmd", "-f", OTHER_CONF], {"SLURM_CONF": OTHER_CONF})
    # A batch script's srun left behind by its killed step; a shell that eval'd our env; another cluster's job.
    fake_proc(tmp_path, 600, "srun", ["srun", "sleep", "300"], {"SLURM_CONF": CONF, "SLURM_JOB_ID": "7"})
    fake_proc(tmp_path, 601, "bash", ["bash"], {"SLURM_CONF": CONF})
    fake_proc(tmp_path, 602, "sleep", ["sleep", "9"], {"SLURM_CONF": OTHER_CONF, "SLURM_JOB_ID": "3"})
    (tmp_path / "self").mkdir()
    return tmp_path


def test_cluster_processes_lists_ours_in_stop_order_without_zombies(proc: Path):
    found = sc.cluster_processes(LAY, proc)
    assert [(p.name, p.pid) for p in found] == [
        ("slurmstepd [7.0]", 300), ("slurmd node1", 201), ("slurmd node2", 200), ("munged", 100)]


def test_task_processes_are_everything_below_the_steps(proc: Path):
    steps = [p for p in sc.cluster_processes(LAY, proc) if p.kind == "slurmstepd"]
    assert [(t.name, t.pid) for t in sc.task_processes(steps, proc)] == [("python3", 301), ("python3", 302)]


def test_job_processes_carry_a_job_id_and_our_slurm_conf(proc: Path):
    # The step's tasks (301, 302) inherited no SLURM_JOB_ID in this fake; they are found as its tree.
    assert [(p.name, p.pid) for p in sc.job_processes(LAY, proc)] == [("srun", 600)]


def test_ancestors_climb_to_the_root():
    assert sc.ancestors(12, {12: 11, 11: 10, 10: 1, 1: 0, 20: 1}) == {12, 11, 10, 1}


def test_is_alive_tells_a_reused_pid_from_the_process_seen_before(proc: Path):
    (slurmd,) = [p for p in sc.cluster_processes(LAY, proc) if p.name == "slurmd node1"]
    assert sc.is_alive(slurmd, proc)
    assert not sc.is_alive(sc.ClusterProcess(slurmd.name, slurmd.pid, slurmd.start_time + 1), proc)
    assert not sc.is_alive(sc.ClusterProcess("slurmctld", 400, 1000), proc)


def test_stop_order_ends_steps_first_and_munge_last():
    # Every daemon, and a slurmstepd reporting its end, authenticates through munged.
    assert sc.STOP_ORDER[0] == "slurmstepd"
    assert sc.STOP_ORDER[-1] == "munged"
    assert sc.STOP_ORDER.index("slurmd") < sc.STOP_ORDER.index("slurmctld")


def process(name: str, pid: int, ppid: int = 1):
    return sc.ClusterProcess(name, pid, start_time=1000, ppid=ppid)


def test_stray_daemons_are_those_their_pid_file_does_not_name():
    procs = [
        process("slurmd node1", 11),  # named by its pid file
        process("slurmd node1", 12),  # a second slurmd for node1
        process("slurmd node2", 21),  # its pid file is gone (removed at the start of a shutdown)
        process("slurmd node3", 31),
        process("slurmd node3", 32, ppid=31),  # slurmd's own fork, about to exec slurmstepd
        process("slurmstepd [5.0]", 40),
        process("slurmd (no -N)", 50),
    ]
    pid_files = {"slurmd node1": 11, "slurmd node2": None, "slurmd node3": 31, "munged": 999}
    assert sc.stray_daemons(procs, pid_files) == [
        "slurmd node1 (pid 12): its pid file names pid 11",
        "slurmd node2 (pid 21): no pid file",
        "slurmd (no -N) (pid 50): not a daemon this script starts",
    ]


def test_no_strays_when_every_running_daemon_is_in_its_pid_file():
    procs = [process("munged", 1), process("slurmctld", 2), process("slurmctld slurmscriptd", 4, ppid=2),
             process("slurmstepd [3.batch]", 3)]
    assert sc.stray_daemons(procs, {"munged": 1, "slurmctld": 2, "slurmdbd": None}) == []


@pytest.mark.parametrize(("host_cpus", "nodes", "threads"), [(2, 4, 1), (1, 4, 1), (16, 4, 4), (64, 4, 16), (16, 64, 1)])
def test_the_task_prolog_shares_the_hosts_cpus_among_the_nodes(host_cpus, nodes, threads):
    prolog = sc.render_task_prolog(host_cpus, nodes)
    assert prolog.startswith("#!/bin/sh\n")
    assert f'[ -n "$OMP_NUM_THREADS" ] || echo "export OMP_NUM_THREADS={threads}"' in prolog
    # The GPUs it hands out have no hardware: trials given them train on CPU by design.
    assert 'echo "export HPCSWEEP_DUMMY_GPUS=1"' in prolog


def test_the_default_shape_is_four_nodes_in_two_leaves_on_the_fixed_ports():
    shape = sc.Shape()
    assert shape.node_names == ("node1", "node2", "node3", "node4")
    assert sc.render_topology_conf(shape).splitlines()[1:] == [
        "SwitchName=leaf1 Nodes=node[1-2]", "SwitchName=leaf2 Nodes=node[3-4]", "SwitchName=spine Switches=leaf[1-2]"]
    assert (shape.slurmctld_port, shape.slurmdbd_port, shape.mariadb_port) == (26817, 26819, 26306)
    assert [shape.slurmd_port(i) for i in range(4)] == [26821, 26822, 26823, 26824]


def test_64_nodes_in_8_leaves_have_8_nodes_a_leaf_and_a_port_each():
    shape = sc.Shape(nodes=64, leaf_switches=8)
    assert [len(leaf) for leaf in shape.leaves] == [8] * 8
    text = sc.render_topology_conf(shape)
    assert "SwitchName=leaf8 Nodes=node[57-64]" in text and "SwitchName=spine Switches=leaf[1-8]" in text
    ports = {shape.slurmd_port(i) for i in range(64)}
    assert len(ports) == 64 and max(ports) == 26884
    assert not ports & {shape.slurmctld_port, shape.slurmdbd_port, shape.mariadb_port}
    assert sc.shape_errors(shape) == []


def test_uneven_leaves_differ_by_at_most_one_node_and_a_one_node_leaf_is_named_alone():
    assert sc.Shape(nodes=5, leaf_switches=2).leaves == [("node1", "node2", "node3"), ("node4", "node5")]
    text = sc.render_topology_conf(sc.Shape(nodes=3, leaf_switches=3))
    assert "SwitchName=leaf3 Nodes=node3\n" in text and "Switches=leaf[1-3]" in text
    assert sc.render_topology_conf(sc.Shape(nodes=1, leaf_switches=1)).endswith("SwitchName=spine Switches=leaf1\n")


def test_a_port_offset_moves_every_port_and_the_slurm_conf_names_them(tmp_path):
    shape = sc.Shape(nodes=16, leaf_switches=4, port_offset=1000, max_array_size=300)
    conf = sc.render_slurm_conf(sc.Layout(tmp_path, shape), "host")
    assert "SlurmctldPort=27817" in conf and "AccountingStoragePort=27819" in conf
    assert "NodeName=node16 NodeAddr=127.0.0.1 NodeHostname=host Port=27836 CPUs=64" in conf
    assert "MaxArraySize=300" in conf and "PartitionName=batch Nodes=node[1-16]" in conf
    assert "StoragePort=27306" in sc.render_slurmdbd_conf(sc.Layout(tmp_path, shape), "host", "pw")


@pytest.mark.parametrize(("shape", "error"), [
    (sc.Shape(nodes=0), "--nodes must be at least 1, got 0"),
    (sc.Shape(nodes=4, leaf_switches=0), "--leaf-switches must be at least 1, got 0"),
    (sc.Shape(nodes=2, leaf_switches=3), "--leaf-switches 3 is more than --nodes 2"),
    (sc.Shape(max_array_size=0), "--max-array-size must be at least 1, got 0"),
    (sc.Shape(port_offset=-1), "--port-offset must be 0 or more, got -1"),
    (sc.Shape(nodes=40000), "--nodes 40000 with --port-offset 0 needs slurmd ports up to 66820, past 65535"),
])
def test_a_shape_that_cannot_run_says_which_option_and_why(shape, error):
    assert any(line.startswith(error) for line in sc.shape_errors(shape)), sc.shape_errors(shape)


def test_the_recorded_shape_round_trips_and_options_replace_only_what_they_name():
    shape = sc.Shape(nodes=64, leaf_switches=8, port_offset=7, max_array_size=300)
    assert sc.parse_shape(sc.shape_json(shape)) == shape
    args = sc.argparse.Namespace(nodes=None, leaf_switches=None, port_offset=None, max_array_size=1001)
    assert sc.requested_shape(shape, args) == sc.Shape(nodes=64, leaf_switches=8, port_offset=7, max_array_size=1001)
    with pytest.raises(sc.ClusterError, match="--leaf-switches 8 is more than --nodes 4"):
        sc.requested_shape(shape, sc.argparse.Namespace(nodes=4, leaf_switches=None, port_offset=None,
                                                        max_array_size=None))
    assert shape.topology_changes(sc.Shape()) == [
        "nodes 4 -> 64", "leaf_switches 2 -> 8", "port_offset 0 -> 7"]


def test_cluster_layout_reads_the_recorded_shape_and_defaults_without_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCSWEEP_CLUSTER_DIR", str(tmp_path))
    assert sc.cluster_layout().shape == sc.Shape()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "shape.json").write_text(sc.shape_json(sc.Shape(nodes=16, leaf_switches=4)))
    assert sc.cluster_layout().shape.nodes == 16
    assert len([d for d in sc.daemons(sc.cluster_layout()) if d.name.startswith("slurmd ")]) == 16


def test_oci_conf_runs_runc_through_oci_run_and_queries_through_oci_state():
    lay = sc.Layout(Path("/c"), sc.Shape(oci=1))
    text = sc.render_oci_conf(lay, "/usr/sbin/runc", "/usr/bin/python3", "/repo/scripts/slurm-cluster")
    lines = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
    assert lines == {
        "RunTimeQuery": '"/c/etc/oci-state %n.%u.%j.%s.%t"',
        "RunTimeKill": '"/usr/sbin/runc --root=/c/run/runc kill --all %n.%u.%j.%s.%t KILL"',
        "RunTimeDelete": '"/usr/sbin/runc --root=/c/run/runc delete --force %n.%u.%j.%s.%t"',
        "RunTimeRun": '"/usr/bin/python3 /repo/scripts/slurm-cluster oci-run /c %n %t %n.%u.%j.%s.%t %b"',
    }


def test_oci_state_answers_stopped_once_runc_no_longer_knows_the_container(tmp_path):
    # A runc that knows no container, as after `runc run` removed it: the query must still give a state.
    runc = tmp_path / "runc"
    runc.write_text("#!/bin/sh\necho 'container does not exist' >&2\nexit 1\n")
    runc.chmod(0o755)
    script = tmp_path / "oci-state"
    script.write_text(sc.render_oci_state(sc.Layout(tmp_path), str(runc)))
    script.chmod(0o755)
    out = subprocess.run([str(script), "node1.root.7.0.0"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {"ociVersion": "1.0.2", "id": "node1.root.7.0.0", "status": "stopped"}


def test_tasks_per_node_expands_slurms_counts():
    assert sc.tasks_per_node("1(x2)") == [1, 1]
    assert sc.tasks_per_node("2(x2),1") == [2, 2, 1]
    assert sc.tasks_per_node("") == []


def test_task_variables_give_each_containers_task_its_node_and_ranks():
    env = {"SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    got = sc.task_variables(env, "node4", 1, ["node3", "node4"], {"OMP_NUM_THREADS": "1"})
    assert got == {"SLURMD_NODENAME": "node4", "SLURM_NODEID": "1", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
                   "OMP_NUM_THREADS": "1"}
    with pytest.raises(sc.ClusterError, match="node1 is not in the step's nodes node3, node4"):
        sc.task_variables(env, "node1", 0, ["node3", "node4"], {})


def test_prolog_exports_reads_what_slurm_reads_of_a_task_prolog():
    out = "export OMP_NUM_THREADS=1\nexport HPCSWEEP_DUMMY_GPUS=1\nprint hello\nunset X\nexport 1BAD=2\n"
    assert sc.prolog_exports(out) == {"OMP_NUM_THREADS": "1", "HPCSWEEP_DUMMY_GPUS": "1"}


def test_the_oci_option_is_recorded_in_the_shape_and_read_back():
    assert sc.parse_shape(sc.shape_json(sc.Shape(oci=1))).oci == 1
    assert sc.parse_shape('{"nodes": 4}').oci == 0
