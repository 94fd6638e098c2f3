"""Trial config + launcher settings -> submitit parameters, and the checks before submission."""

import pytest

from hpcsweep.config import trial_config_from_dict
from hpcsweep.sweep.allocation import (
    allocation_key,
    check_option_values,
    check_time_limit,
    chunk,
    executor_parameters,
)
from hpcsweep.sweep.hpcsweep_hook import trial_allocation

LAUNCHER = {
    "submitit_folder": "/s/.submitit/%j",
    "name": "hpcsweep",
    "timeout_min": 60,
    "cpus_per_task": 64,
    "gpus_per_node": 8,
    "mem": "480G",
    "partition": "batch",
    "qos": None,
    "signal_delay_s": 120,
    "max_num_timeout": 20,
    "array_parallelism": 2,
    "additional_parameters": {"mail-type": "FAIL"},
    "wait": False,
}


def trial(**trainer):
    return trial_allocation(trial_config_from_dict({"trainer": trainer}))


def test_nodes_come_from_the_trial_with_one_task_per_node():
    params = executor_parameters(trial(nodes=4), LAUNCHER)
    assert params["nodes"] == 4
    assert params["tasks_per_node"] == 1
    assert params["gpus_per_node"] == 8
    assert params["slurm_partition"] == "batch"
    assert params["slurm_mem"] == "480G"
    assert params["slurm_array_parallelism"] == 2
    assert params["slurm_additional_parameters"] == {"requeue": True, "mail-type": "FAIL"}
    assert "slurm_qos" not in params and "wait" not in params and "slurm_max_num_timeout" not in params


def test_a_bad_exit_on_any_node_ends_the_trial_and_max_retries_stays_ours():
    params = executor_parameters(trial(nodes=2), {**LAUNCHER, "max_retries": 1})
    assert params["slurm_srun_args"] == ["--kill-on-bad-exit=1"]
    assert not any("max_retries" in key for key in params)


def test_explicit_nproc_per_node_sets_the_gpus_asked_for():
    assert executor_parameters(trial(nproc_per_node=4), LAUNCHER)["gpus_per_node"] == 4


def test_cpu_partitions_ask_for_no_gpus():
    params = executor_parameters(trial(nproc_per_node=2), {**LAUNCHER, "gpus_per_node": 0})
    assert "gpus_per_node" not in params


def test_topology_options_join_additional_parameters():
    params = executor_parameters(trial(nodes=2), LAUNCHER, {"switches": "1@00:10:00"})
    assert params["slurm_additional_parameters"]["switches"] == "1@00:10:00"


def test_trials_of_different_shapes_do_not_share_an_array():
    one = allocation_key(executor_parameters(trial(nodes=1), LAUNCHER))
    same = allocation_key(executor_parameters(trial(nodes=1, max_steps=7), LAUNCHER))
    two = allocation_key(executor_parameters(trial(nodes=2), LAUNCHER))
    assert one == same != two


@pytest.mark.parametrize(
    "params",
    [
        {"comment": "x\nrm -rf /"},
        {"additional_parameters": {"mail-user": "a@b\n#SBATCH --uid=0"}},
        {"constraint": "a100\r"},
    ],
)
def test_values_that_would_start_a_new_script_line_are_rejected(params):
    with pytest.raises(ValueError, match="must not contain newlines"):
        check_option_values(params)


def test_shell_syntax_without_newlines_is_left_to_submitit_quoting():
    check_option_values({"comment": "$(touch /tmp/x); `id`"})


def test_chunk_splits_at_max_array_size():
    assert [list(c) for c in chunk(list(range(5)), 2)] == [[0, 1], [2, 3], [4]]
    assert [list(c) for c in chunk(list(range(4)), 4)] == [[0, 1, 2, 3]]


def test_excluded_nodes_from_launcher_topology_and_placement_are_merged():
    config = trial_allocation(trial_config_from_dict({"topology": {"exclude": ["node2"]}}))
    params = executor_parameters(config, {**LAUNCHER, "exclude": "node4,node1"}, {"exclude": "node3", "switches": "1@00:10:00"})
    assert params["slurm_exclude"] == "node1,node2,node3,node4"
    assert "exclude" not in params["slurm_additional_parameters"]


def test_auto_workers_follow_the_launchers_gpus():
    assert executor_parameters(trial(), LAUNCHER)["gpus_per_node"] == 8
    assert executor_parameters(trial(nproc_per_node=1), LAUNCHER)["gpus_per_node"] == 1


TIME_LIMIT = {"timeout_min": 1, "signal_delay_s": 5, "max_num_timeout": 0}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"timeout_min": 0}, r"hydra.launcher.timeout_min=0 is not allowed: a whole number of minutes >= 1"),
        ({"timeout_min": 1.5}, r"timeout_min=1.5"),
        ({"signal_delay_s": 60}, r"signal_delay_s=60 is not allowed: whole seconds from 1 to 59 \(below timeout_min=1"),
        ({"signal_delay_s": 0}, r"signal_delay_s=0 is not allowed"),
        ({"timeout_min": 2000, "signal_delay_s": 70000}, r"from 1 to 65535"),
        ({"max_num_timeout": -1}, r"hydra.launcher.max_num_timeout=-1 is not allowed: a whole number >= 0"),
        ({"max_retries": -1}, r"hydra.launcher.max_retries=-1 is not allowed: a whole number >= 0"),
        ({"max_retries": "2"}, r"hydra.launcher.max_retries='2' is not allowed"),
    ],
)
def test_time_limit_settings_that_would_loop_or_never_warn_are_rejected(change, message):
    with pytest.raises(ValueError, match=message):
        check_time_limit({**TIME_LIMIT, **change})


def test_a_warning_inside_the_time_limit_is_accepted():
    check_time_limit(TIME_LIMIT)
    check_time_limit({"timeout_min": 240, "signal_delay_s": 120, "max_num_timeout": 20})
