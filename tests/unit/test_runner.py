"""The runner's pure choices for this node's torchrun workers."""

import pytest

from hpcsweep.trial.launch import worker_threads


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
