"""Stop signals and requeue decisions: the pure parts on literals, the signal plumbing for real."""

import os
import signal
import threading
import time

import pytest
import torch

from hpcsweep.config import trial_config_from_dict
from hpcsweep.control import exit_codes, stop
from hpcsweep.control.exit_codes import EXIT_INTERRUPTED, EXIT_REQUEUE, EXIT_STOPPED
from hpcsweep.control.stop import (
    BUDGET,
    INTERRUPTED,
    PREEMPTED,
    TIME_LIMIT,
    StopRequest,
)
from hpcsweep.control.outcome import Outcome
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.trial import preempt, runner, settle
from hpcsweep.trial.attempt import Caps, build_attempt, free_port

from .trial_dirs import trial_config

torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("signum", "reason"), [(signal.SIGUSR2, TIME_LIMIT), (signal.SIGTERM, PREEMPTED), (signal.SIGINT, INTERRUPTED)]
)
def test_each_stop_signal_has_its_reason(signum, reason):
    assert stop.stop_reason(signum) == reason


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGHUP, 9999])
def test_other_signals_are_not_stops(signum):
    with pytest.raises(ValueError, match="not a stop signal"):
        stop.stop_reason(signum)


def test_the_cap_comes_from_the_launchers_config():
    assert Caps.from_launcher({}).max_requeues is None
    assert Caps.from_launcher({"max_num_timeout": 2}).max_requeues == 2
    with pytest.raises(ValueError, match=r"hydra.launcher.max_num_timeout=-1 is not allowed"):
        Caps.from_launcher({"max_num_timeout": -1})


@pytest.mark.parametrize(
    ("requeues", "cap", "over"), [(0, None, False), (5, None, False), (0, 0, False), (1, 0, True), (2, 2, False), (3, 2, True)]
)

def test_a_trial_starting_beyond_its_cap_fails(requeues, cap, over):
    error = preempt.over_cap_error(requeues, cap)
    assert (error is not None) == over
    if over:
        assert f"requeued {requeues} times" in error and f"max_num_timeout={cap}" in error


@pytest.mark.parametrize(
    ("codes", "status", "outcome"),
    [
        ([0], "completed", "completed"),
        ([0, 0], "stopped_early", "completed"),
        ([EXIT_STOPPED], "running", "stopped"),
        # torchrun terminates the other workers once one exits: their codes are -SIGTERM.
        ([EXIT_STOPPED, -signal.SIGTERM], "running", "stopped"),
        ([EXIT_STOPPED, EXIT_STOPPED], "running", "stopped"),
        # Ctrl-C reaches every worker; one may leave after a second one, the others stop.
        ([EXIT_STOPPED, EXIT_INTERRUPTED], "running", "stopped"),
        # Node 1 of a budget-stopped 2-node trial, settling after node 0 marked the trial stopped.
        ([EXIT_STOPPED], "stopped", "stopped"),
        ([1, EXIT_STOPPED], "running", "failed"),
        ([EXIT_STOPPED], "failed", "failed"),
        ([1], "failed", "failed"),
        ([0], "failed", "failed"),
        ([-signal.SIGKILL], "running", "failed"),
        ([], None, "failed"),
    ],
)
def test_the_outcome_comes_from_exit_codes_and_status(codes, status, outcome):
    assert preempt.classify_exit(codes, status) == outcome


@pytest.mark.parametrize(
    ("reason", "requeues", "cap", "under_slurm", "action"),
    [
        (TIME_LIMIT, 0, 20, True, "requeue"),
        (PREEMPTED, 0, 20, True, "slurm_requeues"),
        ("test_hook", 0, None, True, "requeue"),
        (TIME_LIMIT, 2, 2, True, "fail"),
        (PREEMPTED, 1, 0, True, "fail"),
        (PREEMPTED, 0, 0, True, "fail"),
        (TIME_LIMIT, 9, 2, False, "exit"),
        # Ctrl-C is the user's stop: never requeued, on Slurm (srun) or not, whatever the cap.
        (INTERRUPTED, 0, 20, True, "exit"),
        (INTERRUPTED, 5, 2, False, "exit"),
        # A spent GPU-hour budget is the sweep's stop: never requeued either.
        (BUDGET, 0, 20, True, "exit"),
        (BUDGET, 3, 2, True, "exit"),
    ],
)
def test_what_follows_a_stop(reason, requeues, cap, under_slurm, action):
    decision = preempt.decide_after_stop(reason, requeues, cap, under_slurm)
    assert decision.action == action
    if action == "fail":
        assert f"max_num_timeout={cap}" in decision.message and reason in decision.message


def test_the_first_stop_reason_wins_until_cleared():
    request = stop.StopRequest()
    request.set(TIME_LIMIT)
    request.set(PREEMPTED)
    assert request.is_set() and request.reason == TIME_LIMIT and request.requested_at is not None
    request.clear()
    assert not request.is_set() and request.reason is None and request.requested_at is None


def test_a_real_signal_calls_the_handler_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGUSR2), signal.getsignal(signal.SIGINT)
    got = []
    with stop.stop_signals_handled(got.append):
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    assert got == [TIME_LIMIT, PREEMPTED, INTERRUPTED]
    assert (signal.getsignal(signal.SIGUSR2), signal.getsignal(signal.SIGINT)) == before


def test_a_second_ctrl_c_aborts_as_a_keyboard_interrupt():
    before = signal.getsignal(signal.SIGINT)
    got = []
    with pytest.raises(KeyboardInterrupt, match="interrupted again while stopping"):
        with stop.stop_signals_handled(got.append):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
    assert got == [INTERRUPTED, PREEMPTED]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_signal_blocked_in_a_thread_reaches_the_main_thread():
    got = []
    entered, release = threading.Event(), threading.Event()

    def blocked_thread():
        with stop.stop_signals_blocked():
            entered.set()
            release.wait(10)

    with stop.stop_signals_handled(got.append):
        thread = threading.Thread(target=blocked_thread)
        thread.start()
        assert entered.wait(10)
        os.kill(os.getpid(), signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()
        thread.join(10)
    assert got == [TIME_LIMIT]


def test_the_stop_file_hook_sets_the_stop_with_its_reason(tmp_path):
    path = TrialFiles(tmp_path).stop_file(1)
    request = stop.StopRequest()
    (hook,) = stop.stop_file_hooks(path, request)
    hook(None, 1)
    assert not request.is_set()
    stop.write_stop_file(path, PREEMPTED)
    hook(None, 2)
    assert request.reason == PREEMPTED
    assert stop.stop_file_hooks(None, request) == []


def test_leaving_for_a_requeue_passes_through_except_exception(monkeypatch):
    requeued = []
    monkeypatch.setattr(exit_codes, "requeue_job", requeued.append)
    with pytest.raises(SystemExit) as info:
        try:
            exit_codes.leave(Outcome("requeue", "requeueing", requeue_job="77_1"))
        except Exception:  # noqa: BLE001  (what Hydra's run_job and submitit's process_job catch)
            pytest.fail("leaving for a requeue must not be an Exception")
    assert type(info.value) is SystemExit and info.value.code == EXIT_REQUEUE and requeued == ["77_1"]


def test_after_a_stop_other_nodes_exit_0_and_leave_the_record_and_requeue_to_node_0(tmp_path, monkeypatch):
    # srun --kill-on-bad-exit would otherwise end node 0 before it has recorded the stop and requeued.
    from hpcsweep.files.metrics_file import write_metrics

    write_metrics(tmp_path / "metrics.json", {"status": "running", "step": 7})
    before = (tmp_path / "metrics.json").read_text()
    requeued = []
    monkeypatch.setattr(exit_codes, "requeue_job", requeued.append)
    job = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NNODES": "2"}
    signalled = StopRequest()
    signalled.set(TIME_LIMIT)
    node1 = build_attempt(small_trial(), tmp_path, {**job, "SLURM_NODEID": "1"}, caps=Caps(max_requeues=20))
    other = settle.after_stop(node1, signalled)
    assert other.kind == "node_done" and exit_codes.carry_out(other) == 0
    assert (tmp_path / "metrics.json").read_text() == before and requeued == []
    node0 = build_attempt(small_trial(), tmp_path, {**job, "SLURM_NODEID": "0"}, caps=Caps(max_requeues=20))
    first = settle.after_stop(node0, signalled)
    assert first.kind == "requeue" and exit_codes.carry_out(first) == EXIT_REQUEUE and requeued == ["77"]
    assert metrics_of(tmp_path)["last_stop_reason"] == TIME_LIMIT


def metrics_of(trial_dir):
    from hpcsweep.files.metrics_file import read_metrics

    return read_metrics(trial_dir / "metrics.json")


def small_trial():
    return trial_config_from_dict(trial_config({
        "data.batch_size": 4, "data.seq_len": 32, "data.synthetic_tokens": 50_000, "trainer.device": "cpu",
        "trainer.max_steps": 6, "trainer.warmup_steps": 2, "trainer.eval_every": 6, "trainer.eval_batches": 1,
        "trainer.log_every": 1, "trainer.ckpt_every": 0, "trainer.nproc_per_node": 1,
    }))


@pytest.mark.parametrize(("signum", "reason", "code"), [
    (signal.SIGUSR2, TIME_LIMIT, EXIT_STOPPED), (signal.SIGINT, INTERRUPTED, EXIT_INTERRUPTED),
])
def test_a_signal_to_a_local_in_process_trial_saves_and_marks_it_stopped(tmp_path, monkeypatch, signum, reason, code):
    trial_dir = tmp_path / "trial"
    # The hook stands in for the signal arriving mid-run: a real signal to this process.
    monkeypatch.setattr(stop, "stop_file_hooks", lambda path, stop: [
        lambda trainer, step: os.kill(os.getpid(), signum) if step == 3 else None
    ])
    outcome = runner.run_trial_on_this_node(small_trial(), trial_dir, env={})
    assert (outcome.kind, exit_codes.exit_code(outcome), outcome.reason, outcome.step) == ("stopped", code, reason, 3)
    metrics = metrics_of(trial_dir)
    assert (metrics["status"], metrics["step"], metrics["last_stop_reason"]) == ("stopped", 3, reason)
    assert metrics["stop_to_exit_s"] < 30
    assert not stop.STOP_REQUESTED.is_set()


def test_a_slurm_time_limit_signal_leaves_for_requeue(tmp_path, monkeypatch):
    trial_dir = tmp_path / "trial"
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    monkeypatch.setattr(stop, "stop_file_hooks", lambda path, stop: [
        lambda trainer, step: os.kill(os.getpid(), signal.SIGUSR2) if step == 3 else None
    ])
    outcome = runner.run_trial_on_this_node(small_trial(), trial_dir, env=env)
    assert (outcome.kind, outcome.requeue_job) == ("requeue", "77")  # the edge requeues: tests/cluster
    metrics = metrics_of(trial_dir)
    assert (metrics["status"], metrics["step"], metrics["last_stop_reason"]) == ("running", 3, TIME_LIMIT)


def test_a_trial_requeued_beyond_its_cap_fails_before_training(tmp_path):
    trial_dir = tmp_path / "trial"
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
           "SLURM_RESTART_COUNT": "2", "MASTER_ADDR": "127.0.0.1"}
    outcome = runner.run_trial_on_this_node(small_trial(), trial_dir, env=env, caps=Caps(max_requeues=1))
    assert outcome.kind == "failed" and "max_num_timeout=1" in outcome.message
    metrics = metrics_of(trial_dir)
    assert metrics["status"] == "failed" and "requeued 2 times" in metrics["error"]
