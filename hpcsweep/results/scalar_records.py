"""The events ``add_scalar`` writes, decoded all at once with numpy instead of one protobuf parse each.

Nearly every record of a training run's event file is one scalar (field numbers in brackets)::

    Event { wall_time (1): double, step (2): int64,
            summary (5): Summary { value (1): Value { tag (1): string, simple_value (2): float } } }

:func:`decode_simple_scalars` finds the records that are exactly this, every byte accounted for, so
protobuf would read the same fields from them, and returns those fields as arrays. Anything else
(the file version, a histogram, a tensor summary, a session log, an unusual encoding) is left to
protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Field keys: field number << 3 | wire type (1: fixed64, 0: varint, 2: length-delimited, 5: fixed32).
WALL_TIME_KEY = 0x09
STEP_KEY = 0x10
SUMMARY_KEY = 0x2A
VALUE_KEY = 0x0A
TAG_KEY = 0x0A
SIMPLE_VALUE_KEY = 0x15
_MAX_STEP_BYTES = 5
"""Steps under 2**35; a larger or negative one (10 bytes) goes to protobuf."""
_MAX_LENGTH_BYTES = 2
"""Lengths under 16 KiB: a scalar's summary is far shorter; anything longer goes to protobuf."""
_MAX_TAG_BYTES = 256
"""Longer tags go to protobuf: the tags of a batch are compared as rows as wide as the longest."""
_NOT_SCALAR = -1


@dataclass(frozen=True)
class SimpleScalars:
    """The fields of each record of a file; only records with ``tag_id[i] >= 0`` hold a scalar."""

    tag_id: np.ndarray
    """Index into ``tags``, or -1 where the record is not a simple scalar."""
    tags: list[str | None]
    """The tags, in order of first appearance (None for a tag that is not UTF-8: protobuf refuses it)."""
    step: np.ndarray
    wall_time: np.ndarray
    value: np.ndarray
    """``simple_value``, a float32."""


def _byte_at(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The bytes at ``pos``, which records that are not scalars may send past the end: clipped there."""
    return np.take(buf, pos, mode="clip")


def _fixed_at(buf: np.ndarray, pos: np.ndarray, dtype: str) -> np.ndarray:
    """The little-endian number of ``dtype`` at each position."""
    width = np.dtype(dtype).itemsize
    return _byte_at(buf, pos[:, None] + np.arange(width)).view(dtype).ravel()


def _varints(buf: np.ndarray, pos: np.ndarray, max_bytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values as uint64, byte counts, ok)`` of the varints at ``pos``; ok is False for one longer
    than ``max_bytes``."""
    values = np.zeros(len(pos), dtype=np.uint64)
    count = np.zeros(len(pos), dtype=np.int64)
    going = np.ones(len(pos), dtype=bool)
    for k in range(max_bytes):
        byte = _byte_at(buf, pos + k)
        values |= np.where(going, (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k), np.uint64(0))
        count += going
        going &= byte >= 0x80
    return values, count, ~going


def _length_delimited(buf: np.ndarray, pos: np.ndarray, key: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(found, content start, content length)`` of a length-delimited field ``key`` at ``pos``."""
    size, size_bytes, ok = _varints(buf, pos + 1, _MAX_LENGTH_BYTES)
    return ok & (_byte_at(buf, pos) == key), pos + 1 + size_bytes, size.astype(np.int64)


def _tag_ids(buf: np.ndarray, start: np.ndarray, length: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, list]:
    """Each scalar record's tag as an index into a list of the distinct tags (-1 for other records)."""
    tag_id = np.full(len(start), _NOT_SCALAR, dtype=np.int64)
    rows = np.flatnonzero(ok)
    if not len(rows):
        return tag_id, []
    start, length = start[rows], length[rows]
    cols = np.arange(int(length.max()))
    chars = _byte_at(buf, start[:, None] + cols) * (cols < length[:, None])
    # The length goes into the key too, so that "a" and "a\0" stay apart despite the zero padding.
    keys = np.ascontiguousarray(np.column_stack([length.astype("<u2").view(np.uint8).reshape(-1, 2), chars]))
    _, first, inverse = np.unique(keys.view(f"V{keys.shape[1]}").ravel(), return_index=True, return_inverse=True)
    appearance = np.argsort(first)
    rank = np.empty_like(appearance)
    rank[appearance] = np.arange(len(appearance))
    tag_id[rows] = rank[inverse]
    tags: list[str | None] = []
    for index, row in enumerate(first[appearance].tolist()):
        try:
            tags.append(bytes(buf[start[row] : start[row] + length[row]]).decode("utf-8"))
        except UnicodeDecodeError:
            tags.append(None)
            tag_id[tag_id == index] = _NOT_SCALAR
    return tag_id, tags


def decode_simple_scalars(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> SimpleScalars:
    """The fields of every record ``buf[start:start + length]`` that is a simple scalar event.

    wall_time and step may be absent (protobuf leaves out zeros); the summary, its one value, and
    the value's tag and simple_value must be there, in that order, and end the record.
    """
    ends = starts + lengths
    pos = starts.copy()
    has_wall_time = _byte_at(buf, pos) == WALL_TIME_KEY
    wall_time = np.where(has_wall_time, _fixed_at(buf, pos + 1, "<f8"), 0.0)
    pos += has_wall_time * 9
    has_step = _byte_at(buf, pos) == STEP_KEY
    step, step_bytes, ok = _varints(buf, pos + 1, _MAX_STEP_BYTES)
    step = np.where(has_step, step, np.uint64(0)).view(np.int64)
    ok |= ~has_step
    pos += has_step * (1 + step_bytes)
    for key in (SUMMARY_KEY, VALUE_KEY):
        found, pos, size = _length_delimited(buf, pos, key)
        ok &= found & (pos + size == ends)  # the only field left in the record
    found, tag_start, tag_length = _length_delimited(buf, pos, TAG_KEY)
    pos = tag_start + tag_length
    ok &= found & (tag_length <= _MAX_TAG_BYTES) & (_byte_at(buf, pos) == SIMPLE_VALUE_KEY) & (pos + 5 == ends)
    value = _fixed_at(buf, pos + 1, "<f4")
    tag_id, tags = _tag_ids(buf, tag_start, tag_length, ok)
    return SimpleScalars(tag_id=tag_id, tags=tags, step=step, wall_time=wall_time, value=value)
