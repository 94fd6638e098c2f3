"""Scalars from TensorBoard event files: fast, every point kept, safe on files still being written.

An event file is a sequence of records::

    uint64 length | uint32 masked CRC-32C of length | data[length] | uint32 masked CRC-32C of data

where ``data`` is a serialized ``Event`` proto. Scalars are ``summary.value[].simple_value``
(``SummaryWriter.add_scalar``) or rank-0 ``tensor`` values whose tag carries the ``scalars``
plugin metadata (TensorBoard 2 style summaries). ``read_scalars(run_dir)`` returns the same
points, in the same order, as TensorBoard's ``EventAccumulator`` with ``size_guidance=0``.

Why it is fast: TensorBoard's fallback reader computes CRC-32C in pure Python over every byte.
Here the header CRC is checked against a cache keyed by the 8 length bytes (scalar records
repeat a handful of lengths), the data CRC is not computed (a torn tail is caught by the length,
a corrupt payload by the proto parse), events that cannot hold a summary are skipped by their
first field tag without parsing, and only scalar summary values are converted.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2, tensor_pb2, types_pb2

from hpcsweep.files.tb_runs import event_files

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<QI")
_CRC32C_POLY = 0x82F63B78
_CRC_MASK_DELTA = 0xA282EAD8
# Event fields that are never a summary or a session log: graph_def, log_message,
# tagged_run_metadata, meta_graph_def (field numbers 4, 6, 8, 9 as length-delimited tags).
_SKIPPED_FIELD_TAGS = frozenset({0x22, 0x32, 0x42, 0x4A})
_TENSOR_DTYPES = {
    types_pb2.DT_FLOAT: ("float_val", "<f4"),
    types_pb2.DT_DOUBLE: ("double_val", "<f8"),
    types_pb2.DT_HALF: ("half_val", "<f2"),
    types_pb2.DT_INT32: ("int_val", "<i4"),
    types_pb2.DT_INT64: ("int64_val", "<i8"),
}
SCALARS_PLUGIN = "scalars"


@dataclass
class ScalarSeries:
    """The points of one scalar tag, in file order (steps may repeat after a resume)."""

    steps: list[int] = field(default_factory=list)
    wall_times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def keep_before(self, step: int) -> None:
        """Drop every point at ``step`` or later (TensorBoard's purge of orphaned data)."""
        kept = [i for i, s in enumerate(self.steps) if s < step]
        self.steps = [self.steps[i] for i in kept]
        self.wall_times = [self.wall_times[i] for i in kept]
        self.values = [self.values[i] for i in kept]


@functools.cache
def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (_CRC32C_POLY if crc & 1 else 0)
        table.append(crc)
    return tuple(table)


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C TFRecord files store (slow: pure Python, meant for short inputs)."""
    table = _crc32c_table()
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


_header_crc = functools.lru_cache(maxsize=8192)(masked_crc32c)


def iter_records(data: bytes) -> Iterator[memoryview]:
    """The data of each complete record in ``data``.

    Stops at a truncated tail (a record still being written) and at a header whose CRC does not
    match, as TensorBoard does; the rest of such a file is unreadable.
    """
    view = memoryview(data)
    pos, end = 0, len(data)
    while pos + _HEADER.size <= end:
        length, length_crc = _HEADER.unpack_from(data, pos)
        if _header_crc(data[pos : pos + 8]) != length_crc:
            log.warning("event record at byte %d has a bad length CRC: ignoring the rest of the file", pos)
            return
        start = pos + _HEADER.size
        stop = start + length
        if stop + 4 > end:
            return
        yield view[start:stop]
        pos = stop + 4


def _cannot_hold_summary(record: memoryview) -> bool:
    """True when the event's first field after wall_time and step is one that is never read here.

    Writers serialize fields in number order, so this is decided from a few bytes. Any layout this
    does not recognise is parsed in full.
    """
    try:
        pos = 9 if record[0] == 0x09 else 0
        if record[pos] == 0x10:
            pos += 1
            while record[pos] & 0x80:
                pos += 1
            pos += 1
        return record[pos] in _SKIPPED_FIELD_TAGS
    except IndexError:
        return False


def scalar_from_tensor(tensor: tensor_pb2.TensorProto) -> float | None:
    """The value of a rank-0 numeric ``TensorProto``, or None for anything else."""
    if tensor.tensor_shape.dim or tensor.dtype not in _TENSOR_DTYPES:
        return None
    field_name, numpy_dtype = _TENSOR_DTYPES[tensor.dtype]
    if tensor.tensor_content:
        return np.frombuffer(tensor.tensor_content, dtype=numpy_dtype)[0].item()
    values = getattr(tensor, field_name)
    if not values:
        return None
    if tensor.dtype == types_pb2.DT_HALF:
        return np.array([values[0]], dtype=np.uint16).view(np.float16)[0].item()
    return values[0] if isinstance(values[0], float) else float(values[0])


class ScalarAccumulator:
    """Accumulates the scalars of one run (one directory of event files), file after file."""

    def __init__(self) -> None:
        self.series: dict[str, ScalarSeries] = {}
        self._plugin_of_tag: dict[str, str] = {}
        self._file_version = 0.0
        self._most_recent_step = -1

    def add_file_bytes(self, data: bytes) -> None:
        """Add every complete record of one event file's contents."""
        parse = event_pb2.Event.FromString
        for record in iter_records(data):
            if _cannot_hold_summary(record):
                continue
            try:
                event = parse(record)
            except DecodeError:
                log.warning("undecodable event record: ignoring the rest of the file")
                return
            self._add_event(event)

    def _add_event(self, event: event_pb2.Event) -> None:
        kind = event.WhichOneof("what")
        if kind == "file_version":
            self._file_version = _parse_file_version(event.file_version)
        self._maybe_purge(event, kind)
        if kind != "summary":
            return
        step, wall_time = event.step, event.wall_time
        for value in event.summary.value:
            which = value.WhichOneof("value")
            if which == "simple_value":
                number = value.simple_value
            elif which == "tensor":
                if value.HasField("metadata"):
                    self._plugin_of_tag.setdefault(value.tag, value.metadata.plugin_data.plugin_name)
                if self._plugin_of_tag.get(value.tag) != SCALARS_PLUGIN:
                    continue
                number = scalar_from_tensor(value.tensor)
                if number is None:
                    continue
            else:
                continue
            series = self.series.get(value.tag)
            if series is None:
                series = self.series[value.tag] = ScalarSeries()
            series.steps.append(step)
            series.wall_times.append(wall_time)
            series.values.append(number)

    def _maybe_purge(self, event: event_pb2.Event, kind: str | None) -> None:
        """Drop orphaned points the way TensorBoard does, so both show the same curves.

        From file version 2 on, a ``SessionLog.START`` at step s drops every point at s or later;
        older files drop a tag's later points when an event goes back in steps.
        """
        if self._file_version >= 2:
            if kind == "session_log" and event.session_log.status == event_pb2.SessionLog.START:
                for series in self.series.values():
                    series.keep_before(event.step)
        elif kind == "summary" and event.step < self._most_recent_step:
            for value in event.summary.value:
                if value.tag in self.series:
                    self.series[value.tag].keep_before(event.step)
        else:
            self._most_recent_step = event.step


def _parse_file_version(text: str) -> float:
    """``brain.Event:2`` -> 2.0 (0 when unparsable, as TensorBoard treats it)."""
    try:
        return float(text.rsplit(":", 1)[-1])
    except ValueError:
        return 0.0


def read_scalars(run_dir: str | Path) -> dict[str, ScalarSeries]:
    """Every scalar point of the run in ``run_dir`` (empty when it has no event files yet)."""
    accumulator = ScalarAccumulator()
    for path in event_files(Path(run_dir)):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        accumulator.add_file_bytes(data)
    return accumulator.series
