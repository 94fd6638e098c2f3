"""Scalars from TensorBoard event files: fast, every point kept, safe on files still being written.

Scalars are ``summary.value[].simple_value`` (``SummaryWriter.add_scalar``) or rank-0 ``tensor``
values whose tag carries the ``scalars`` plugin metadata (TensorBoard 2 style summaries).
``read_runs`` returns each run's points as TensorBoard's ``EventAccumulator`` with ``size_guidance=0``
returns them, in the same order: the same records (``hpcsweep.results.tfrecord``:
checksums verified, a truncated tail left for later), the same values, the same purges of orphaned
points after a restart.

Why it is fast: the framing and checksums of all records of many files are checked at once
(``hpcsweep.results.tfrecord``), and so is the decoding of the plain scalar events that make up
nearly all of a training run's files (``hpcsweep.results.scalar_records``); those are then appended
per tag in bulk. Only the few other records (the file version, HParams, session logs, histograms)
are parsed by protobuf, one by one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2, tensor_pb2, types_pb2

from hpcsweep.results.scalar_records import SimpleScalars, decode_simple_scalars
from hpcsweep.results.tfrecord import Records, read_records

log = logging.getLogger(__name__)

BATCH_BYTES = 16 * 2**20
"""Event files decoded together: enough to amortize numpy's calls, few enough to bound its
temporary arrays (about 100 MB at the peak for a batch of small scalar records)."""

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

    def add_file(self, records: Records, scalars: SimpleScalars, index: int) -> None:
        """Add the good records of file ``index`` of a batch, in file order: runs of simple scalar
        records in bulk, every other record through protobuf."""
        first, end = int(records.bounds[index]), int(records.bounds[index + 1])
        view = memoryview(records.buf)

        def parse(lo: int, hi: int) -> bool:
            spans = zip(records.starts[lo:hi].tolist(), records.lengths[lo:hi].tolist())
            return self._add_records(view[start : start + length] for start, length in spans)

        begin = first
        for other in [*(first + np.flatnonzero(scalars.tag_id[first:end] < 0)).tolist(), end]:
            if begin < other and not self._add_simple_run(scalars, begin, other) and not parse(begin, other):
                return
            if other < end and not parse(other, other + 1):
                return
            begin = other + 1

    def _add_simple_run(self, scalars: SimpleScalars, begin: int, end: int) -> bool:
        """Append records ``begin:end`` (all simple scalars) per tag; False, adding nothing, when one
        of them would purge points (old files whose steps go back), which is left to ``_add_event``."""
        steps = scalars.step[begin:end]
        if self._file_version < 2:
            before = np.maximum.accumulate(np.concatenate([[self._most_recent_step], steps[:-1]]))
            if np.any(steps < before):
                return False
            self._most_recent_step = int(steps[-1])
        tag_id = scalars.tag_id[begin:end]
        order = np.argsort(tag_id, kind="stable")
        sorted_ids = tag_id[order]
        bounds = [0, *(np.flatnonzero(np.diff(sorted_ids)) + 1).tolist(), len(order)]
        index = order + begin
        all_steps = scalars.step[index].tolist()
        all_wall_times = scalars.wall_time[index].tolist()
        all_values = scalars.value[index].tolist()  # float32 to Python float: exact, as protobuf does it
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            series = self._series(scalars.tags[sorted_ids[lo]])
            series.steps += all_steps[lo:hi]
            series.wall_times += all_wall_times[lo:hi]
            series.values += all_values[lo:hi]
        return True

    def _add_records(self, records: Iterable[memoryview]) -> bool:
        """Parse and add each record; False when one is undecodable (the rest of the file is skipped)."""
        parse = event_pb2.Event.FromString
        for record in records:
            try:
                event = parse(record)
            except DecodeError:
                log.warning("undecodable event record: ignoring the rest of the file")
                return False
            self._add_event(event)
        return True

    def _series(self, tag: str) -> ScalarSeries:
        series = self.series.get(tag)
        if series is None:
            series = self.series[tag] = ScalarSeries()
        return series

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
            series = self._series(value.tag)
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


def read_runs(runs: Sequence[Sequence[Path]]) -> list[dict[str, ScalarSeries]]:
    """The scalars of each run, given as its event files in TensorBoard's reading order.

    Files are decoded in batches of several runs, up to ``BATCH_BYTES``: a 1,000-trial sweep has
    2,000 small files, and numpy's cost per call is then paid once a batch, not once a file.
    """
    results: list[dict[str, ScalarSeries]] = []
    batch: list[list[tuple[Path, bytes]]] = []
    batch_bytes = 0
    for paths in runs:
        files = [(path, data) for path in paths if (data := _read(path)) is not None]
        batch.append(files)
        batch_bytes += sum(len(data) for _, data in files)
        if batch_bytes >= BATCH_BYTES:
            results += _read_batch(batch)
            batch, batch_bytes = [], 0
    return results + _read_batch(batch)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:  # deleted since it was listed
        return None


def _read_batch(runs: list[list[tuple[Path, bytes]]]) -> list[dict[str, ScalarSeries]]:
    files = [file for run in runs for file in run]
    records = read_records([data for _, data in files])
    for index in records.damaged:
        log.warning("%s: a record has a bad checksum: ignoring the rest of the file", files[index][0])
    scalars = decode_simple_scalars(records.buf, records.starts, records.lengths)
    results, index = [], 0
    for run in runs:
        accumulator = ScalarAccumulator()
        for _ in run:
            accumulator.add_file(records, scalars, index)
            index += 1
        results.append(accumulator.series)
    return results
