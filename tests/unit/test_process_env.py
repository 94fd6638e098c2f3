"""The trial's variables last as long as the trial: set, then each put back as it was, set or unset."""

import pytest

from hpcsweep.trial.process_env import environment_overlay


def test_each_variable_is_put_back_as_it_was():
    environ = {"NCCL_IB_DISABLE": "0", "PATH": "/bin"}
    with environment_overlay({"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_NTHREADS": "4"}, environ):
        assert environ == {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_NTHREADS": "4", "PATH": "/bin"}
    assert environ == {"NCCL_IB_DISABLE": "0", "PATH": "/bin"}


def test_the_environment_comes_back_when_the_trial_raises():
    environ: dict[str, str] = {}
    with pytest.raises(RuntimeError), environment_overlay({"NCCL_IB_DISABLE": "1"}, environ):
        raise RuntimeError("trial failed")
    assert environ == {}


def test_what_the_trial_set_itself_goes_too():
    environ = {"PATH": "/bin"}
    with environment_overlay({"NCCL_IB_DISABLE": "1"}, environ):
        environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # as an in-process worker exports it
        environ["PATH"] = "/changed"
    assert environ == {"PATH": "/bin"}
