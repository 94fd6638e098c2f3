"""Tests for hpcsweep.slurm.env: literal environments and nodelists, no Slurm needed."""

import pytest

from hpcsweep.slurm.env import (
    SLURM_ENV_VARS,
    SlurmJobEnv,
    expand_nodelist,
    slurm_job_env,
)

# Expected values checked against `scontrol show hostnames` (Slurm 22.05).
NODELISTS = {
    "node[1-3,7]": ["node1", "node2", "node3", "node7"],
    "gpu-a[01-04]": ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"],
    "a[1-2],b3": ["a1", "a2", "b3"],
    "rack[1-2]-n[1-2]": ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"],
    "node1,node2": ["node1", "node2"],
    "x[8-10]": ["x8", "x9", "x10"],
    "y[09-11]": ["y09", "y10", "y11"],
    "single": ["single"],
    "": [],
}


@pytest.mark.parametrize("expr, hosts", NODELISTS.items())
def test_expand_nodelist(expr, hosts):
    assert expand_nodelist(expr) == hosts


@pytest.mark.parametrize("expr", ["node[1-3", "node1-3]", "node[a-b]", "node[3-1]", "n[[1]]"])
def test_expand_nodelist_rejects_malformed(expr):
    with pytest.raises(ValueError):
        expand_nodelist(expr)


ARRAY_ENV = {
    "SLURM_JOB_ID": "1043",
    "SLURM_ARRAY_JOB_ID": "1040",
    "SLURM_ARRAY_TASK_ID": "3",
    "SLURM_JOB_NODELIST": "gpu-a[01-04]",
    "SLURM_JOB_NUM_NODES": "4",
    "SLURM_NODEID": "2",
    "SLURM_PROCID": "2",
    "SLURM_LOCALID": "0",
    "SLURMD_NODENAME": "gpu-a03",
    "SLURM_CPUS_PER_TASK": "32",
    "SLURM_GPUS_ON_NODE": "8",
    "SLURM_RESTART_COUNT": "1",
    "SLURM_JOB_PARTITION": "low",
    "HOME": "/home/u",
}


def test_array_task():
    job = slurm_job_env(ARRAY_ENV)
    assert job == SlurmJobEnv(
        job_id="1043",
        array_job_id="1040",
        array_task_id=3,
        partition="low",
        node_id=2,
        procid=2,
        localid=0,
        num_nodes=4,
        nodelist="gpu-a[01-04]",
        restart_count=1,
        node_name="gpu-a03",
        cpus_per_task=32,
        gpus_on_node=8,
    )
    assert job.job_label == "1040_3"
    assert job.hostnames == ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"]


def test_plain_job_defaults():
    job = slurm_job_env({"SLURM_JOB_ID": "77", "SLURM_NODELIST": "node[1-3,7]"})
    assert job.job_label == "77"
    assert not job.is_array_task
    assert job.restart_count == 0
    assert job.node_id == 0
    assert job.num_nodes == 4  # counted from the nodelist when SLURM_JOB_NUM_NODES is absent
    assert job.gpus_on_node is None


def test_old_spellings():
    job = slurm_job_env({"SLURM_JOBID": "5", "SLURM_NNODES": "2"})
    assert (job.job_id, job.num_nodes) == ("5", 2)


def test_outside_slurm_is_none():
    assert slurm_job_env({"HOME": "/root", "SLURM_CONF": "/etc/slurm.conf"}) is None


def test_bad_integer_names_the_variable():
    with pytest.raises(ValueError, match="SLURM_NODEID"):
        slurm_job_env({"SLURM_JOB_ID": "1", "SLURM_NODEID": "x"})


def test_every_mapped_field_is_a_dataclass_field():
    assert set(SLURM_ENV_VARS) <= set(SlurmJobEnv.__dataclass_fields__)
