"""TFRecord framing, the container of TensorBoard event files: where each record's data lies, checked.

A file is a sequence of records::

    uint64 length | uint32 masked CRC-32C of length | data[length] | uint32 masked CRC-32C of data

:func:`record_spans` returns the data of every record TensorBoard's reader would return, and stops
where it stops: at a truncated tail (a record still being written) or at the first record whose
length or data checksum does not match. TensorBoard checks both checksums in pure Python, one
byte at a time, which is most of its reading time; here the checksums of all records of a file
are computed together, one numpy step per byte position.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator

import numpy as np

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("<Q")
_LENGTH_BYTES = 8
_HEADER_BYTES = 12
"""The length and its checksum."""
_FRAME_BYTES = 16
"""The header and the data's checksum: what a record adds to its data."""
_CRC32C_POLY = 0x82F63B78
_CRC_MASK_DELTA = 0xA282EAD8
_MIN_VECTOR_ROWS = 16
"""Below this many records still being summed, numpy's cost per call outweighs its speed: the few
long records left (a graph, a histogram) are finished one byte at a time in Python."""


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (_CRC32C_POLY if crc & 1 else 0)
        table.append(crc)
    return table


_TABLE = _crc32c_table()
_TABLE_ARRAY = np.array(_TABLE, dtype=np.uint32)


def _crc32c_update(crc: int, data: bytes | memoryview | np.ndarray) -> int:
    table = _TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc


def _mask(crc: int | np.ndarray) -> int | np.ndarray:
    """Finalize a CRC-32C register and mask it the way TFRecord stores it."""
    crc = crc ^ 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C TFRecord files store (pure Python: for writing and short inputs)."""
    return int(_mask(_crc32c_update(0xFFFFFFFF, data)))


def masked_crc32c_many(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The masked CRC-32C of each ``buf[start:start + length]`` (``buf`` of uint8), as uint32.

    Ranges are taken longest first, so the ones still going at byte ``j`` are a prefix of them, and
    one step updates them all.
    """
    order = np.argsort(-lengths, kind="stable")
    starts, lengths = starts[order], lengths[order]
    crc = np.full(len(order), 0xFFFFFFFF, dtype=np.uint32)
    longer_than = len(lengths) - np.searchsorted(lengths[::-1], np.arange(lengths.max(initial=0)), side="right")
    done = 0
    for done, active in enumerate(longer_than.tolist()):
        if active < _MIN_VECTOR_ROWS:
            break
        register = crc[:active]
        register ^= buf[starts[:active] + done]
        crc[:active] = _TABLE_ARRAY[register & 0xFF] ^ (register >> 8)
    else:
        done = len(longer_than)
    for row in np.flatnonzero(lengths > done).tolist():
        start, stop = starts[row] + done, starts[row] + lengths[row]
        crc[row] = _crc32c_update(int(crc[row]), buf[start:stop])
    masked = np.empty_like(crc)
    masked[order] = _mask(crc)
    return masked


def _uint32_at(buf: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The little-endian uint32 at each position."""
    return buf[positions[:, None] + np.arange(4)].view("<u4").ravel()


def _record_starts(data: bytes) -> list[int]:
    """Where each record starts, trusting every length (the checksums are checked afterwards)."""
    unpack = _LENGTH.unpack_from
    starts: list[int] = []
    append = starts.append
    pos, last = 0, len(data) - _HEADER_BYTES
    while pos <= last:
        append(pos)
        pos += unpack(data, pos)[0] + _FRAME_BYTES
    return starts


def _first_false(mask: np.ndarray) -> int:
    bad = np.flatnonzero(~mask)
    return int(bad[0]) if len(bad) else len(mask)


def record_spans(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, lengths)`` of the data of each good record of ``data``, in file order (int64 arrays).

    Stops at a truncated tail and, with a warning, at the first record whose length or data
    checksum is wrong: the rest of such a file is unreadable, to TensorBoard as well.
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    starts = np.array(_record_starts(data), dtype=np.int64)
    stated = buf[starts[:, None] + np.arange(_LENGTH_BYTES)].view("<u8").ravel()
    # A corrupt length may not fit an int64; no record is longer than the file.
    lengths = np.minimum(stated, len(data)).astype(np.int64)
    header_ok = masked_crc32c_many(buf, starts, np.full(len(starts), _LENGTH_BYTES)) == _uint32_at(
        buf, starts + _LENGTH_BYTES
    )
    count = _first_false(header_ok)
    if count < len(starts):
        log.warning("event record at byte %d has a bad length CRC: ignoring the rest of the file", starts[count])
    count = min(count, _first_false(starts + lengths + _FRAME_BYTES <= len(data)))
    starts, lengths = starts[:count] + _HEADER_BYTES, lengths[:count]
    data_ok = masked_crc32c_many(buf, starts, lengths) == _uint32_at(buf, starts + lengths)
    count = _first_false(data_ok)
    if count < len(starts):
        log.warning("event record at byte %d has a bad data CRC: ignoring the rest of the file", starts[count])
    return starts[:count], lengths[:count]


def iter_records(data: bytes) -> Iterator[memoryview]:
    """The data of each good record of ``data`` (see :func:`record_spans`)."""
    view = memoryview(data)
    starts, lengths = record_spans(data)
    for start, length in zip(starts.tolist(), lengths.tolist()):
        yield view[start : start + length]
