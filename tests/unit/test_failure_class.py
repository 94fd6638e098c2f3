"""Failures classified from exit codes, Slurm job states and error text; the retry decision."""

from __future__ import annotations

import pytest

from hpcsweep.slurm.cluster_info import excluded_after
from hpcsweep.trial import failure_class as fc
from hpcsweep.trial.attempt import Caps
from hpcsweep.trial.failure_class import Failure
from hpcsweep.trial.failures import (
    FailureDecision,
    decide_after_failure,
    retries_so_far,
)

NCCL_TEXT = """Traceback (most recent call last):
  File "train.py", line 3, in step
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275,
unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error."""
GLOO_TEXT = """Traceback (most recent call last):
  File "/venv/torch/distributed/distributed_c10d.py", line 2050, in all_reduce
    work.wait()
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4162"""
NCCL_TIMEOUT = (
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 1800000 ms"
)
MODEL_ERROR = """Traceback (most recent call last):
  File "model.py", line 40, in forward
    x = self.proj(x)
RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x64 and 32x64)"""
NAN_LOSS = "ValueError: loss is nan at step 12"
CUDA_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"


@pytest.mark.parametrize(
    ("exit_code", "text", "kind"),
    [
        (-9, "", fc.SIGNAL),  # SIGKILL: the OOM killer or a kill -9
        (-11, "Fatal Python error: Segmentation fault", fc.SIGNAL),
        (-6, "", fc.SIGNAL),  # SIGABRT
        (-7, "", fc.SIGNAL),  # SIGBUS
        (137, "", fc.SIGNAL),  # a shell's 128 + 9
        (139, "", fc.SIGNAL),  # a shell's 128 + 11
        (-15, "", fc.TERMINATED),  # torchrun ending a failed worker's siblings
        (143, "", fc.TERMINATED),
        (1, NCCL_TEXT, fc.COMMUNICATION),
        (1, GLOO_TEXT, fc.COMMUNICATION),
        (1, NCCL_TIMEOUT, fc.COMMUNICATION),
        (1, "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", fc.COMMUNICATION),
        (1, MODEL_ERROR, fc.CODE),
        (1, NAN_LOSS, fc.CODE),
        (1, CUDA_OOM, fc.CODE),
        (1, "", fc.CODE),
        (2, "usage: python -m hpcsweep.train [-h] trial_dir", fc.CODE),
    ],
)
def test_exit_codes_and_error_text_classify_the_failure(exit_code, text, kind):
    assert fc.classify_exit_code(exit_code, text) == kind


def test_exit_code_zero_is_no_failure():
    with pytest.raises(ValueError, match="exit code 0 is no failure"):
        fc.classify_exit_code(0)


@pytest.mark.parametrize(
    ("state", "kind"),
    [("NODE_FAIL", fc.NODE_FAILURE), ("OUT_OF_MEMORY", fc.OOM_KILLED), ("BOOT_FAIL", fc.NODE_FAILURE),
     ("node_fail", fc.NODE_FAILURE), ("FAILED", None), ("CANCELLED by 1000", None), ("TIMEOUT", None),
     ("COMPLETED", None), ("", None)],
)
def test_slurm_states_classify_the_failure(state, kind):
    assert fc.classify_slurm_state(state) == kind


@pytest.mark.parametrize(
    ("kind", "retried"),
    [(fc.CODE, False), (fc.COMMUNICATION, True), (fc.SIGNAL, True), (fc.OOM_KILLED, True),
     (fc.NODE_FAILURE, True), (fc.HANG, True), (fc.TERMINATED, True)],
)
def test_only_infrastructure_failures_are_retried(kind, retried):
    assert fc.is_retried(kind) is retried


def failure(kind, rank, at, node="node2", exit_code=1):
    return Failure(kind, node, rank, exit_code, "", at)


def test_the_crashed_rank_explains_the_broken_collectives_and_terminated_siblings():
    crash = failure(fc.SIGNAL, 3, at=10.0, exit_code=-11)
    others = [failure(fc.COMMUNICATION, 0, at=9.5, node="node1"), failure(fc.TERMINATED, 2, at=10.0, exit_code=-15)]
    assert fc.root_cause([*others, crash]) is crash


def test_a_code_error_outweighs_the_communication_errors_it_caused():
    code = failure(fc.CODE, 1, at=5.0)
    assert fc.root_cause([failure(fc.COMMUNICATION, 0, at=4.0), code]) is code


def test_among_equal_classes_the_earliest_failure_is_the_cause():
    first, later = failure(fc.COMMUNICATION, 2, at=1.0), failure(fc.COMMUNICATION, 0, at=2.0)
    assert fc.root_cause([later, first]) is first


def test_no_failures_have_no_root_cause():
    with pytest.raises(ValueError):
        fc.root_cause([])


def test_summary_names_class_rank_node_and_signal():
    crash = failure(fc.SIGNAL, 3, 0.0, exit_code=-11)
    assert crash.summary() == "signal failure of rank 3 on node2, exit -11 (SIGSEGV)"
    assert Failure(fc.HANG, "node1", None, None, "", 0.0).summary() == "hang failure of node node1"


def test_infrastructure_failures_are_retried_under_slurm_up_to_max_retries():
    crash = failure(fc.SIGNAL, 3, 0.0, exit_code=-9)
    assert decide_after_failure(crash, 0, 2, under_slurm=True) == FailureDecision(
        "retry", "signal failure of rank 3 on node2, exit -9 (SIGKILL): retry 1 of 2, excluding node2"
    )
    assert decide_after_failure(crash, 1, 2, under_slurm=True).action == "retry"
    final = decide_after_failure(crash, 2, 2, under_slurm=True)
    assert final.action == "fail" and "max_retries=2 (hydra.launcher.max_retries)" in final.message
    assert decide_after_failure(crash, 0, 0, under_slurm=True).action == "fail"


def test_code_failures_and_failures_outside_slurm_are_not_retried():
    code = decide_after_failure(failure(fc.CODE, 0, 0.0), 0, 2, under_slurm=True)
    assert code.action == "fail" and "own code or config" in code.message
    local = decide_after_failure(failure(fc.HANG, 0, 0.0), 0, 2, under_slurm=False)
    assert local.action == "fail" and "retried only under Slurm" in local.message


def test_retries_so_far_counts_the_retried_failures():
    assert retries_so_far({}) == 0
    assert retries_so_far({"failures": [{"retried": True}, {"retried": False}, {"retried": True}]}) == 2


@pytest.mark.parametrize(
    ("launcher", "expected"), [({}, 2), ({"max_retries": 0}, 0), ({"max_retries": 5}, 5), ({"max_retries": None}, 2)]
)
def test_max_retries_comes_from_the_launchers_config(launcher, expected):
    assert Caps.from_launcher(launcher).max_retries == expected


def test_a_bad_max_retries_names_the_key():
    with pytest.raises(ValueError, match=r"hydra.launcher.max_retries=-1 is not allowed: a whole number >= 0"):
        Caps.from_launcher({"max_retries": -1})


def test_the_failed_node_joins_the_job_s_excluded_nodes():
    running = "JobId=12 ArrayJobId=11 JobName=x ReqNodeList=(null) ExcNodeList=node[3-4] NodeList=node1,node2"
    assert excluded_after(running, ["node2"]) == ["node2", "node3", "node4"]
    assert excluded_after("JobId=12 ExcNodeList=(null) NodeList=node1", ["node1"]) == ["node1"]


def test_a_run_slurm_ended_for_a_node_failure_or_oom_is_found_on_the_next_start():
    from hpcsweep.trial.failures import slurm_ended_run

    runs = "NODE_FAIL|node[1-2]\nRUNNING|node[3-4]\n"
    found = slurm_ended_run(runs, restart_count=1)
    assert (found.kind, found.node, found.rank) == (fc.NODE_FAILURE, "node[1-2]", None)
    assert "NODE_FAIL" in found.traceback
    assert slurm_ended_run("OUT_OF_MEMORY|node1\nRUNNING|node2\n", 1).kind == fc.OOM_KILLED
    # Requeued by the trial itself (a stop or a retry it recorded), preempted, or the first run: nothing.
    assert slurm_ended_run("REQUEUED|node1\nRUNNING|node2\n", 1) is None
    assert slurm_ended_run("PREEMPTED|node1\nRUNNING|node2\n", 1) is None
    assert slurm_ended_run("RUNNING|node1\n", 0) is None
    assert slurm_ended_run("", 2) is None
