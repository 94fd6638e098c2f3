"""``scripts/slurm-cluster down`` stops everything of the cluster, even right after a scancel, and
``up`` never runs a second slurmd for a node.

Each test takes the shared cluster down and brings it back up (every node idle) before it ends,
so other cluster tests in the same session still find it. What runs is checked by reading /proc
here, by a rule of this file's own (a daemon's program that names the cluster's folder in its
command line or in its SLURM_CONF), not by trusting the script's output.
"""

from __future__ import annotations

import collections
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from .conftest import REPO, STOPPABLE_TRIAL, cluster_env, read_json, run_hpcsweep, slurm, wait_for

SCRIPT = REPO / "scripts" / "slurm-cluster"
NODES = ("node1", "node2", "node3", "node4")
DAEMON_PROGRAMS = {"slurmd", "slurmstepd", "slurmctld", "slurmscriptd", "slurmdbd", "mariadbd", "mysqld", "munged"}


def cluster_root() -> Path:
    return Path(cluster_env()["SLURM_CONF"]).parents[1]


def live_processes() -> Iterator[tuple[int, str, list[str], dict[str, str]]]:
    """(pid, program, argv, environment) of every live process but zombies."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            raw_env = (entry / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # exited while we looked
            continue
        comm, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
        if state not in "ZX":
            yield int(entry.name), comm, argv, dict(item.split("=", 1) for item in raw_env if "=" in item)


def is_cluster_daemon(comm: str, argv: list[str], env: dict[str, str]) -> bool:
    root = f"{cluster_root()}/"
    return comm in DAEMON_PROGRAMS and (any(root in arg for arg in argv)
                                        or env.get("SLURM_CONF", "").startswith(root))


def cluster_daemons() -> list[str]:
    """'program pid argv' of each daemon process of this cluster that is alive."""
    return [f"{comm} {pid} {' '.join(argv)}" for pid, comm, argv, env in live_processes()
            if is_cluster_daemon(comm, argv, env)]


def job_processes() -> list[dict[str, str]]:
    """Processes that a job of this cluster runs (they carry its SLURM_CONF and a SLURM_JOB_ID)."""
    root = f"{cluster_root()}/"
    return [{"pid": str(pid), "program": comm, "node": env.get("SLURMD_NODENAME", ""),
             "step": env.get("SLURM_STEP_ID", "")}
            for pid, comm, _, env in live_processes()
            if pid != os.getpid() and "SLURM_JOB_ID" in env and env.get("SLURM_CONF", "").startswith(root)]


def slurmd_per_node() -> dict[str, int]:
    """How many slurmd of this cluster run for each node (`slurmd -N NODE ...`)."""
    return dict(collections.Counter(
        argv[argv.index("-N") + 1] for _, comm, argv, env in live_processes()
        if comm == "slurmd" and "-N" in argv and is_cluster_daemon(comm, argv, env)))


def slurm_cluster(command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), command], capture_output=True, text=True, timeout=timeout,
                          env=cluster_env(), check=False)


def bring_back_up() -> None:
    """`up`, then wait until every node is idle: the other cluster tests expect a fresh cluster."""
    result = slurm_cluster("up")
    assert result.returncode == 0, result.stdout + result.stderr

    def all_idle() -> bool:
        out = slurm(cluster_env(), "sinfo", "-h", "-N", "-p", "batch", "-o", "%N %T")
        return dict(line.split() for line in out.splitlines()) == {n: "idle" for n in NODES}

    wait_for(all_idle, 120, "every node idle after `up`")


def step_tasks_on_two_nodes() -> list[dict[str, str]] | None:
    tasks = [p for p in job_processes() if p["step"] == "0"]
    return tasks if len({p["node"] for p in tasks}) == 2 else None


def test_down_right_after_scancel_of_a_running_two_node_trial_leaves_nothing(tmp_path, slurm_env):
    try:
        result = run_hpcsweep(["-m", *STOPPABLE_TRIAL, "trainer.nodes=2", "trainer.max_steps=200"],
                              tmp_path, slurm_env, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        (trial,) = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))["trials"]
        # Running, with the tasks of its srun step alive on both of its nodes.
        tasks = wait_for(step_tasks_on_two_nodes, 180, f"job {trial['job_id']} to run its step on two nodes")
        slurm(slurm_env, "scancel", trial["job_id"])
        started = time.monotonic()
        down = slurm_cluster("down", timeout=240)
        took = time.monotonic() - started
        assert down.returncode == 0, down.stdout + down.stderr
        assert "cluster down" in down.stdout, down.stdout
        assert cluster_daemons() == [], f"after `down` ({took:.1f} s):\n{down.stdout}"
        assert job_processes() == [], f"tasks before the cancel: {tasks}\n{down.stdout}"
    finally:
        bring_back_up()
    assert slurmd_per_node() == {n: 1 for n in NODES}


def test_up_refuses_a_slurmd_its_pid_file_does_not_name_and_down_still_stops_it(slurm_env):
    run = cluster_root() / "run"
    # What an interrupted stop leaves: node1's slurmd runs without its pid file, and node2's pid file
    # names another live process (this test's own, which `down` must not touch).
    (run / "slurmd-node1.pid").unlink()
    (run / "slurmd-node2.pid").write_text(f"{os.getpid()}\n")
    try:
        refused = slurm_cluster("up")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "slurmd node1" in refused.stderr and "no pid file" in refused.stderr, refused.stderr
        assert f"names pid {os.getpid()}" in refused.stderr, refused.stderr
        assert slurmd_per_node() == {n: 1 for n in NODES}
        down = slurm_cluster("down", timeout=240)
        assert down.returncode == 0, down.stdout + down.stderr
        assert cluster_daemons() == [], down.stdout
    finally:
        bring_back_up()
    assert slurmd_per_node() == {n: 1 for n in NODES}
