"""The local Slurm cluster of ``scripts/slurm-cluster`` works end to end.

Assumes ``scripts/slurm-cluster up`` has run. SLURM_CONF comes from the environment or, when
unset, from ``scripts/slurm-cluster env``. Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import cluster_env, wait_for

REPO = Path(__file__).resolve().parents[2]
NODES = ["node1", "node2", "node3", "node4"]
JOB_TIMEOUT_S = 60.0


SLURM_ENV = cluster_env()


def slurm(*argv: str, timeout: float = 30.0) -> str:
    """Run a Slurm command against the local cluster; return stdout, fail with stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          env=SLURM_ENV, check=False)
    assert proc.returncode == 0, f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}"
    return proc.stdout


def sbatch(*args: str) -> str:
    """Submit a batch job and return its id."""
    return slurm("sbatch", "--parsable", "--job-name=hpcsweep-cluster-test", *args).strip().split(";")[0]


def sacct_states(job_id: str, *extra: str) -> dict[str, str]:
    """sacct's job records of ``job_id`` (array tasks by ``ID_N``) and their states."""
    out = slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State", *extra)
    return dict(line.split("|", 1) for line in out.splitlines() if line.strip())


def completed_in_sacct(job_id: str, count: int = 1) -> dict[str, str] | None:
    states = sacct_states(job_id)
    if len(states) == count and all(state == "COMPLETED" for state in states.values()):
        return states
    failed = {j: s for j, s in states.items() if s not in ("PENDING", "RUNNING", "COMPLETED")}
    assert not failed, f"job {job_id} ended badly: {failed}"
    return None


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job -o`` as a dict; empty once the job has left slurmctld's memory."""
    proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                          timeout=30, env=SLURM_ENV, check=False)
    if proc.returncode != 0:
        return {}
    return dict(f.split("=", 1) for f in proc.stdout.split() if "=" in f)


@pytest.fixture(scope="module", autouse=True)
def controller_up() -> None:
    out = slurm("scontrol", "ping")
    assert " is UP" in out, f"no controller; run `scripts/slurm-cluster up` first:\n{out}"


@pytest.fixture
def submitted() -> Iterator[list[str]]:
    """Job ids a test submits; whatever still runs is cancelled afterwards."""
    ids: list[str] = []
    yield ids
    if ids:
        slurm("scancel", *ids)


def test_four_nodes_shaped_like_the_a100_launcher_defaults() -> None:
    out = slurm("sinfo", "-h", "-N", "-p", "batch", "-o", "%N|%T|%c|%m|%G")
    rows = {name: rest for name, *rest in (line.split("|") for line in out.splitlines())}
    assert sorted(rows) == NODES
    for node, (state, cpus, mem, gres) in rows.items():
        # idle on a fresh cluster; other cluster tests may have jobs running at the same time.
        assert state in ("idle", "mixed", "allocated"), f"{node} is {state}"
        # configs/hydra/launcher/slurm.yaml asks for 64 CPUs and 8 GPUs per node.
        assert (cpus, gres) == ("64", "gpu:a100:8"), node
        assert int(mem) == 512000, node


def test_partitions_batch_preemptable_urgent_high_priority() -> None:
    out = slurm("scontrol", "show", "partitions", "-o")
    parts = {m["PartitionName"]: m for m in (
        dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.splitlines())}
    assert parts["batch"]["Default"] == "YES"
    assert parts["batch"]["PreemptMode"] == "REQUEUE"
    assert int(parts["urgent"]["PriorityTier"]) > int(parts["batch"]["PriorityTier"])
    assert parts["batch"]["Nodes"] == parts["urgent"]["Nodes"] == "node[1-4]"


def test_topology_has_two_leaves_under_a_spine() -> None:
    out = slurm("scontrol", "show", "topology")
    switches = {m.group(1): m.group(0) for m in re.finditer(r"SwitchName=(\S+).*", out)}
    assert "Nodes=node[1-2]" in switches["leaf1"]
    assert "Nodes=node[3-4]" in switches["leaf2"]
    assert "Switches=leaf[1-2]" in switches["spine"]


def test_wrap_job_completes_in_sacct(tmp_path: Path, submitted: list[str]) -> None:
    out = tmp_path / "job.out"
    job = sbatch(f"--output={out}", "--wrap", "echo node=$SLURMD_NODENAME")
    submitted.append(job)
    wait_for(lambda: completed_in_sacct(job), JOB_TIMEOUT_S, f"job {job} COMPLETED in sacct")
    assert re.fullmatch(r"node=node[1-4]\n", out.read_text())


def test_array_tasks_appear_in_sacct(submitted: list[str]) -> None:
    job = sbatch("--array=0-3", "--output=/dev/null", "--wrap", "true")
    submitted.append(job)
    states = wait_for(lambda: completed_in_sacct(job, 4), JOB_TIMEOUT_S, f"array {job} in sacct")
    assert sorted(states) == [f"{job}_{i}" for i in range(4)]


def test_gpus_per_node_sets_cuda_visible_devices(tmp_path: Path, submitted: list[str]) -> None:
    out = tmp_path / "gpu.out"
    job = sbatch("--gpus-per-node=2", f"--output={out}", "--wrap", "echo $CUDA_VISIBLE_DEVICES")
    submitted.append(job)
    wait_for(lambda: completed_in_sacct(job), JOB_TIMEOUT_S, f"GPU job {job} COMPLETED")
    assert len(out.read_text().strip().split(",")) == 2, out.read_text()


def test_srun_spans_two_nodes() -> None:
    # All slurmd share this host, so `hostname` is the same everywhere; SLURMD_NODENAME is not.
    out = slurm("srun", "--job-name=hpcsweep-cluster-test", "-N2", "--ntasks-per-node=1",
                "bash", "-c", "echo $SLURM_NODEID $SLURMD_NODENAME", timeout=JOB_TIMEOUT_S)
    assert len(out.splitlines()) == 2, out
    ranks = dict(line.split() for line in out.splitlines())
    assert sorted(ranks) == ["0", "1"]
    assert len(set(ranks.values())) == 2 and set(ranks.values()) <= set(NODES)


def test_urgent_job_preempts_batch_job_by_requeue(submitted: list[str]) -> None:
    # Both want all 64 CPUs of node4, so the urgent job can only start by evicting the batch job.
    low = sbatch("-p", "batch", "-w", "node4", "-c", "64", "--output=/dev/null", "--wrap", "sleep 300")
    submitted.append(low)
    wait_for(lambda: job_fields(low).get("JobState") == "RUNNING", JOB_TIMEOUT_S, f"batch job {low} to run")
    high = sbatch("-p", "urgent", "-w", "node4", "-c", "64", "--output=/dev/null", "--wrap", "sleep 1")
    submitted.append(high)
    wait_for(lambda: job_fields(low).get("Restarts", "0") != "0", JOB_TIMEOUT_S, f"job {low} requeued")
    wait_for(lambda: completed_in_sacct(high), JOB_TIMEOUT_S, f"urgent job {high} COMPLETED")
    # sacct keeps the evicted run as its own record (shown with --duplicates).
    runs = slurm("sacct", "-n", "-X", "-P", "-D", "-j", low, "-o", "State").split()
    assert runs[0] == "PREEMPTED", runs


def test_tasks_default_to_their_nodes_share_of_the_hosts_cpus() -> None:
    # Four "nodes" on one small host: without the TaskProlog each task would take every real CPU.
    share = max(1, len(os.sched_getaffinity(0)) // len(NODES))
    env = {k: v for k, v in SLURM_ENV.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run(["srun", "--job-name=hpcsweep-cluster-test", "-N1", "bash", "-c", "echo $OMP_NUM_THREADS"],
                         env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=True).stdout
    assert out.strip() == str(share)
    mine = subprocess.run(["srun", "--job-name=hpcsweep-cluster-test", "-N1", "bash", "-c", "echo $OMP_NUM_THREADS"],
                          env={**env, "OMP_NUM_THREADS": "7"}, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S, check=True).stdout
    assert mine.strip() == "7"
