"""Multi-node trials on the real local cluster: two nodes' torchrun agents, gloo on CPU."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import REPO, SMALL_TRIAL, read_json, wait_until_ended


def assert_two_nodes_four_ranks(metrics, allocated_nodes):
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["world_size"] == 4
    ranks = sorted(metrics["ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    nodes = {r["node"] for r in ranks}
    assert nodes == set(allocated_nodes) and len(nodes) == 2
    for node in nodes:
        assert sorted(r["local_rank"] for r in ranks if r["node"] == node) == [0, 1]


def test_two_nodes_two_processes_each_via_the_sweep(two_node_trial, slurm_env):
    assert two_node_trial.state == "COMPLETED"
    env_record = read_json(two_node_trial.trial_dir / "environment.json")
    allocated = subprocess.run(
        ["scontrol", "show", "hostnames", env_record["slurm"]["nodelist"]],
        env=slurm_env, capture_output=True, text=True, check=True, timeout=30,
    ).stdout.split()
    metrics = read_json(two_node_trial.trial_dir / "metrics.json")
    assert_two_nodes_four_ranks(metrics, allocated)
    assert env_record["rendezvous"]["NNODES"] == "2"
    assert env_record["rendezvous"]["WORLD_SIZE"] == "4"


def test_plain_sbatch_route_runs_a_two_node_trial(tmp_path, slurm_env):
    # tmp_path stands for the repo root the user submits from, with its committed slurm/logs/.
    (tmp_path / "slurm" / "logs").mkdir(parents=True)
    env = {**slurm_env, "HPCSWEEP_PYTHON": sys.executable}
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", "--cpus-per-task=2", "--time=10",
         str(REPO / "slurm" / "train.sbatch"), "model.lr=3e-4", "trainer.nproc_per_node=2",
         *[o for o in SMALL_TRIAL if not o.startswith("hydra.")], "trainer.max_steps=4"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=60,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    state = wait_until_ended(slurm_env, job_id)
    log = (tmp_path / "slurm" / "logs" / f"hpcsweep-train-{job_id}.out").read_text()
    assert state == "COMPLETED", log[-3000:]

    trial_dir = tmp_path / "outputs" / f"sbatch-{job_id}"
    config = (trial_dir / "config.yaml").read_text()
    assert "lr: 0.0003" in config
    nodelist = subprocess.run(
        ["sacct", "-X", "--noheader", "--parsable2", "-j", job_id, "--format=NodeList"],
        env=slurm_env, capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()
    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], env=slurm_env, capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()
    assert_two_nodes_four_ranks(read_json(trial_dir / "metrics.json"), hosts)
    assert os.path.isdir(trial_dir / "checkpoints")
    assert not list(tmp_path.glob("slurm-*.out"))
