"""sweep.json round trip and the cluster-info parsers."""

from hpcsweep.files.sweep_record import (
    ArrayRecord,
    SweepRecord,
    TrialRecord,
    read_sweep_record,
    write_sweep_record,
)
from hpcsweep.slurm.cluster_info import parse_max_array_size, parse_node_address


def test_sweep_record_round_trips(tmp_path):
    record = SweepRecord(
        sweep_dir=str(tmp_path),
        launcher="slurm",
        created_at="2026-11-29T14:00:00+00:00",
        trials=[TrialRecord(0, ["model.lr=1e-4"], str(tmp_path / "0"), "41_0", "2026-11-29T14:00:00+00:00")],
        arrays=[ArrayRecord("41", [0])],
    )
    write_sweep_record(record)
    assert read_sweep_record(tmp_path) == record
    assert read_sweep_record(tmp_path).job_ids() == ["41"]


def test_max_array_size():
    assert parse_max_array_size("MailProg = /bin/mail\nMaxArraySize            = 1001\nMaxJobCount = 10000\n") == 1001
    assert parse_max_array_size("MaxArraySize = 40\n") == 40
    assert parse_max_array_size("") == 1001


def test_node_address():
    line = "NodeName=node3 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=localhost Port=26823"
    assert parse_node_address(line) == "127.0.0.1"
    assert parse_node_address("NodeName=x") is None


def test_sweep_record_keeps_every_attempt_and_the_budget(tmp_path):
    from hpcsweep.files.sweep_record import Attempt

    trial = TrialRecord(3, ["model.lr=1e-4"], str(tmp_path / "3"), "41_3", "2026-11-29T14:00:00+00:00")
    assert trial.all_attempts() == [Attempt("41_3", "2026-11-29T14:00:00+00:00")]
    again = trial.retried("52_0", "2026-11-29T15:00:00+00:00").retried("60_0", "2026-11-29T16:00:00+00:00")
    assert (again.job_id, again.submitted_at) == ("60_0", "2026-11-29T16:00:00+00:00")
    assert [a.job_id for a in again.all_attempts()] == ["41_3", "52_0", "60_0"]
    record = SweepRecord(str(tmp_path), "slurm", "2026-11-29T14:00:00+00:00", [again],
                         [ArrayRecord("41", [3]), ArrayRecord("52", [3]), ArrayRecord("60", [3])], budget_gpu_hours=12.5,
                         app={"models": {"/shared/models/x": {"weights": {"model.safetensors": 1024}}}})
    write_sweep_record(record)
    assert read_sweep_record(tmp_path) == record
    assert read_sweep_record(tmp_path).job_ids() == ["41", "52", "60"]


def test_sweep_json_written_before_attempts_still_reads(tmp_path):
    import json

    (tmp_path / "sweep.json").write_text(json.dumps({
        "version": 1, "sweep_dir": str(tmp_path), "launcher": "slurm", "created_at": "2026-11-29T14:00:00+00:00",
        "arrays": [{"array_job_id": "41", "trials": [0]}],
        "trials": [{"num": 0, "overrides": [], "trial_dir": str(tmp_path / "0"), "job_id": "41_0",
                    "submitted_at": "2026-11-29T14:00:00+00:00"}],
    }))
    record = read_sweep_record(tmp_path)
    assert record.budget_gpu_hours is None and record.app == {}
    assert [(a.job_id, a.submitted_at) for a in record.trials[0].all_attempts()] == [("41_0", "2026-11-29T14:00:00+00:00")]
