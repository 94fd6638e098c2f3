"""``python -m hpcsweep.retry``: which trials it selects, and every refusal submits nothing."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import cloudpickle
import pytest

from hpcsweep import retry
from hpcsweep.sweep.retry_selection import (
    TrialState,
    id_ranges,
    launcher_changes,
    parse_statuses,
    parse_trial_numbers,
    partition_change_line,
    select_trials,
)
from hpcsweep.sweep.retry_submit import retry_launcher_folder, submission_dir

from .fake_slurm import fake_slurm  # noqa: F401 (a fixture)
from .sweep_fixtures import make_sweep, metrics

SWEEP = [
    TrialState(0, "completed"),
    TrialState(1, "failed"),
    TrialState(2, "cancelled"),
    TrialState(3, "stopped", "budget"),
    TrialState(4, "skipped_budget"),
    TrialState(5, "stopped", "interrupted"),
]


def test_default_selects_failed_and_cancelled():
    assert select_trials(SWEEP) == [1, 2]


def test_skipped_budget_also_selects_the_trials_the_budget_stopped():
    assert select_trials(SWEEP, statuses=("skipped_budget", "cancelled")) == [2, 3, 4]
    assert select_trials(SWEEP, statuses=("stopped",)) == [3, 5]


def test_trials_by_number_may_name_finished_ones():
    assert select_trials(SWEEP, numbers=(4, 0)) == [0, 4]


@pytest.mark.parametrize(
    ("trials", "statuses", "numbers", "message"),
    [
        ([TrialState(0, "completed")], None, None, "--status failed,cancelled: nothing to retry (this sweep has 1 completed)"),
        ([TrialState(0, "failed"), TrialState(1, "running")], None, (0, 1),
         "--trials 0,1: #1 is running; wait until it ends (or scancel it) before retrying it"),
        ([TrialState(0, "pending"), TrialState(1, "failed")], ("failed",), (0,),
         "--trials 0: #0 is pending; wait until it ends"),
        ([TrialState(0, "failed")], None, (7,), "--trials 7: no such trial in this sweep (it has #0-#0)"),
    ],
)
def test_refusals_name_the_trials(trials, statuses, numbers, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        select_trials(trials, statuses, numbers)


def test_status_and_numbers_parsing():
    assert parse_statuses("failed, skipped_budget") == ("failed", "skipped_budget")
    with pytest.raises(ValueError, match="--status 'completed' is not allowed: one or more of failed,cancelled"):
        parse_statuses("completed")
    assert parse_trial_numbers("3,7,3") == (3, 7)
    # Ranges as the retry prints them are read back.
    assert parse_trial_numbers("0-3,7,9-10") == (0, 1, 2, 3, 7, 9, 10)
    for bad in ("3-", "7-3", "-1", "a", "3;7"):
        with pytest.raises(ValueError, match=rf"--trials '{bad}' is not allowed: trial numbers or ranges separated by "
                                             r"commas \(3,7 or 0-9,12\)"):
            parse_trial_numbers(bad)


def test_long_id_lists_print_as_ranges():
    assert id_ranges(range(297)) == "0-296"
    assert id_ranges([12, 0, 1, 2, 3, 7, 9, 10, 11]) == "0-3,7,9-12"
    assert id_ranges([4, 5]) == "4,5" and id_ranges([5]) == "5" and id_ranges([]) == ""
    assert parse_trial_numbers(id_ranges([0, 1, 2, 3, 7, 9, 10])) == (0, 1, 2, 3, 7, 9, 10)


def test_a_retry_in_another_partition_says_so():
    assert partition_change_line("batch", "batch") is None and partition_change_line(None, None) is None
    assert partition_change_line("batch", "urgent") == (
        "this retry runs in partition urgent, where the sweep ran in partition batch: "
        "hydra.launcher.partition=urgent applies to this retry only")
    assert "where the sweep ran in the cluster's default partition" in partition_change_line(None, "urgent")


def test_only_launcher_settings_may_change():
    params = {"partition": None, "timeout_min": 60, "exclude": None, "budget_gpu_hours": None}
    changes = launcher_changes(
        ["hydra.launcher.partition=high", "hydra.launcher.timeout_min=90", "hydra.launcher.exclude=node1,node2",
         "hydra.launcher.budget_gpu_hours=2.5"], params)
    assert changes == {"partition": "high", "timeout_min": 90, "exclude": "node1,node2", "budget_gpu_hours": 2.5}
    with pytest.raises(ValueError, match="model.lr=1e-3 is not allowed: a retry runs the same trials"):
        launcher_changes(["model.lr=1e-3"], params)
    with pytest.raises(ValueError, match="hydra.launcher.partion is not allowed: the sweep's launcher has no such"):
        launcher_changes(["hydra.launcher.partion=high"], params)


def test_submission_dir_of_a_relative_sweep_dir():
    assert submission_dir("/home/u/proj/multirun/2026-11-30/10-00-00", "multirun/2026-11-30/10-00-00") == Path("/home/u/proj")
    assert submission_dir("/scratch/sweeps/a", "/scratch/sweeps/a") is None
    with pytest.raises(ValueError, match="was the sweep moved"):
        submission_dir("/elsewhere/b", "multirun/2026-11-30/10-00-00")


# ----- the command: each refusal prints one line and submits nothing -----------------------------


@pytest.fixture
def slurm_sweep(tmp_path, fake_slurm):  # noqa: F811 (the fixture)
    """A 4-trial Slurm sweep (completed, failed, running, skipped by the budget) and fake Slurm commands."""
    sweep_dir = tmp_path / "sweep"
    make_sweep(sweep_dir, [
        (["model.lr=1"], metrics("completed")),
        (["model.lr=2"], metrics("failed", step=3)),
        (["model.lr=3"], metrics("running", step=3)),
        (["model.lr=4"], metrics("skipped_budget", step=0)),
    ], launcher="slurm", array_id="41")
    fake_slurm.answer("sacct", "41_0|COMPLETED|60|cpu=1,gres/gpu=1,node=1|n1\n41_1|FAILED|60|cpu=1,gres/gpu=1,node=1|n2\n"
                               "41_2|RUNNING|60|cpu=1,gres/gpu=1,node=1|n3\n41_3|COMPLETED|1|cpu=1,gres/gpu=1,node=1|n4\n")
    # Anything that would submit or cancel logs its call, and fails.
    for command in ("sbatch", "scancel"):
        script = fake_slurm.bin_dir / command
        script.write_text(f"#!/bin/sh\necho \"$*\" >> {fake_slurm.bin_dir / (command + '.log')}\nexit 1\n")
        script.chmod(0o755)
    (sweep_dir / ".submitit").mkdir()
    launcher = SimpleNamespace(params={"partition": None, "timeout_min": 60, "budget_gpu_hours": None})
    (sweep_dir / ".submitit" / "launcher.pkl").write_bytes(cloudpickle.dumps((launcher, {})))
    return sweep_dir, fake_slurm


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trials", "2"], "--trials 2: #2 is running; wait until it ends (or scancel it) before retrying it"),
        (["--status", "cancelled"], "--status cancelled: nothing to retry (this sweep has 1 completed, 1 failed, "
                                    "1 running, 1 skipped_budget)"),
        (["--status", "completed"], "--status 'completed' is not allowed"),
        (["--trials", "1", "model.lr=5"], "model.lr=5 is not allowed: a retry runs the same trials"),
        (["--trials", "9"], "--trials 9: no such trial in this sweep"),
    ],
)
def test_refused_retry_submits_nothing(slurm_sweep, capsys, args, message):
    sweep_dir, fake = slurm_sweep
    before = (sweep_dir / "sweep.json").read_text()
    assert retry.main([str(sweep_dir), *args]) == retry.EXIT_REFUSED
    err = capsys.readouterr().err
    assert err.startswith(f"retry refused: {message}") and err.rstrip().endswith("nothing was submitted")
    assert len(err.strip().splitlines()) == 1
    assert fake.calls("sbatch") == [] and fake.calls("scancel") == []
    assert (sweep_dir / "sweep.json").read_text() == before


def test_retry_of_a_local_sweep_says_how_to_resume(tmp_path, capsys):
    make_sweep(tmp_path / "local", [(["model.lr=1"], metrics("failed"))])
    assert retry.main([str(tmp_path / "local")]) == retry.EXIT_REFUSED
    assert "is a local sweep: run its command again with hydra.sweep.dir=" in capsys.readouterr().err
    assert os.path.isdir(tmp_path / "local")


def test_a_status_never_selects_finished_trials():
    with pytest.raises(ValueError, match="--status completed: trial\\(s\\) 0 finished; name them with --trials"):
        select_trials(SWEEP, statuses=("completed",))


def test_a_skipped_trial_that_never_trained_starts_afresh(tmp_path):
    from hpcsweep.sweep.retry_submit import forget_skipped_start

    never, trained, failed = tmp_path / "never", tmp_path / "trained", tmp_path / "failed"
    for trial_dir, status in ((never, "skipped_budget"), (trained, "skipped_budget"), (failed, "failed")):
        trial_dir.mkdir()
        (trial_dir / "metrics.json").write_text(f'{{"status": "{status}", "restarts": 0}}')
    (trained / "checkpoints").mkdir()
    (trained / "checkpoints" / "step00000004-valinf.pt").write_bytes(b"x")
    for trial_dir in (never, trained, failed):
        forget_skipped_start(trial_dir)
    assert not (never / "metrics.json").exists()
    assert (trained / "metrics.json").exists() and (failed / "metrics.json").exists()


def test_a_retry_needs_budget_left_for_its_trials_to_start():
    from hpcsweep.sweep.retry_submit import check_budget_left

    check_budget_left(None, spent_hours=100.0, units=8, horizon=130.0)
    check_budget_left(10.0, spent_hours=9.0, units=8, horizon=130.0)  # 8 GPUs x 130 s = 0.29 GPU-hours
    with pytest.raises(ValueError, match=r"^hydra.launcher.budget_gpu_hours=10 is spent: 9.8 GPU-hours so far, and "
                                         r"8 GPUs of retried trials need 0.289 more to start; raise it to retry$"):
        check_budget_left(10.0, spent_hours=9.8, units=8, horizon=130.0)


def test_each_retry_gets_a_launcher_folder_of_its_own(tmp_path):
    assert retry_launcher_folder(tmp_path) == tmp_path / ".submitit" / "retry-1"
    (tmp_path / ".submitit" / "retry-1").mkdir(parents=True)
    (tmp_path / ".submitit" / "retry-2").mkdir()
    assert retry_launcher_folder(tmp_path) == tmp_path / ".submitit" / "retry-3"
