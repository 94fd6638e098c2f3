"""The runner's pure choices for this node's torchrun workers."""

import pytest

from hpcsweep.trial.launch import resolve_head_address, worker_threads
from hpcsweep.trial.rendezvous import Rendezvous


@pytest.mark.parametrize(
    ("env", "nproc", "visible", "threads"),
    [
        ({"SLURM_CPUS_PER_TASK": "64"}, 8, 128, 8),   # the task's CPUs, not the node's
        ({"SLURM_CPUS_PER_TASK": "2"}, 2, 2, 1),
        ({"SLURM_CPUS_PER_TASK": "3"}, 8, 128, 1),    # never below one
        ({}, 4, 16, 4),                                # no Slurm: the CPUs this process may use
        ({"SLURM_CPUS_PER_TASK": ""}, 2, 2, 1),
        ({"SLURM_CPUS_PER_TASK": "64"}, 1, 2, 2),     # 64 declared CPUs on 2 real cores: 2 threads
        ({"SLURM_CPUS_PER_TASK": "64"}, 2, 2, 1),
    ],
)
def test_workers_share_the_tasks_cpus(env, nproc, visible, threads):
    assert worker_threads(env, nproc, visible) == threads


def test_a_users_omp_num_threads_is_kept():
    assert worker_threads({"OMP_NUM_THREADS": "6", "SLURM_CPUS_PER_TASK": "64"}, 8, 128) is None


def test_a_one_node_trial_meets_on_the_loopback_whatever_its_node_name_resolves_to():
    # The local cluster's "node1" resolves nowhere; a real node's name may resolve to an interface the
    # workers do not listen on. Every process of a one-node trial is on this host.
    rdzv = Rendezvous("node1", 29500, nnodes=1, node_rank=0, nproc_per_node=2, rdzv_id="41_0")
    assert resolve_head_address(rdzv) == Rendezvous("127.0.0.1", 29500, 1, 0, 2, "41_0")
