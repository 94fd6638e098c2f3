"""Rows of whole samples: packed into ``data.seq_len`` positions and kept apart, or one a row, padded.

A sample of ``n`` tokens fills ``n - 1`` positions of a row: its inputs are its first ``n - 1`` tokens,
its targets its last ``n - 1``, a target being ``IGNORE_INDEX`` where the sample's mask is 0. Its position
ids run ``0 .. n - 2``, restarting at each sample; the row's padding (the tokenizer's pad id) is one more
run of positions from 0, with ``IGNORE_INDEX`` targets, and is marked as no sample's (``RowBatch.real``), so
it routes no token of a MoE balance. The trainer tells the attention where each sample starts from the
restarts (``hpcsweep.train.data.sample_attention``: a block-diagonal mask, or flash attention's
variable-length sequences), so a packed row computes what its samples compute run alone.

Which samples share a row is a pure function of ``(seed, split, epoch)``: each epoch visits the
samples in a seeded order, and each goes into the first of the last ``OPEN_ROWS`` rows that has room
for it (a new row if none has).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from hpcsweep.model.ignore_index import IGNORE_INDEX

OPEN_ROWS = 64
"""Rows still open to later samples while packing: more fill rows better, and cost more time."""


def pack_rows(positions: np.ndarray, seq_len: int, open_rows: int = OPEN_ROWS) -> list[list[int]]:
    """The samples (indices into ``positions``, in the order given) of each row of ``seq_len``
    positions, sample ``i`` taking ``positions[i]`` of them (at most ``seq_len``)."""
    rows: list[list[int]] = []
    room: list[int] = []
    open_ids: list[int] = []
    for sample, need in enumerate(positions.tolist()):
        for slot, row in enumerate(open_ids):
            if room[row] >= need:
                rows[row].append(sample)
                room[row] -= need
                if room[row] == 0:
                    open_ids.pop(slot)
                break
        else:
            rows.append([sample])
            room.append(seq_len - need)
            if room[-1] > 0:
                open_ids.append(len(rows) - 1)
                if len(open_ids) > open_rows:
                    open_ids.pop(0)
    return rows


@dataclass(frozen=True)
class RowBatch:
    """Rows of samples as arrays (``rows x seq_len`` each)."""

    inputs: np.ndarray
    targets: np.ndarray
    """``IGNORE_INDEX`` where no loss is taken."""
    position_ids: np.ndarray
    real: np.ndarray
    """True where a position holds a sample's token, False on padding."""
    used: int
    """Positions that hold a sample's token (not padding)."""


class SampleRows:
    """The rows of one split of a chat corpus, epoch after epoch.

    ``tokens`` and ``mask`` are the entry's arrays (memory-mapped; ``mask`` None: every target takes
    the loss); ``starts`` and ``lengths`` the split's samples in them; ``pad_id`` the tokenizer's
    (``hpcsweep.prepare.text_tokens.pad_token_id``).
    """

    def __init__(self, tokens: np.ndarray, mask: np.ndarray | None, starts: np.ndarray, lengths: np.ndarray,
                 *, seq_len: int, packing: bool, seed: int, split: int, pad_id: int) -> None:
        self.tokens, self.mask, self.starts, self.lengths = tokens, mask, starts, lengths
        self.seq_len, self.packing, self.seed, self.split, self.pad_id = seq_len, packing, seed, split, pad_id
        self._epoch_rows = functools.lru_cache(maxsize=2)(self._rows_of_epoch)
        self._epoch_sizes: list[int] = []

    def _rows_of_epoch(self, epoch: int) -> list[np.ndarray]:
        order = np.random.default_rng([self.seed, self.split, epoch]).permutation(len(self.starts))
        if not self.packing:
            return [order[i : i + 1] for i in range(len(order))]
        return [order[row] for row in pack_rows(self.lengths[order] - 1, self.seq_len)]

    def epoch_size(self, epoch: int) -> int:
        """Rows in ``epoch``."""
        while len(self._epoch_sizes) <= epoch:
            self._epoch_sizes.append(len(self._epoch_rows(len(self._epoch_sizes))))
        return self._epoch_sizes[epoch]

    def row_samples(self, row: int) -> np.ndarray:
        """The samples of global row ``row`` (rows count on across epochs)."""
        epoch = 0
        while row >= self.epoch_size(epoch):
            row -= self.epoch_size(epoch)
            epoch += 1
        return self._epoch_rows(epoch)[row]

    def fill_rate(self) -> float:
        """Useful positions over row positions, over the first epoch."""
        used = int((self.lengths - 1).sum())
        return used / (self.epoch_size(0) * self.seq_len)

    def batch(self, first_row: int, rows: int) -> RowBatch:
        """Rows ``first_row .. first_row + rows - 1`` as arrays."""
        shape = (rows, self.seq_len)
        inputs = np.full(shape, self.pad_id, dtype=np.int64)
        targets = np.full(shape, IGNORE_INDEX, dtype=np.int64)
        positions = np.empty(shape, dtype=np.int64)
        real = np.zeros(shape, dtype=bool)
        used = 0
        for r in range(rows):
            at = 0
            for sample in self.row_samples(first_row + r).tolist():
                start, n = int(self.starts[sample]), int(self.lengths[sample])
                ids = np.asarray(self.tokens[start : start + n], dtype=np.int64)
                takes = (np.ones(n - 1, dtype=bool) if self.mask is None
                         else np.asarray(self.mask[start + 1 : start + n], dtype=bool))
                inputs[r, at : at + n - 1] = ids[:-1]
                targets[r, at : at + n - 1] = np.where(takes, ids[1:], IGNORE_INDEX)
                positions[r, at : at + n - 1] = np.arange(n - 1)
                at += n - 1
            positions[r, at:] = np.arange(self.seq_len - at)
            real[r, :at] = True
            used += at
        return RowBatch(inputs, targets, positions, real, used)
