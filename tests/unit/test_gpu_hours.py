"""One GPU-hour figure: each trial's allocated share, report's total against status, and trained labels."""

from __future__ import annotations

import pytest
import yaml

from hpcsweep import report, status
from hpcsweep.files.usage_file import USAGE_FILE, LocalRun, write_runs
from hpcsweep.results.gpu_hours import allocated_hours_by_trial
from hpcsweep.results.overrides import override_values, trained_values
from hpcsweep.results.table import TrialRow, load_sweep
from hpcsweep.status import NOT_CHOSEN, trial_params

from .fake_slurm import fake_slurm  # noqa: F401 (a fixture)
from .sweep_fixtures import make_sweep, metrics, trained_config


def test_a_shared_task_is_divided_by_the_trials_own_shares():
    tasks = {"7_0": 8.0, "7_1": 2.0, "9_0": 1.0}
    # Trials 0 and 1 share task 7_0 (0 ran three times as long); 2 ran alone in 7_1, then was retried in 9_0.
    allocated = allocated_hours_by_trial(tasks, {0: ["7_0"], 1: ["7_0"], 2: ["7_1", "9_0"], 3: ["7_2"]},
                                         {0: 0.3, 1: 0.1, 2: 0.2, 3: None})
    assert allocated == pytest.approx({0: 6.0, 1: 2.0, 2: 3.0, 3: 0.0})
    assert sum(allocated.values()) == pytest.approx(sum(tasks.values()))
    # Nobody's own share known yet: evenly.
    assert allocated_hours_by_trial({"7_0": 8.0}, {0: ["7_0"], 1: ["7_0"]}, {}) == {0: 4.0, 1: 4.0}


def test_report_total_is_the_figure_status_spends(tmp_path, capsys):
    make_sweep(tmp_path, [(["model.lr=1e-4"], metrics("completed")), (["model.lr=1e-3"], metrics("completed"))])
    # Local runs: 2 GPUs for an hour, then 2 GPUs for half an hour (its own share says 2 x 1 h each).
    write_runs(tmp_path / "0" / USAGE_FILE, [LocalRun(0.0, 3600.0, 2, True)])
    write_runs(tmp_path / "1" / USAGE_FILE, [LocalRun(0.0, 1800.0, 2, True)])
    rows = load_sweep(tmp_path).rows
    assert [(r.gpu_hours, r.own_gpu_hours) for r in rows] == [(2.0, 2.0), (1.0, 2.0)]
    assert status.main([str(tmp_path), "--color=never"]) == 0
    assert "budget: 3 GPU-hours spent (no budget)" in capsys.readouterr().out
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert "GPU-h" in header and "own GPU-h" in header
    assert "GPU-hours: 3 allocated in all (every run of every task); the trials' own share 4" in out


def test_report_total_of_a_slurm_sweep_is_sacct(tmp_path, capsys, fake_slurm):  # noqa: F811
    make_sweep(tmp_path, [(["model.lr=1e-4"], metrics("completed")), (["model.lr=1e-3"], metrics("completed"))],
               launcher="slurm")
    fake_slurm.answer("sacct", "41_0|COMPLETED|1800|cpu=8,gres/gpu=8,node=1|n1\n"
                               "41_1|COMPLETED|900|cpu=8,gres/gpu=8,node=1|n2\n")
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours: 6 allocated in all" in out  # 8 GPUs x 0.5 h + 8 GPUs x 0.25 h
    assert status.main([str(tmp_path), "--color=never"]) == 0
    assert "budget: 6 GPU-hours spent" in capsys.readouterr().out


def test_a_label_says_what_the_trial_trained_with():
    # A completed trial run again (nothing trained) with model.lr=3e-3 resume.force=true: config.yaml still says 1e-4.
    values = override_values(["model.lr=3e-3", "resume.force=true", "hydra.run.dir=/t", "model=llama_small"])
    assert values == {"model.lr": "3e-3", "model": "llama_small"}
    assert trained_values(values, {"model": {"lr": 1e-4, "name": "llama_small"}}) == {"model.lr": "0.0001",
                                                                                       "model": "llama_small"}
    # A text that means the trained value keeps its own spelling; no config yet: the overrides stand.
    assert trained_values({"model.lr": "1e-4", "x.on": "True"}, {"model": {"lr": 1e-4}, "x": {"on": True}}) == {
        "model.lr": "1e-4", "x.on": "True"}
    assert trained_values(values, None) == values


def test_status_labels_a_rerun_trial_dir_by_its_trained_config(tmp_path, capsys):
    trial_dir = tmp_path / "trial"
    (trial_dir / ".hydra").mkdir(parents=True)
    (trial_dir / "config.yaml").write_text(yaml.safe_dump(trained_config(["model.lr=1e-4"])))
    (trial_dir / "metrics.json").write_text('{"status": "completed", "step": 8, "max_steps": 8}')
    # What the no-op rerun left in Hydra's record:
    (trial_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["model.lr=3e-3", "resume.force=true"]))
    assert status.main([str(trial_dir), "--color=never"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("#0"))
    assert "model.lr=0.0001" in line and "3e-3" not in line and "resume" not in line


def test_pending_search_trials_say_not_chosen_yet():
    keys = ["model.lr", "trainer.warmup_steps"]
    chosen = TrialRow(0, {"model.lr": "1e-4", "trainer.warmup_steps": "10"}, "running")
    assert trial_params(chosen, keys) == "model.lr=1e-4 trainer.warmup_steps=10"
    assert trial_params(TrialRow(1, {}, "pending"), keys) == NOT_CHOSEN == "not chosen yet"
    assert trial_params(TrialRow(2, {"model.lr": "1e-3"}, "pending"), keys) == "model.lr=1e-3 trainer.warmup_steps=-"

