"""A local cluster of its own at scale, beside the suite's: 64 nodes up and down, then 16 nodes in 4 leaves
where a 2-node trial must wait for a leaf of its own and ``status`` polls with one sacct.

The suite's cluster runs in the same network namespace on the fixed ports; this module's cluster
lives in a folder of its own with every port moved up (``--port-offset``), so each `up` and `down`
here touches only its own daemons (checked by reading /proc, by this file's own rule: a daemon
program whose command line or SLURM_CONF names this cluster's folder).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcsweep.slurm.env import expand_nodelist
from hpcsweep.slurm.topology import parse_topology

from .conftest import REPO, SMALL_TRIAL, read_json, run_hpcsweep, slurm, wait_for

SCRIPT = REPO / "scripts" / "slurm-cluster"
# Clear of the suite's cluster (26306-26824) and of a 64-node one on the default ports (up to 26884).
PORT_OFFSET = 2000
DAEMON_PROGRAMS = {"slurmd", "slurmstepd", "slurmctld", "slurmscriptd", "slurmdbd", "mariadbd", "mysqld", "munged"}
COUNTED = ("sacct", "squeue", "scontrol", "sinfo")


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory) -> Path:
    """This module's cluster folder; whatever a test leaves running there is stopped at the end."""
    root = tmp_path_factory.mktemp("scale-cluster")
    yield root
    if own_daemons(root):
        slurm_cluster(root, "down")


def slurm_cluster(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False,
                            env={**os.environ, "HPCSWEEP_CLUSTER_DIR": str(root)})
    assert result.returncode == 0, f"slurm-cluster {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def own_daemons(root: Path) -> list[str]:
    """'program pid' of each live daemon process whose argv or SLURM_CONF names ``root``."""
    found = []
    marker = f"{root}/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace")
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:  # exited while we looked
            continue
        comm, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
        if comm in DAEMON_PROGRAMS and state not in "ZX" and (
                marker in argv or f"\0SLURM_CONF={marker}" in f"\0{environ}"):
            found.append(f"{comm} {entry.name}")
    return found


def cluster_slurm_env(root: Path) -> dict[str, str]:
    return {**os.environ, "HPCSWEEP_CLUSTER_DIR": str(root), "SLURM_CONF": str(root / "etc" / "slurm.conf")}


def node_states(env: dict[str, str]) -> dict[str, str]:
    out = slurm(env, "sinfo", "-h", "-N", "-p", "batch", "-o", "%N %T")
    return dict(line.split() for line in out.splitlines())


def leaves_of(root: Path) -> dict[str, str]:
    """node -> leaf switch, from the cluster's own topology.conf."""
    return dict(parse_topology((root / "etc" / "topology.conf").read_text()).leaf_of)


def test_64_nodes_in_8_leaves_come_up_and_down_leaves_no_daemon(cluster_dir):
    suite_conf = os.environ.get("SLURM_CONF", "")
    slurm_cluster(cluster_dir, "up", "--nodes", "64", "--leaf-switches", "8", f"--port-offset={PORT_OFFSET}")
    env = cluster_slurm_env(cluster_dir)
    assert node_states(env) == {f"node{i}": "idle" for i in range(1, 65)}
    leaves = leaves_of(cluster_dir)
    assert sorted(set(leaves.values())) == [f"leaf{i}" for i in range(1, 9)]
    assert all(list(leaves.values()).count(leaf) == 8 for leaf in set(leaves.values()))
    assert sum(d.startswith("slurmd ") for d in own_daemons(cluster_dir)) == 64
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert status.returncode == 0 and "slurmd node64" in status.stdout, status.stdout + status.stderr

    started = time.monotonic()
    down = slurm_cluster(cluster_dir, "down")
    took = time.monotonic() - started
    assert "cluster down" in down.stdout, down.stdout
    assert own_daemons(cluster_dir) == [], down.stdout
    # Stopping 64 slurmd is one SIGTERM each and a wait, not 64 waits in turn.
    assert took < 30, f"down took {took:.1f} s:\n{down.stdout}"
    # The suite's own cluster (another folder, the fixed ports) is untouched.
    if suite_conf:
        assert " is UP" in slurm({**os.environ, "SLURM_CONF": suite_conf}, "scontrol", "ping")


@pytest.fixture(scope="module")
def sixteen_nodes(cluster_dir) -> dict[str, str]:
    """16 nodes in 4 leaves (node1-4 ... node13-16) in this module's folder; down at the end, checked."""
    slurm_cluster(cluster_dir, "up", "--nodes", "16", "--leaf-switches", "4", f"--port-offset={PORT_OFFSET}")
    env = cluster_slurm_env(cluster_dir)
    wait_for(lambda: node_states(env) == {f"node{i}": "idle" for i in range(1, 17)}, 60, "16 idle nodes")
    yield env
    slurm_cluster(cluster_dir, "down")
    assert own_daemons(cluster_dir) == []


def hold_nodes(env: dict[str, str], nodes: str, seconds: int) -> str:
    """A job of the test's own holding all of ``nodes`` for ``seconds``; returns once it runs."""
    count = len(expand_nodelist(nodes))
    job = slurm(env, "sbatch", "--parsable", f"--nodelist={nodes}", f"--nodes={count}", "--exclusive", "--time=10",
                "--output=/dev/null", "--wrap", f"sleep {seconds}").strip()
    wait_for(lambda: slurm(env, "squeue", "-h", "-j", job, "-o", "%T").strip() == "RUNNING", 60,
             f"the blocker on {nodes} to run")
    return job


def counting_env(env: dict[str, str], bin_dir: Path, log: Path) -> dict[str, str]:
    """``env`` with wrappers first on PATH that log each Slurm query command, then run the real one."""
    bin_dir.mkdir()
    for command in COUNTED:
        wrapper = bin_dir / command
        real = subprocess.run(["sh", "-c", f"command -v {command}"], capture_output=True, text=True, check=True).stdout
        wrapper.write_text(f'#!/bin/sh\necho "{command} $*" >> "{log}"\nexec "{real.strip()}" "$@"\n')
        wrapper.chmod(0o755)
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}


def test_a_two_node_trial_waits_for_a_leaf_and_status_polls_with_one_sacct(tmp_path, sixteen_nodes):
    env, root = sixteen_nodes, Path(sixteen_nodes["HPCSWEEP_CLUSTER_DIR"])
    leaf_of = leaves_of(root)
    # Free: node4 (leaf1) and node5 (leaf2), two nodes under two leaves that a 2-node job without a
    # switch constraint would take at once; node15-16 (leaf4) free a little later.
    blockers = [hold_nodes(env, "node[1-3,6-14]", 600), hold_nodes(env, "node[15-16]", 25)]
    try:
        result = run_hpcsweep(["-m", "trainer.nodes=2", "topology.mode=switches", "topology.max_wait_min=3",
                               *SMALL_TRIAL, "trainer.max_steps=2"], tmp_path, env, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        sweep_dir = next(tmp_path.glob("multirun/*/*/sweep.json")).parent
        (trial,) = read_json(sweep_dir / "sweep.json")["trials"]
        job = trial["job_id"]
        assert "Switches=1@00:03:00" in slurm(env, "scontrol", "show", "job", "--oneliner", job)

        log = tmp_path / "calls.log"
        polling = counting_env(env, tmp_path / "bin", log)
        refreshes = 3
        for _ in range(refreshes):
            status = run_hpcsweep_status(sweep_dir, polling)
            assert status.returncode == 0, status.stdout + status.stderr
        calls = [line.split()[0] for line in log.read_text().splitlines()]
        assert calls.count("sacct") == refreshes, calls
        assert calls.count("squeue") + calls.count("scontrol") + calls.count("sinfo") <= refreshes, calls

        def placed() -> list[str] | None:
            out = slurm(env, "sacct", "-X", "--noheader", "--parsable2", "-j", job,
                        "--format=NodeList,State,Eligible,Start").strip()
            if not out:  # accounting may learn of a pending job a moment late
                return None
            nodelist, state, eligible, start = out.split("|")
            return [nodelist, eligible, start] if state not in ("PENDING", "") else None

        nodelist, eligible, start = wait_for(placed, 120, f"job {job} to be placed")
        nodes = expand_nodelist(nodelist)
        assert len(nodes) == 2 and len({leaf_of[n] for n in nodes}) == 1, f"{nodes} span leaves {leaf_of}"
        assert set(nodes) == {"node15", "node16"}, nodes
        assert start > eligible, (eligible, start)
    finally:
        slurm(env, "scancel", *blockers)


def run_hpcsweep_status(sweep_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcsweep.status", str(sweep_dir), "--color=never"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
