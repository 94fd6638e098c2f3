"""The event reader returns exactly what TensorBoard's EventAccumulator keeps (size_guidance 0)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing import (
    event_accumulator,
    plugin_event_accumulator,
)
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util
from torch.utils.tensorboard import SummaryWriter

from hpcsweep.files.tb_runs import event_files
from hpcsweep.results import event_reader
from hpcsweep.results.event_reader import read_runs
from hpcsweep.results.tfrecord import masked_crc32c_many, read_records

TAGS = ("train/loss", "val/loss", "train/lr", "perf/tokens_per_s")


def legacy_scalars(run_dir) -> dict[str, list[tuple[int, float, float]]]:
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def read_scalars(run_dir):
    """The scalars of the one run in ``run_dir``, as the report reads every trial's run."""
    return read_runs([event_files(run_dir)])[0]


def masked_crc32c(data: bytes) -> int:
    return int(masked_crc32c_many(np.frombuffer(data, dtype=np.uint8), np.array([0]), np.array([len(data)]))[0])


def ours(run_dir) -> dict[str, list[tuple[int, float, float]]]:
    return {tag: list(zip(s.steps, s.wall_times, s.values)) for tag, s in read_scalars(run_dir).items()}


def test_one_records_masked_crc32c_matches_tensorboard():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import (
        masked_crc32c as reference,
    )

    for data in (b"", b"a", bytes(range(256)), b"\x10\x00\x00\x00\x00\x00\x00\x00"):
        assert masked_crc32c(data) == reference(data)


def test_simple_value_scalars_match_event_accumulator(tmp_path):
    rng = np.random.default_rng(0)
    writer = SummaryWriter(log_dir=str(tmp_path))
    for step in range(300):
        for tag in TAGS:
            writer.add_scalar(tag, float(rng.normal()), step)
        if step % 50 == 0:  # non-scalar events the reader must skip
            writer.add_histogram("weights", rng.normal(size=100), step)
            writer.add_text("note", f"step {step}", step)
    writer.close()
    # A second file in the same run, as a resumed trial writes: read in TensorBoard's order.
    writer = SummaryWriter(log_dir=str(tmp_path))
    for step in range(200, 400):
        writer.add_scalar("train/loss", float(rng.normal()), step)
    writer.close()
    expected = legacy_scalars(tmp_path)
    assert set(expected) == set(TAGS)
    assert ours(tmp_path) == expected
    assert len(expected["train/loss"]) == 500


def _tensor_event(tag: str, value: float, step: int, dtype, first: bool) -> event_pb2.Event:
    summary_value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(value, dtype=dtype))
    if first:
        summary_value.metadata.CopyFrom(scalar_metadata.create_summary_metadata(display_name=tag, description=""))
    return event_pb2.Event(wall_time=1000.0 + step, step=step, summary=summary_pb2.Summary(value=[summary_value]))


def test_tensor_scalars_match_plugin_event_accumulator(tmp_path):
    writer = EventFileWriter(str(tmp_path))
    for step in range(100):
        writer.add_event(_tensor_event("loss32", 1.0 / (step + 1), step, np.float32, step == 0))
        writer.add_event(_tensor_event("loss64", 2.0 / (step + 3), step, np.float64, step == 0))
    writer.close()
    acc = plugin_event_accumulator.EventAccumulator(str(tmp_path), size_guidance={plugin_event_accumulator.TENSORS: 0})
    acc.Reload()
    expected = {
        tag: [(e.step, e.wall_time, tensor_util.make_ndarray(e.tensor_proto).item()) for e in acc.Tensors(tag)]
        for tag in ("loss32", "loss64")
    }
    assert ours(tmp_path) == expected
    assert len(expected["loss32"]) == 100


def test_truncated_file_reads_complete_records_only(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path))
    for step in range(50):
        writer.add_scalar("train/loss", step * 0.5, step)
    writer.close()
    (path,) = tmp_path.glob("*tfevents*")
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # a record still being written
    assert ours(tmp_path) == legacy_scalars(tmp_path)
    assert [step for step, _, _ in ours(tmp_path)["train/loss"]] == list(range(49))
    assert len(read_records([data]).starts) == 51  # file_version event + 50 scalars


def test_session_start_purges_orphaned_steps_like_tensorboard(tmp_path):
    writer = EventFileWriter(str(tmp_path))
    for step in range(10):
        writer.add_event(event_pb2.Event(step=step, wall_time=step, summary=summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag="loss", simple_value=float(step))])))
    writer.add_event(event_pb2.Event(step=6, wall_time=20, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
    for step in range(6, 8):
        writer.add_event(event_pb2.Event(step=step, wall_time=30 + step, summary=summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag="loss", simple_value=-float(step))])))
    writer.close()
    expected = legacy_scalars(tmp_path)
    assert ours(tmp_path) == expected
    assert [s for s, _, _ in expected["loss"]] == [0, 1, 2, 3, 4, 5, 6, 7]


def test_empty_or_missing_run_has_no_scalars(tmp_path):
    assert read_scalars(tmp_path / "missing") == {}
    assert read_scalars(tmp_path) == {}


@pytest.mark.parametrize("value", [0.1, 3.0, -2.5e-7])
def test_float32_values_are_rounded_as_tensorboard_rounds_them(tmp_path, value):
    writer = SummaryWriter(log_dir=str(tmp_path))
    writer.add_scalar("x", torch.tensor(value, dtype=torch.float64).item(), 1)
    writer.close()
    assert ours(tmp_path) == legacy_scalars(tmp_path)


def _raw_event_file(path, events) -> None:
    """Events framed as they are, with no file_version event first (an old writer's file)."""
    out = b""
    for event in events:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        out += header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))
    path.write_bytes(out)


def _scalar(tag: str, value: float, step: int, wall_time: float = 1.0) -> event_pb2.Event:
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]))


def test_events_outside_the_fast_path_match_event_accumulator(tmp_path):
    two_values = event_pb2.Event(wall_time=5.0, step=5, summary=summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(tag="a", simple_value=1.5), summary_pb2.Summary.Value(tag="b", simple_value=2.5)]))
    events = [
        _scalar("a", 0.25, 0, wall_time=0.0),  # step and wall_time left out of the bytes
        _scalar("a", 0.5, -3),  # a negative step is a 10-byte varint
        _scalar("a", 0.75, 2**40),  # past the fast path's 5-byte steps
        _scalar("é/ü", 1.0, 4),  # a UTF-8 tag
        _scalar("x" * 200, 2.0, 4),  # a tag longer than a 1-byte length
        _scalar("y" * 300, 2.5, 4),  # past the fast path's 256-byte tags
        two_values,
        _scalar("a", 3.0, 6),
    ]
    writer = EventFileWriter(str(tmp_path))
    for event in events:
        writer.add_event(event)
    writer.close()
    expected = legacy_scalars(tmp_path)
    assert ours(tmp_path) == expected
    assert [s for s, _, _ in expected["a"]] == [0, -3, 2**40, 5, 6]


def test_old_files_whose_steps_go_back_are_purged_like_tensorboard(tmp_path):
    # Before file version 2, a step going back drops that tag's later points. The first file is
    # added in bulk; the second goes back in steps, so the bulk path hands it to the one by record.
    _raw_event_file(tmp_path / "events.out.tfevents.1.old", [_scalar(t, float(s), s) for s in range(10) for t in "ab"])
    events = [_scalar("a", -1.0, 4), _scalar("b", -2.0, 7), _scalar("a", -3.0, 5)]
    events += [_scalar(tag, float(step), step) for step in range(8, 12) for tag in "ab"]
    _raw_event_file(tmp_path / "events.out.tfevents.2.old", events)
    expected = legacy_scalars(tmp_path)
    assert ours(tmp_path) == expected
    assert [s for s, _, _ in expected["a"]] == [0, 1, 2, 3, 4, 5, 8, 9, 10, 11]
    assert [s for s, _, _ in expected["b"]] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]


def test_a_damaged_record_ends_its_file_as_in_tensorboard(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path))
    for step in range(40):
        writer.add_scalar("loss", step * 0.25, step)
    writer.close()
    (path,) = tmp_path.glob("*tfevents*")
    data = bytearray(path.read_bytes())
    data[-30 * 35] ^= 0x40  # inside a record some way before the end
    path.write_bytes(bytes(data))
    expected = legacy_scalars(tmp_path)
    assert ours(tmp_path) == expected
    assert 0 < len(expected["loss"]) < 40


def test_runs_read_in_batches_match_each_run_read_alone(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    run_dirs = []
    for run in range(5):
        run_dir = tmp_path / str(run)
        writer = SummaryWriter(log_dir=str(run_dir))
        for step in range(30 * run):
            for tag in TAGS[: run + 1]:
                writer.add_scalar(tag, float(rng.normal()), step)
        writer.close()
        run_dirs.append(run_dir)
    monkeypatch.setattr(event_reader, "BATCH_BYTES", 4000)  # several runs a batch, several batches
    together = event_reader.read_runs([event_files(d) for d in [*run_dirs, tmp_path / "missing"]])
    assert [{t: list(zip(s.steps, s.wall_times, s.values)) for t, s in r.items()} for r in together] == [
        *(legacy_scalars(d) for d in run_dirs), {}]


def test_every_file_tensorboard_reads_is_read(tmp_path):
    # TensorBoard reads any file whose name holds "tfevents", hidden ones too, in name order.
    for name, value in ((".hidden", 1.0), ("plain", 2.0)):
        writer = SummaryWriter(log_dir=str(tmp_path / name))
        writer.add_scalar("x", value, 1)
        writer.close()
        (path,) = (tmp_path / name).iterdir()
        path.rename(tmp_path / (".events.out.tfevents.1" if name == ".hidden" else "events.out.tfevents.2"))
    expected = legacy_scalars(tmp_path)
    assert ours(tmp_path) == expected
    assert [v for _, _, v in expected["x"]] == [1.0, 2.0]
