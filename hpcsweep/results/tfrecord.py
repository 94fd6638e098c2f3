"""TFRecord framing, the container of TensorBoard event files: where each record's data lies, checked.

A file is a sequence of records::

    uint64 length | uint32 masked CRC-32C of length | data[length] | uint32 masked CRC-32C of data

:func:`read_records` finds in each file the records TensorBoard's reader returns, and stops where it
stops: at a truncated tail (a record still being written) or at the first record whose length or
data checksum does not match. TensorBoard checks both checksums in pure Python, one byte at a time,
which is most of its reading time; here the checksums of all records of many files are computed
together, one numpy step per byte position, so numpy's cost per call is paid once for them all.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
longest records (a graph, a histogram) are finished one byte at a time in Python."""
_CACHE_ROWS = 16384
"""Ranges summed together: the bytes the next step reads are then still in the CPU's cache (a
million ranges at once go back to memory at every byte, 2.4 times slower)."""
_MIN_VECTOR_FILES = 64
"""Below this many files still being framed, a numpy step (some 15 us) costs more than the plain
loop takes for one record of each."""


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


def masked_crc32c_many(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The masked CRC-32C of each ``buf[start:start + length]`` (``buf`` of uint8), as uint32."""
    key = lengths.max(initial=0) - lengths
    # numpy sorts 16-bit integers by radix: ten times faster than int64 on a million records.
    order = np.argsort(key.astype(np.uint16) if key.max(initial=0) < 2**16 else key, kind="stable")
    masked = np.empty(len(order), dtype=np.uint32)
    for first in range(0, len(order), _CACHE_ROWS):
        rows = order[first : first + _CACHE_ROWS]
        masked[rows] = _mask(_crc32c_longest_first(buf, starts[rows], lengths[rows]))
    return masked


def _crc32c_longest_first(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The CRC-32C registers of ranges sorted longest first: the ones still going at byte ``j``
    are a prefix of them, and one step updates them all."""
    crc = np.full(len(starts), 0xFFFFFFFF, dtype=np.uint32)
    # Vectorized while at least _MIN_VECTOR_ROWS ranges are still going, then the longest few alone.
    columns = int(lengths[_MIN_VECTOR_ROWS - 1]) if len(lengths) >= _MIN_VECTOR_ROWS else 0
    going = len(lengths) - np.searchsorted(lengths[::-1], np.arange(columns), side="right")
    for column, active in enumerate(going.tolist()):
        register = crc[:active]
        register ^= buf[starts[:active] + column]
        crc[:active] = _TABLE_ARRAY[register & 0xFF] ^ (register >> 8)
    for row in np.flatnonzero(lengths > columns).tolist():
        crc[row] = _crc32c_update(int(crc[row]), buf[starts[row] + columns : starts[row] + lengths[row]])
    return crc


def _number_at(buf: np.ndarray, positions: np.ndarray, dtype: str) -> np.ndarray:
    """The little-endian number of ``dtype`` at each position."""
    return buf[positions[:, None] + np.arange(np.dtype(dtype).itemsize)].view(dtype).ravel()


def _record_starts(joined: bytes, buf: np.ndarray, file_starts: np.ndarray, file_ends: np.ndarray) -> np.ndarray:
    """Where each record of each file starts in ``joined``, in order, trusting every length (the
    checksums are checked afterwards).

    Each file is a chain (a record's length says where the next one starts), so all files advance
    one record per numpy step; once fewer than ``_MIN_VECTOR_FILES`` files go on, they finish in a
    plain loop.
    """
    pos, ends = file_starts.copy(), file_ends.copy()
    found = []
    while True:
        going = pos <= ends - _HEADER_BYTES
        pos, ends = pos[going], ends[going]
        if len(pos) < _MIN_VECTOR_FILES:
            break
        found.append(pos)
        # A corrupt length may not fit an int64: bound it by the room its file has left first.
        stated = np.minimum(_number_at(buf, pos, "<u8"), (ends - pos).astype(np.uint64))
        pos = pos + stated.astype(np.int64) + _FRAME_BYTES
    unpack = _LENGTH.unpack_from
    for start, end in zip(pos.tolist(), ends.tolist()):
        rest = []
        while start <= end - _HEADER_BYTES:
            rest.append(start)
            start += unpack(joined, start)[0] + _FRAME_BYTES
        found.append(np.array(rest, dtype=np.int64))
    # Files lie one after the other in ``joined``: in position order, records are in file order.
    return np.sort(np.concatenate([np.empty(0, dtype=np.int64), *found]))


def _first_failures(ok: np.ndarray, file_of: np.ndarray, files: int) -> np.ndarray:
    """Per file, the index of its first record that is not ``ok`` (``len(ok)`` where all are)."""
    failing = np.flatnonzero(~ok)
    first = np.full(files, len(ok), dtype=np.int64)
    np.minimum.at(first, file_of[failing], failing)
    return first


@dataclass(frozen=True)
class Records:
    """The good records of several event files, joined in one buffer.

    File ``i``'s records are ``bounds[i]:bounds[i + 1]`` of ``starts`` and ``lengths`` (int64 arrays,
    the data of each record, in file order). ``damaged`` lists the files cut short by a bad checksum.
    """

    buf: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    bounds: np.ndarray
    damaged: list[int]


def read_records(files: Sequence[bytes]) -> Records:
    """The good records of each file's contents: every complete record up to the first whose length
    or data checksum is wrong, as TensorBoard's reader returns them."""
    joined = b"".join(files)
    buf = np.frombuffer(joined, dtype=np.uint8)
    sizes = np.array([len(data) for data in files], dtype=np.int64)
    file_ends = np.cumsum(sizes)
    starts = _record_starts(joined, buf, file_ends - sizes, file_ends)
    file_of = np.searchsorted(file_ends, starts, side="right")
    room = file_ends[file_of] - starts - _FRAME_BYTES
    # A corrupt length may not fit an int64: bound it by the room its file has left first.
    lengths = np.minimum(_number_at(buf, starts, "<u8"), np.maximum(room + 1, 0).astype(np.uint64)).astype(np.int64)
    header_ok = masked_crc32c_many(buf, starts, np.full(len(starts), _LENGTH_BYTES)) == _number_at(
        buf, starts + _LENGTH_BYTES, "<u4"
    )
    # The rest of a file is unreadable from its first truncated record, or bad checksum, on.
    first = _first_failures(header_ok & (lengths <= room), file_of, len(files))
    cut = np.flatnonzero(first < len(starts))
    damaged = set(cut[~header_ok[first[cut]]].tolist())
    keep = np.arange(len(starts)) < first[file_of]
    starts, lengths, file_of = starts[keep] + _HEADER_BYTES, lengths[keep], file_of[keep]
    data_ok = masked_crc32c_many(buf, starts, lengths) == _number_at(buf, starts + lengths, "<u4")
    first = _first_failures(data_ok, file_of, len(files))
    damaged.update(np.flatnonzero(first < len(starts)).tolist())
    keep = np.arange(len(starts)) < first[file_of]
    bounds = np.searchsorted(file_of[keep], np.arange(len(files) + 1))
    return Records(buf, starts[keep], lengths[keep], bounds, sorted(damaged))
