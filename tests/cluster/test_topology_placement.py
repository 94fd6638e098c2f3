"""Topology-aware placement on the real local cluster (leaf1: node1-2, leaf2: node3-4)."""

from __future__ import annotations

import subprocess

import pytest

from .conftest import SMALL_TRIAL, only_sweep_dir, read_json, run_hpcsweep, slurm, wait_for

LEAVES = ({"node1", "node2"}, {"node3", "node4"})


@pytest.fixture
def node1_busy(slurm_env):
    """A job that holds all of node1, so only node2 is free under leaf1."""
    job_id = slurm(slurm_env, "sbatch", "--parsable", "--nodelist=node1", "--exclusive", "--time=10", "--output=/dev/null",
                   "--wrap", "sleep 600").strip()
    wait_for(lambda: slurm(slurm_env, "squeue", "-h", "-j", job_id, "-o", "%T").strip() == "RUNNING",
             timeout=60, what="the blocker on node1 to run")
    yield job_id
    slurm(slurm_env, "scancel", job_id)


def submit_two_node_trial(tmp_path, env, mode: str, max_wait_min: int = 3) -> tuple[dict, str]:
    """Submit a two-node trial; return its sweep.json record and the command's log."""
    args = ["-m", "trainer.nodes=2", f"topology.mode={mode}", f"topology.max_wait_min={max_wait_min}", *SMALL_TRIAL,
            "trainer.max_steps=2"]
    result = run_hpcsweep(args, tmp_path, env)
    assert result.returncode == 0, result.stdout + result.stderr
    (trial,) = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))["trials"]
    return trial, result.stdout + result.stderr


def placed_nodes(env, job_id: str) -> list[str]:
    def nodes():
        out = slurm(env, "sacct", "-X", "--noheader", "--parsable2", "-j", job_id, "--format=NodeList,State").strip()
        nodelist, _, state = out.partition("|")
        return nodelist if state and state != "PENDING" and nodelist != "None assigned" else None

    nodelist = wait_for(nodes, timeout=120, what=f"job {job_id} to be placed")
    return slurm(env, "scontrol", "show", "hostnames", nodelist).split()


def test_pin_mode_submits_and_lands_on_one_leaf(tmp_path, slurm_env, node1_busy):
    trial, _ = submit_two_node_trial(tmp_path, slurm_env, "pin")
    script = next(tmp_path.glob("multirun/*/*/.submitit/*/*_submission.sh")).read_text()
    assert "#SBATCH --nodelist=node3,node4" in script
    assert placed_nodes(slurm_env, trial["job_id"]) == ["node3", "node4"]
    subprocess.run(["scancel", trial["job_id"]], env=slurm_env, check=True, timeout=30)


def test_switches_mode_asks_slurm_for_one_leaf(tmp_path, slurm_env, node1_busy):
    # 30 minutes: more than the cluster's SchedulerParameters=max_switch_wait (300 s by default).
    trial, log = submit_two_node_trial(tmp_path, slurm_env, "switches", max_wait_min=30)
    assert "topology.max_wait_min=30 is more than this cluster allows" in log
    job = slurm(slurm_env, "scontrol", "show", "job", "--oneliner", trial["job_id"])
    assert "Switches=1@00:05:00" in job, job
    assert placed_nodes(slurm_env, trial["job_id"]) == ["node3", "node4"]
    subprocess.run(["scancel", trial["job_id"]], env=slurm_env, check=True, timeout=30)


def all_nodes_idle(env) -> bool:
    states = slurm(env, "sinfo", "-h", "-N", "-o", "%N %T").split("\n")
    return {line.split()[1] for line in states if line} == {"idle"}


def test_pin_mode_gives_each_trial_of_a_sweep_its_own_leaf(tmp_path, slurm_env):
    wait_for(lambda: all_nodes_idle(slurm_env), timeout=120, what="every node to be idle")
    args = ["-m", "model.lr=1e-4,3e-4", "trainer.nodes=2", "topology.mode=pin", *SMALL_TRIAL, "trainer.max_steps=2"]
    result = run_hpcsweep(args, tmp_path, slurm_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fall back to topology.mode=switches" not in result.stdout + result.stderr
    sweep_dir = only_sweep_dir(tmp_path)
    record = read_json(sweep_dir / "sweep.json")
    job_ids = [t["job_id"] for t in record["trials"]]
    try:
        # Different --nodelist values cannot share one array's job spec: one array per placement.
        assert len(record["arrays"]) == 2
        scripts = [p.read_text() for p in sweep_dir.glob(".submitit/*/*_submission.sh")]
        pinned = sorted(line for text in scripts for line in text.splitlines() if line.startswith("#SBATCH --nodelist="))
        assert pinned == ["#SBATCH --nodelist=node1,node2", "#SBATCH --nodelist=node3,node4"]
        ran_on = []
        for trial in record["trials"]:
            env_file = tmp_path / trial["trial_dir"] / "environment.json"
            wait_for(env_file.exists, timeout=180, what=f"trial {trial['num']} to start")
            nodelist = read_json(env_file)["slurm"]["nodelist"]
            nodes = set(slurm(slurm_env, "scontrol", "show", "hostnames", nodelist).split())
            assert nodes == set(placed_nodes(slurm_env, trial["job_id"]))
            ran_on.append(nodes)
        assert ran_on[0].isdisjoint(ran_on[1]) and sorted(map(sorted, ran_on)) == sorted(map(sorted, LEAVES))
    finally:
        subprocess.run(["scancel", *job_ids], env=slurm_env, check=True, timeout=30)
