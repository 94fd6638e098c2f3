"""Tests for hpcsweep.trial.rendezvous: literal Slurm environments, no Slurm needed."""

import pytest

from hpcsweep.trial.rendezvous import (
    DEFAULT_LOCAL_PORT,
    PORT_MAX,
    PORT_MIN,
    Rendezvous,
    rendezvous_from_env,
    rendezvous_port,
)


def array_env(task: int, node_id: int = 0, nodelist: str = "gpu-a[01-04]") -> dict[str, str]:
    return {
        "SLURM_JOB_ID": str(5000 + task),
        "SLURM_ARRAY_JOB_ID": "4999",
        "SLURM_ARRAY_TASK_ID": str(task),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_NODEID": str(node_id),
    }


def test_array_task_rendezvous():
    rdzv = rendezvous_from_env(array_env(3, node_id=2), nproc_per_node=8)
    assert rdzv.master_addr == "gpu-a01"
    assert rdzv.nnodes == 4
    assert rdzv.node_rank == 2
    assert rdzv.world_size == 32
    assert rdzv.rdzv_id == "4999_3"
    assert rdzv.master_port == rendezvous_port("4999", "3")


def test_every_node_of_a_trial_agrees():
    seen = {rendezvous_from_env(array_env(1, node_id=i), 8) for i in range(4)}
    assert {(r.master_addr, r.master_port, r.rdzv_id) for r in seen} == {
        ("gpu-a01", rendezvous_port("4999", "1"), "4999_1")
    }
    assert sorted(r.node_rank for r in seen) == [0, 1, 2, 3]


def test_plain_job_on_unpadded_nodelist():
    env = {
        "SLURM_JOB_ID": "812",
        "SLURM_JOB_NODELIST": "node[1-3,7]",
        "SLURM_NNODES": "4",
        "SLURM_NODEID": "3",
    }
    rdzv = rendezvous_from_env(env, nproc_per_node=2)
    assert (rdzv.master_addr, rdzv.node_rank, rdzv.rdzv_id) == ("node1", 3, "812")
    assert rdzv.master_port == rendezvous_port("812", None)


def test_ports_differ_across_array_tasks_and_stay_in_range():
    ports = [rendezvous_port("123456", str(task)) for task in range(1001)]
    assert len(set(ports)) == len(ports)
    assert all(PORT_MIN <= p < PORT_MAX for p in ports)


def test_port_is_stable_and_in_range_for_many_jobs():
    assert rendezvous_port("42", "0") == rendezvous_port("42", "0")
    assert all(PORT_MIN <= rendezvous_port(str(j), None) < PORT_MAX for j in range(2000))
    assert PORT_MAX <= 32768  # below Linux's ephemeral port range


def test_hostnames_callable_is_used():
    calls = []

    def fake_hostnames(nodelist):
        calls.append(nodelist)
        return ["head", "other"]

    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "weird[x]", "SLURM_NODEID": "1"}
    rdzv = rendezvous_from_env(env | {"SLURM_NNODES": "2"}, 1, hostnames=fake_hostnames)
    assert calls == ["weird[x]"]
    assert rdzv.master_addr == "head"


def test_the_head_is_the_first_node_by_name_whatever_the_environment_says():
    # The runner resolves the name (DNS, else the controller's NodeAddr); no variable overrides it.
    env = array_env(0) | {"HPCSWEEP_HEAD_ADDR": "127.0.0.1"}
    assert rendezvous_from_env(env, 1).master_addr == rendezvous_from_env(array_env(0), 1).master_addr != "127.0.0.1"


def test_master_port_from_login_shell_is_ignored_inside_slurm():
    env = array_env(0) | {"MASTER_PORT": "29500"}
    assert rendezvous_from_env(env, 1).master_port == rendezvous_port("4999", "0")


def test_outside_slurm():
    rdzv = rendezvous_from_env({"HOME": "/root"}, nproc_per_node=2)
    assert rdzv == Rendezvous("127.0.0.1", DEFAULT_LOCAL_PORT, 1, 0, 2, "local")
    assert rendezvous_from_env({"MASTER_PORT": "31000"}, 1).master_port == 31000


def test_as_env():
    env = Rendezvous("node1", 23456, 2, 1, 4, "7_1").as_env()
    assert env["MASTER_ADDR"] == "node1"
    assert env["MASTER_PORT"] == "23456"
    assert env["NNODES"] == "2"
    assert env["NODE_RANK"] == "1"
    assert env["WORLD_SIZE"] == "8"
    assert env["RDZV_ENDPOINT"] == "node1:23456"
    assert all(isinstance(v, str) for v in env.values())


def test_node_rank_out_of_range():
    with pytest.raises(ValueError, match="node_rank"):
        rendezvous_from_env(array_env(0, node_id=4), 1)


def test_a_multi_node_task_without_its_node_id_is_refused_naming_the_container():
    # Slurm 22.05's OCI support puts the step's environment into a container, without each task's.
    env = {k: v for k, v in array_env(1).items() if k != "SLURM_NODEID"}
    with pytest.raises(ValueError, match=r"a task of a 4-node job has no SLURM_NODEID: this node's rank"):
        rendezvous_from_env(env, 8)
    with pytest.raises(ValueError, match=r"SLURM_CONTAINER=/shared/bundle, leaves each task's variables out"):
        rendezvous_from_env(env | {"SLURM_CONTAINER": "/shared/bundle"}, 8)
    one_node = env | {"SLURM_JOB_NUM_NODES": "1"}
    assert rendezvous_from_env(one_node, 8).node_rank == 0
