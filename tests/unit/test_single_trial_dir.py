"""A trial dir from the sbatch route (no sweep.json) read by status and report as a sweep of one."""

from __future__ import annotations

import json

import yaml

from hpcsweep import report, status
from hpcsweep.results.table import load_sweep, single_trial_record

from .fake_slurm import fake_slurm  # noqa: F401 (a fixture)
from .sweep_fixtures import metrics, trained_config

# environment.json as hpcsweep.trial.records.environment_record writes it under `sbatch slurm/train.sbatch`
SBATCH_ENVIRONMENT = {
    "commit": "0123abc", "dirty": False, "recorded_at": "2026-01-01T00:00:00+00:00", "hostname": "node1",
    "python": "3.11.2", "torch": "2.4.0", "rendezvous": {"MASTER_ADDR": "node1"}, "nccl": {},
    "slurm": {
        "job_id": "1234", "job_label": "1234", "array_job_id": None, "array_task_id": None,
        "nodelist": "node[1-2]", "node_name": "node1", "restart_count": 0,
    },
}


def make_trial_dir(path, trial_metrics, environment):
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["model.lr=3e-4", "trainer.nodes=2"]))
    (path / "config.yaml").write_text(yaml.safe_dump(trained_config(["model.lr=3e-4", "trainer.nodes=2"])))
    (path / "metrics.json").write_text(json.dumps(trial_metrics))
    if environment is not None:
        (path / "environment.json").write_text(json.dumps(environment))
    return path


def test_single_trial_record_takes_the_job_from_the_environment():
    record = single_trial_record("/t", SBATCH_ENVIRONMENT, ["model.lr=3e-4"])
    assert record.launcher == "slurm" and record.job_ids() == ["1234"]
    assert record.trials[0].job_id == "1234" and record.trials[0].trial_dir == "/t"
    array_task = {**SBATCH_ENVIRONMENT, "slurm": {**SBATCH_ENVIRONMENT["slurm"], "job_id": "77", "job_label": "70_3"}}
    assert single_trial_record("/t", array_task, []).job_ids() == ["70_3"]
    local = single_trial_record("/t", {**SBATCH_ENVIRONMENT, "slurm": None}, [])
    assert local.launcher == "local" and local.job_ids() == [] and local.trials[0].job_id is None


def test_status_and_report_of_an_sbatch_trial_dir(tmp_path, monkeypatch, capsys, fake_slurm):
    monkeypatch.chdir(tmp_path)
    make_trial_dir(tmp_path / "outputs" / "sbatch-1234", metrics("running", step=4), SBATCH_ENVIRONMENT)
    fake_slurm.answer("sacct", "1234|RUNNING|600|billing=128,cpu=128,gres/gpu=16,node=2|node[1-2]\n")

    assert status.main(["outputs/sbatch-1234"]) == 0
    out = capsys.readouterr().out
    assert "outputs/sbatch-1234: 1 trial, 1 running" in out
    assert "model.lr=3e-4 trainer.nodes=2" in out and "4/8" in out and "node[1-2]" in out
    assert "--jobs 1234 " in fake_slurm.calls("sacct")[0]

    assert report.main(["outputs/sbatch-1234"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["#", "model.lr", "trainer.nodes", "status"]
    assert table[1].split()[:5] == ["0", "3e-4", "2", "running", "4/8"]
    assert load_sweep("outputs/sbatch-1234").rows[0].gpu_hours == 16 * 600 / 3600


def test_local_trial_dir_asks_no_slurm(tmp_path, capsys, fake_slurm):
    trial_dir = make_trial_dir(tmp_path / "trial", metrics("completed"), {**SBATCH_ENVIRONMENT, "slurm": None})
    assert status.main([str(trial_dir)]) == 0
    assert "1 trial, 1 completed" in capsys.readouterr().out
    assert fake_slurm.calls("sacct") == [] and fake_slurm.calls("squeue") == []


def test_cancelled_sbatch_trial_in_status_and_report(tmp_path, capsys, fake_slurm):
    trial_dir = make_trial_dir(tmp_path / "sbatch-1234", metrics("running", step=4), SBATCH_ENVIRONMENT)
    fake_slurm.answer("sacct", "1234|CANCELLED by 1000|600|cpu=128,gres/gpu=16,node=2|node[1-2]\n")
    assert status.main([str(trial_dir)]) == status.EXIT_CANCELLED  # not a failure, but not a completed trial
    assert "1 trial, 1 cancelled" in capsys.readouterr().out
    assert report.main([str(trial_dir)]) == 0
    out = capsys.readouterr().out
    assert "cancelled" in out and "failed" not in out and "no error recorded" not in out
    assert load_sweep(trial_dir).rows[0].status == "cancelled"


def test_neither_a_sweep_nor_a_trial_dir(tmp_path, capsys):
    assert status.main([str(tmp_path)]) == 2
    assert report.main([str(tmp_path)]) == 2
    assert "pass a sweep's multirun dir or a trial dir" in capsys.readouterr().err
