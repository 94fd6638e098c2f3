"""TFRecord framing: vectorized checksums equal TensorBoard's, and records stop where TensorBoard's reader stops."""

from __future__ import annotations

import struct

import numpy as np
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference

from hpcsweep.results.tfrecord import masked_crc32c_many, read_records


def framed(payloads: list[bytes]) -> bytes:
    out = b""
    for payload in payloads:
        header = struct.pack("<Q", len(payload))
        out += header + struct.pack("<I", reference(header)) + payload + struct.pack("<I", reference(payload))
    return out


def test_many_checksums_at_once_match_tensorboard():
    rng = np.random.default_rng(1)
    buf = rng.integers(0, 256, 20_000, dtype=np.uint8)
    starts = rng.integers(0, 15_000, 500)
    lengths = rng.integers(0, 60, 500)
    lengths[:3] = [4000, 3000, 0]  # the long ones are finished one byte at a time
    expected = [reference(bytes(buf[s : s + n])) for s, n in zip(starts, lengths)]
    assert masked_crc32c_many(buf, starts, lengths).tolist() == expected
    assert masked_crc32c_many(buf, starts[:0], lengths[:0]).tolist() == []


def test_many_checksums_in_several_cache_sized_groups():
    rng = np.random.default_rng(2)
    buf = rng.integers(0, 256, 50_000, dtype=np.uint8)
    starts, lengths = rng.integers(0, 49_000, 40_000), rng.integers(0, 20, 40_000)
    expected = [reference(bytes(buf[s : s + n])) for s, n in zip(starts, lengths)]
    assert masked_crc32c_many(buf, starts, lengths).tolist() == expected


def spans(records, file: int) -> list[bytes]:
    lo, hi = records.bounds[file], records.bounds[file + 1]
    return [records.buf[s : s + n].tobytes() for s, n in zip(records.starts[lo:hi], records.lengths[lo:hi])]


def test_each_file_stops_at_its_own_truncated_or_damaged_record():
    payloads = [bytes([i]) * (i + 1) for i in range(6)]
    good = framed(payloads)
    truncated = good[:-3]
    bad_data = bytearray(good)
    bad_data[len(framed(payloads[:2])) + 12] ^= 1  # first data byte of record 2
    bad_length = bytearray(good)
    bad_length[len(framed(payloads[:4])) + 9] ^= 1  # the length checksum of record 4
    files = [good, truncated, bytes(bad_data), b"", bytes(bad_length), good[:5]]
    expected = [payloads, payloads[:5], payloads[:2], [], payloads[:4], []]
    for copies in (1, 20):  # 120 files: framed side by side in numpy until fewer than 64 go on
        records = read_records(files * copies)
        assert [spans(records, i) for i in range(len(files) * copies)] == expected * copies
        # A truncated tail is a file still being written, not damage.
        assert records.damaged == [i + len(files) * k for k in range(copies) for i in (2, 4)]


def test_a_corrupt_length_larger_than_any_file_is_caught():
    header = struct.pack("<Q", 2**64 - 1)
    records = read_records([framed([b"ok"]) + header + struct.pack("<I", reference(header)) + b"xyz"])
    assert spans(records, 0) == [b"ok"]
    assert records.damaged == []
