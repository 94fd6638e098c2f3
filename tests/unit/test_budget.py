"""The GPU-hour budget: sacct usage, the arithmetic, the worst case, local usage files, and a trial's view."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest

from hpcsweep.files.sweep_record import ArrayRecord, SweepRecord, TrialRecord, write_sweep_record
from hpcsweep.files.usage_file import USAGE_FILE, LocalRun, local_spending, read_runs, start_run, touch_run
from hpcsweep.results.budget import BudgetView, budget_flag, budget_reached, usage_of_local_trials, usage_of_states
from hpcsweep.slurm.job_states import parse_sacct
from hpcsweep.slurm.usage import Usage, nodes_from_tres, run_hours, units_from_tres
from hpcsweep.sweep.budget import check_budget, worst_case_hours, worst_case_line
from hpcsweep.sweep.hooks import Allocation, SweepTrial
from hpcsweep.control.stop import read_stop_file
from hpcsweep.trial import budget_watch
from hpcsweep.trial.rendezvous import Rendezvous

from .fake_slurm import fake_slurm  # noqa: F401 (a fixture)

SACCT = """\
70_0|PREEMPTED|1800|billing=8,cpu=8,gres/gpu=8,node=1|gpu01
70_0|COMPLETED|3600|billing=8,cpu=8,gres/gpu=4,node=1|gpu02
70_1|RUNNING|900|billing=16,cpu=16,gres/gpu:a100=8,node=2|gpu[03-04]
70_2|COMPLETED|7200|billing=64,cpu=64,node=2|cpu[01-02]
70_[3-5%2]|PENDING|0||None assigned
"""


def test_units_are_gpus_or_nodes_without_gpus():
    assert units_from_tres("billing=8,cpu=8,gres/gpu=2,node=1") == 2
    assert units_from_tres("cpu=16,gres/gpu:a100=4,gres/gpu:v100=2,node=2") == 6
    assert units_from_tres("cpu=64,mem=100G,node=3") == 3
    assert units_from_tres("") == 0
    assert nodes_from_tres("cpu=64,gres/gpu=8") == 0
    assert run_hours(1800, "cpu=8,gres/gpu=8,node=1") == 4.0


def test_sacct_usage_counts_every_run_with_its_own_allocation():
    states = parse_sacct(SACCT)
    # The preempted run held 8 GPUs for half an hour, the requeued one 4 GPUs for an hour.
    assert states["70_0"].used_hours == pytest.approx(4.0 + 4.0)
    assert states["70_0"].units == 4
    assert states["70_1"].used_hours == pytest.approx(2.0)
    assert states["70_2"].used_hours == pytest.approx(4.0)  # no GPU: node-hours, 2 nodes x 2 h
    assert states["70_4"].used_hours == 0.0 and states["70_4"].units == 0
    usage = usage_of_states(states)
    assert usage == Usage(spent_hours=pytest.approx(14.0), burn_per_hour=8.0)


def test_budget_reached_looks_ahead_by_the_burn_rate():
    usage = Usage(spent_hours=9.0, burn_per_hour=8.0)
    assert not budget_reached(usage, None, 3600)
    assert not budget_reached(usage, 10.0, 0)
    assert not budget_reached(usage, 10.0, 300)  # 9 + 8 x 5 min = 9.67
    assert budget_reached(usage, 10.0, 450)  # 9 + 8 x 7.5 min = 10
    assert budget_reached(Usage(10.0, 0.0), 10.0, 0)


def test_flags_at_80_and_100_percent():
    assert budget_flag(7.9, 10.0) == ""
    assert budget_flag(8.0, 10.0) == "80% OF BUDGET"
    assert budget_flag(10.0, 10.0) == "BUDGET SPENT"
    assert budget_flag(100.0, None) == ""
    # The watches stop a sweep a little before 100 %: a trial the budget stopped flags it as spent.
    assert budget_flag(7.0, 10.0, stopped_by_budget=True) == "BUDGET SPENT"
    assert BudgetView(8.5, 10.0).line() == "budget: 8.5 / 10 GPU-hours spent (85%)  80% OF BUDGET"
    assert BudgetView(0.00123, None).line() == "budget: 0.00123 GPU-hours spent (no budget)"
    assert BudgetView(1.0, 10.0).line() == "budget: 1 / 10 GPU-hours spent (10%)"


def test_budget_value_is_checked():
    assert check_budget({}) is None
    assert check_budget({"budget_gpu_hours": None}) is None
    assert check_budget({"budget_gpu_hours": 12}) == 12.0
    for bad in (0, -1.5, "ten", True):
        with pytest.raises(ValueError, match=r"hydra.launcher.budget_gpu_hours=.* is not allowed: a number of GPU-hours > 0"):
            check_budget({"budget_gpu_hours": bad})


def _trials(*shapes):
    return [SweepTrial(n, [], None, Allocation(nodes=nodes, gpus_per_node=gpus)) for n, (nodes, gpus) in enumerate(shapes)]


def test_worst_case_is_trials_nodes_gpus_and_time_limit():
    params = {"timeout_min": 90, "gpus_per_node": 8}
    trials = _trials((1, None), (2, None), (2, 4))
    assert worst_case_hours(trials, params) == pytest.approx(1.5 * (8 + 16 + 8))
    line = worst_case_line(trials, params, 20.0)
    assert line.startswith("worst case 48 GPU-hours ([1 trial x 1 node x 8 GPUs + 1 trial x 2 nodes x 4 GPUs "
                           "+ 1 trial x 2 nodes x 8 GPUs] x 90 min)")
    assert line.endswith("budget 20 GPU-hours: trials stop, or never start, once the budget is spent")
    assert worst_case_line(_trials((2, None), (2, None), (2, None)), {"timeout_min": 240, "gpus_per_node": 8}, None) \
        == "worst case 192 GPU-hours (3 trials x 2 nodes x 8 GPUs x 240 min); no budget"
    cpu = {"timeout_min": 60, "gpus_per_node": 0}
    assert worst_case_hours(_trials((2, 4)), cpu) == 2.0
    assert "no budget" in worst_case_line(_trials((2, 4)), cpu, None)


def test_worst_case_of_a_packed_sweep_counts_tasks_not_trials():
    # trials_per_task=2: 4 trials run in 2 tasks, each holding its GPUs for one time limit.
    params = {"timeout_min": 240, "gpus_per_node": 8, "trials_per_task": 2}
    trials = _trials(*[(1, None)] * 4)
    assert worst_case_hours(trials, params) == pytest.approx(2 * 8 * 4.0)
    assert worst_case_line(trials, params, None) == \
        "worst case 64 GPU-hours (2 tasks (4 trials, 2 per task) x 1 node x 8 GPUs x 240 min); no budget"
    # An odd count leaves a last task of one trial; each shape packs apart (one array per shape).
    mixed = _trials((1, None), (1, None), (1, None), (2, None))
    assert worst_case_hours(mixed, params) == pytest.approx((2 * 8 + 1 * 16) * 4.0)
    assert "([2 tasks (3 trials, 2 per task) x 1 node x 8 GPUs + 1 task (1 trial, 2 per task) x 2 nodes x 8 GPUs] x 240 min)" \
        in worst_case_line(mixed, params, None)


def test_local_usage_file_records_each_run(tmp_path):
    path = tmp_path / USAGE_FILE
    start_run(path, 2, now=1000.0)
    touch_run(path, now=1900.0)
    touch_run(path, now=2800.0, ended=True)
    start_run(path, 2, now=5000.0)
    touch_run(path, now=5360.0)
    assert read_runs(path) == [LocalRun(1000.0, 2800.0, 2, True), LocalRun(5000.0, 5360.0, 2, False)]
    spent, burn = local_spending(read_runs(path))
    assert spent == pytest.approx(2 * 0.5 + 2 * 0.1) and burn == 2.0
    assert usage_of_local_trials([tmp_path, tmp_path / "none"]).spent_hours == pytest.approx(1.2)
    assert read_runs(tmp_path / "missing.json") == []


TRIAL = SimpleNamespace(trainer=SimpleNamespace(device="cpu", max_steps=8))
"""What the budget watch reads of a trial's config."""
NODE0 = Rendezvous("127.0.0.1", 29500, nnodes=1, node_rank=0, nproc_per_node=1, rdzv_id="t")


def _local_sweep(tmp_path, budget, spent_seconds):
    """A local sweep of two trials whose trial 0 has used ``spent_seconds`` of one GPU."""
    trials = [TrialRecord(n, [], str(tmp_path / str(n)), None, "2026-01-01T00:00:00+00:00") for n in (0, 1)]
    for trial in trials:
        (tmp_path / str(trial.num)).mkdir()
    start_run(tmp_path / "0" / USAGE_FILE, 1, now=0.0)
    touch_run(tmp_path / "0" / USAGE_FILE, now=spent_seconds, ended=True)
    write_sweep_record(SweepRecord(str(tmp_path), "local", "2026-01-01T00:00:00+00:00", trials, budget_gpu_hours=budget))


def test_a_trial_that_starts_after_the_budget_is_spent_is_skipped(tmp_path):
    _local_sweep(tmp_path, budget=1.0, spent_seconds=3600.0)
    assert budget_watch.skip_if_spent(TRIAL, tmp_path / "1", NODE0, env={})
    metrics = json.loads((tmp_path / "1" / "metrics.json").read_text())
    assert metrics["status"] == "skipped_budget" and metrics["step"] == 0 and metrics["max_steps"] == 8


def two_nodes(node_rank):
    return Rendezvous("127.0.0.1", 29500, nnodes=2, node_rank=node_rank, nproc_per_node=1, rdzv_id="7_1")


def test_the_nodes_of_a_multi_node_trial_follow_node_0s_decision(tmp_path, monkeypatch):
    _local_sweep(tmp_path, budget=1.0, spent_seconds=1800.0)
    judged = []

    def budget_spent(*args, **kwargs):
        # The budget runs out between node 0's look and any later one.
        judged.append(threading.current_thread().name)
        return len(judged) == 1

    monkeypatch.setattr(budget_watch, "budget_spent", budget_spent)
    skipped = {}
    node1 = threading.Thread(target=lambda: skipped.update(
        node1=budget_watch.skip_if_spent(TRIAL, tmp_path / "1", two_nodes(1), env={"SLURM_RESTART_COUNT": "2"})),
        name="node1")
    node1.start()
    time.sleep(0.3)  # node 1 is waiting for node 0's word by now
    skipped["node0"] = budget_watch.skip_if_spent(TRIAL, tmp_path / "1", two_nodes(0), env={"SLURM_RESTART_COUNT": "2"})
    node1.join(timeout=30)
    assert skipped == {"node0": True, "node1": True}
    assert judged == ["MainThread"], "node 1 did not judge the budget itself"

    # Another attempt (a requeue) does not read this one's decision: node 1 waits, then judges itself.
    monkeypatch.setattr(budget_watch, "DECISION_WAIT_S", 0.5)
    assert not budget_watch.skip_if_spent(TRIAL, tmp_path / "1", two_nodes(1), env={"SLURM_RESTART_COUNT": "3"})
    assert judged == ["MainThread", "MainThread"]


def test_a_trial_starts_while_budget_is_left_or_outside_a_sweep(tmp_path):
    _local_sweep(tmp_path, budget=1.0, spent_seconds=1800.0)
    assert not budget_watch.skip_if_spent(TRIAL, tmp_path / "1", NODE0, env={})
    assert not (tmp_path / "1" / "metrics.json").exists()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert not budget_watch.skip_if_spent(TRIAL, outside, NODE0, env={})


def test_the_watch_stops_a_running_trial_once_the_budget_runs_out(tmp_path):
    _local_sweep(tmp_path, budget=1.0, spent_seconds=3599.0)
    (tmp_path / "0" / "metrics.json").write_text(json.dumps({"status": "running", "step": 3}))
    stops: list[str] = []
    stopped = threading.Event()

    def on_stop(reason: str) -> None:
        stops.append(reason)
        stopped.set()

    started = time.monotonic()
    with budget_watch.watching(TRIAL, tmp_path / "1", NODE0, on_stop, {budget_watch.POLL_VAR: "0.05"}):
        assert stopped.wait(10), "the watch never stopped the trial"
    assert stops == ["budget"]
    assert time.monotonic() - started < 5
    # The other running trial of the sweep is asked to stop too, through its stop file.
    assert read_stop_file(tmp_path / "0" / "stop" / "node0.json") == "budget"
    assert not (tmp_path / "1" / "stop").exists()
    (run,) = read_runs(tmp_path / "1" / USAGE_FILE)
    assert run.ended and run.units == 1 and run.last_at >= run.started_at


def test_the_watch_leaves_a_trial_alone_while_budget_is_left(tmp_path):
    _local_sweep(tmp_path, budget=1.0, spent_seconds=0.0)
    stops: list[str] = []
    usage = tmp_path / "1" / USAGE_FILE
    with budget_watch.watching(TRIAL, tmp_path / "1", NODE0, stops.append, {budget_watch.POLL_VAR: "0.05"}):
        deadline = time.monotonic() + 10
        # Each poll moves the run's last record: wait for several polls, which must not stop it.
        while not (read_runs(usage) and read_runs(usage)[0].last_at - read_runs(usage)[0].started_at > 0.3):
            assert time.monotonic() < deadline, "the watch never polled"
            time.sleep(0.02)
    assert stops == []
    assert read_runs(tmp_path / "1" / USAGE_FILE)[0].ended


def test_poll_interval_is_checked():
    assert budget_watch.poll_interval({}) == budget_watch.DEFAULT_POLL_S
    assert budget_watch.poll_interval({budget_watch.POLL_VAR: "2.5"}) == 2.5
    with pytest.raises(ValueError, match="HPCSWEEP_BUDGET_POLL_S='0' is not allowed"):
        budget_watch.poll_interval({budget_watch.POLL_VAR: "0"})


def test_an_array_task_that_starts_before_sweep_json_still_watches(tmp_path, fake_slurm):  # noqa: F811
    scancel = fake_slurm.bin_dir / "scancel"
    scancel.write_text(f"#!/bin/sh\necho \"$*\" >> {fake_slurm.bin_dir / 'scancel.log'}\n")
    scancel.chmod(0o755)
    (tmp_path / "0").mkdir()
    fake_slurm.answer("sacct", "41_0|RUNNING|3600|cpu=1,gres/gpu=1,node=1|n1\n41_1|PENDING|0||None assigned\n")
    stopped = threading.Event()
    env = {budget_watch.POLL_VAR: "0.05", budget_watch.ARRAY_JOB_VAR: "41"}
    with budget_watch.watching(TRIAL, tmp_path / "0", NODE0, lambda reason: stopped.set(), env):
        trials = [TrialRecord(0, [], str(tmp_path / "0"), "41_0", "2026-01-01T00:00:00+00:00")]
        write_sweep_record(SweepRecord(str(tmp_path), "slurm", "2026-01-01T00:00:00+00:00", trials,
                                       [ArrayRecord("41", [0, 1])], budget_gpu_hours=1.0))
        assert stopped.wait(10), "the watch never found sweep.json"
    assert fake_slurm.calls("sacct")[0].startswith("--noheader --parsable2 --allocations --duplicates --jobs 41 ")
    assert fake_slurm.calls("scancel") == ["--state=PENDING 41"]
    assert not (tmp_path / "0" / USAGE_FILE).exists()  # on Slurm, accounting counts


def test_a_trial_the_look_ahead_would_stop_at_once_does_not_start(tmp_path):
    # 5 GPU-seconds left: less than one poll of this trial's own GPU, so it is skipped, not started.
    _local_sweep(tmp_path, budget=1.0, spent_seconds=3595.0)
    assert budget_watch.skip_if_spent(TRIAL, tmp_path / "1", NODE0, env={budget_watch.POLL_VAR: "1"})
