"""Which samples of a ``data=chat`` cache entry a trial trains on: ``data.max_samples`` and ``data.overlong``.

A sample of ``n`` tokens takes ``n - 1`` positions of a row (its last token is only a target), so it
fits a row of ``data.seq_len`` when ``n <= seq_len + 1``. The selection is a pure function of the
entry's sample offsets and the data config, standard library only: the login node and the
preparation job refuse an overlong sample (``data.overlong=refuse``) before any trial starts, and the
trainer selects the same samples with the same function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpcsweep.config import DataConfig
from hpcsweep.files.token_cache import TextCorpus


@dataclass(frozen=True)
class SampleSelection:
    """The samples a trial uses, in corpus order."""

    indices: list[int]
    """Each used sample's index in the entry."""
    lengths: list[int]
    """Its tokens, after truncation."""
    dropped: int
    """Samples left out for being longer than a row (``data.overlong=drop``)."""
    truncated: int
    """Samples cut to a row (``data.overlong=truncate``)."""
    first_overlong: int | None
    """The entry index of the first sample longer than a row, if any."""

    def summary(self, data: DataConfig) -> str:
        """One line for the log: how many samples are used and what became of the overlong ones."""
        line = f"{len(self.indices)} samples"
        if self.dropped:
            line += (f"; data.overlong=drop: {self.dropped} longer than data.seq_len={data.seq_len} "
                     f"(+1 target) left out")
        if self.truncated:
            line += f"; data.overlong=truncate: {self.truncated} cut to data.seq_len={data.seq_len} (+1 target)"
        return line


def select_samples(offsets: Sequence[int], data: DataConfig) -> SampleSelection:
    """The samples of an entry with sample starts ``offsets`` (and the total last) that ``data`` uses."""
    row = data.seq_len + 1
    count = len(offsets) - 1
    if data.max_samples is not None:
        count = min(count, data.max_samples)
    indices, lengths, dropped, truncated, first = [], [], 0, 0, None
    for index in range(count):
        length = offsets[index + 1] - offsets[index]
        if length > row:
            first = index if first is None else first
            if data.overlong == "drop":
                dropped += 1
                continue
            truncated += 1
            length = row
        indices.append(index)
        lengths.append(length)
    return SampleSelection(indices, lengths, dropped, truncated, first)


def check_samples(corpus: TextCorpus, data: DataConfig) -> SampleSelection:
    """The selection of a written chat entry; ``ValueError`` naming ``data.overlong`` and the sample's
    file and line when one is longer than a row under ``refuse``, or naming ``data.files`` when fewer
    than two samples (a training and a validation one) are left."""
    selection = select_samples(corpus.sample_offsets(), data)
    if data.overlong == "refuse" and selection.first_overlong is not None:
        offsets = corpus.sample_offsets()
        index = selection.first_overlong
        raise ValueError(
            f"data.overlong=refuse is not allowed here: the sample at {corpus.sample_source(index)} has "
            f"{offsets[index + 1] - offsets[index]} tokens, more than data.seq_len={data.seq_len} + 1 "
            "(set data.overlong=drop or truncate, or a larger data.seq_len)"
        )
    if len(selection.indices) < 2:
        raise ValueError(f"data.files={data.files!r} is not allowed: {selection.summary(data)} are left, "
                         "at least 2 are needed (a training and a validation one)")
    return selection
