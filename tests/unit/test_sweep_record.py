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
