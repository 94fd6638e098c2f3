"""How a local sweep shares the machine out (pure functions), and how a stopped local sweep says so."""

from __future__ import annotations

import pytest

from hpcsweep.sweep.local_pool import stop_summary
from hpcsweep.sweep.local_slots import (
    LocalSlot,
    plan_local_run,
    share_cpus,
    take_gpus,
    trial_environment,
    trial_gpu_count,
    visible_gpu_ids,
)

CPUS = list(range(16))


@pytest.mark.parametrize(
    ("gpus", "requested", "parallelism", "per_slot"),
    [(0, None, 1, 0), (0, 3, 3, 0), (1, None, 1, 1), (4, None, 4, 1), (8, None, 8, 1), (8, 2, 2, 4), (8, 3, 3, 2),
     (2, 4, 4, 1)],
)
def test_default_is_one_trial_per_gpu_and_one_on_cpu(gpus, requested, parallelism, per_slot):
    plan = plan_local_run(requested, [str(i) for i in range(gpus)], CPUS)
    assert (plan.parallelism, plan.gpus_per_slot, len(plan.slots)) == (parallelism, per_slot, parallelism)


def test_the_cpus_are_shared_out_without_overlap():
    plan = plan_local_run(None, ["0", "1", "2", "3"], CPUS)
    assert plan.slots == (LocalSlot(0, (0, 1, 2, 3)), LocalSlot(1, (4, 5, 6, 7)), LocalSlot(2, (8, 9, 10, 11)),
                          LocalSlot(3, (12, 13, 14, 15)))
    assert share_cpus([7, 3, 5], 2) == ((3,), (5,))
    assert share_cpus([0, 1], 4) == ((0,), (1,), (0,), (1,))
    assert plan_local_run(None, [], [2, 3, 4, 5]).slots == (LocalSlot(0, (2, 3, 4, 5)),)


def test_a_trial_takes_its_own_gpu_count_or_a_slots_share():
    four = plan_local_run(2, ["0", "1", "2", "3"], CPUS)
    assert trial_gpu_count(four, None, "trainer.nproc_per_node") == 2
    assert trial_gpu_count(four, 3, "trainer.nproc_per_node") == 3
    assert trial_gpu_count(four, 0, "trainer.nproc_per_node") == 0
    with pytest.raises(ValueError, match=r"^trainer.nproc_per_node=8 is not allowed here: this machine has 4 GPU\(s\)"):
        trial_gpu_count(four, 8, "trainer.nproc_per_node")
    cpu_only = plan_local_run(None, [], CPUS)
    assert trial_gpu_count(cpu_only, 8, "trainer.nproc_per_node") == 0


def test_gpus_are_taken_from_the_free_ones_and_pinned():
    assert take_gpus(("0", "1", "2", "3"), 2) == (("0", "1"), ("2", "3"))
    assert take_gpus(("3",), 2) is None
    plan = plan_local_run(None, ["0", "1"], CPUS)
    assert trial_environment(plan, ("1",)) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert trial_environment(plan, ()) == {"CUDA_VISIBLE_DEVICES": ""}
    assert trial_environment(plan_local_run(None, [], CPUS), ()) == {}


def test_visible_gpus_follow_cuda_visible_devices_as_written():
    assert visible_gpu_ids({}, 4) == ("0", "1", "2", "3")
    assert visible_gpu_ids({"CUDA_VISIBLE_DEVICES": "2,5"}, 8) == ("2", "5")
    assert visible_gpu_ids({"CUDA_VISIBLE_DEVICES": "GPU-a1b2, GPU-c3d4"}, 8) == ("GPU-a1b2", "GPU-c3d4")
    assert visible_gpu_ids({"CUDA_VISIBLE_DEVICES": "1,-1,2"}, 8) == ("1",)
    assert visible_gpu_ids({"CUDA_VISIBLE_DEVICES": ""}, 8) == ()


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True])
def test_a_bad_parallelism_names_the_key(value):
    with pytest.raises(ValueError, match=r"^hydra.launcher.local_parallelism=.* is not allowed: a whole number >= 1"):
        plan_local_run(value, [], CPUS)


def test_a_stopped_sweep_says_once_why_then_each_trial():
    stopped = ["interrupted: trial #0 stopped at step 12 with a checkpoint",
               "interrupted: trial #1 stopped at step 9 with a checkpoint"]
    assert stop_summary("interrupted", stopped, [], [2, 3]) == (
        "interrupted: trial #0 stopped at step 12 with a checkpoint; trial #1 stopped at step 9 with a checkpoint; "
        "trials #2, #3 were not started"
    )
    assert stop_summary("interrupted", [], [4], [5]) == (
        "interrupted: trial #4 ended without a checkpoint; trial #5 was not started"
    )
    assert stop_summary(None, stopped[:1], [], []) == stopped[0]
