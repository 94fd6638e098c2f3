"""Which pairs of a ``data=preference`` cache entry a trial trains on: ``data.max_samples`` and ``data.overlong``.

One rule, applied where each can first be: by the login node when the entry is cached, by the preparation job
once it has written the entry (a refusal fails the job, so no trial of the sweep starts after its wait in the
queue), and by the trial. A pair whose chosen or rejected sequence is longer than a row (``data.seq_len + 1``
tokens, a row's positions and its last target) is left out under ``data.overlong=drop``, refused naming its
file and line under ``refuse``, and cut to a row under ``truncate``, where a pair with an answer cut away whole
is left out. Stdlib only, as the rest of what the login node reads of an entry.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from hpcsweep.config import DataConfig
from hpcsweep.files.token_cache import OFFSETS_NAME, SOURCES_NAME, SPANS_NAME, TextCorpus


@dataclass(frozen=True)
class PairSelection:
    """The pairs a trial uses: ``kept`` (pair indices, ascending), and of every sequence of the entry's first
    ``data.max_samples`` pairs (pair ``i``'s chosen ``2i``, rejected ``2i + 1``) its length and answer span as a
    trial reads them (cut to a row under ``truncate``)."""

    kept: list[int]
    lengths: list[int]
    spans: list[tuple[int, int]]
    left_out: int
    """Pairs not used: a sequence too long under ``drop``, or an answer cut away whole under ``truncate``."""
    truncated: int
    """Pairs used with a sequence cut to a row (``truncate``)."""

    def summary(self, data: DataConfig) -> str:
        """One line for the log: how many pairs are used and what became of the overlong ones."""
        line = f"{len(self.kept)} pairs used"
        if self.left_out:
            line += f"; {self.left_out} left out (longer than data.seq_len={data.seq_len}, data.overlong={data.overlong})"
        if self.truncated:
            line += f"; data.overlong=truncate: {self.truncated} cut to data.seq_len={data.seq_len} (+1 target)"
        return line


def select_pairs(lengths: Sequence[int], spans: Sequence[tuple[int, int]], data: DataConfig,
                 where: Sequence[str]) -> PairSelection:
    """The selection of the pairs with sequence ``lengths`` and answer ``spans`` (two a pair); ``ValueError``
    naming ``data.overlong`` and ``where`` (each sequence's ``FILE:LINE``) of the first pair with a sequence longer
    than a row under ``refuse``."""
    row = data.seq_len + 1
    pairs = len(lengths) // 2
    if data.max_samples is not None:
        pairs = min(pairs, data.max_samples)
    out_lengths, out_spans = list(lengths[: 2 * pairs]), [tuple(s) for s in spans[: 2 * pairs]]
    kept, truncated = [], 0
    for pair in range(pairs):
        both = (2 * pair, 2 * pair + 1)
        longest = max(out_lengths[i] for i in both)
        if longest <= row:
            kept.append(pair)
            continue
        if data.overlong == "refuse":
            raise ValueError(
                f"data.overlong=refuse is not allowed here: the pair at {where[2 * pair]} has a sequence of "
                f"{longest} tokens, more than data.seq_len={data.seq_len} + 1 (set data.overlong=drop or truncate, "
                "or a larger data.seq_len)")
        if data.overlong == "drop":
            continue
        for i in both:
            out_lengths[i] = min(out_lengths[i], row)
            start, end = out_spans[i]
            out_spans[i] = (min(start, row), min(end, row))
        if all(out_spans[i][1] > out_spans[i][0] for i in both):
            kept.append(pair)
            truncated += 1
    return PairSelection(kept, out_lengths, out_spans, pairs - len(kept), truncated)


def check_pairs(corpus: TextCorpus, data: DataConfig) -> PairSelection:
    """The selection of a written preference entry (``select_pairs``); ``ValueError`` also naming ``data.files``
    when fewer than two pairs (a training and a validation one) are left."""
    offsets, spans, sources = array("q"), array("q"), array("q")
    offsets.frombytes((corpus.entry / OFFSETS_NAME).read_bytes())
    spans.frombytes((corpus.entry / SPANS_NAME).read_bytes())
    sources.frombytes((corpus.entry / SOURCES_NAME).read_bytes())
    lengths = [offsets[i + 1] - offsets[i] for i in range(len(offsets) - 1)]
    where = [f"{corpus.files[sources[2 * i]].path}:{sources[2 * i + 1]}" for i in range(len(lengths))]
    selection = select_pairs(lengths, list(zip(spans[0::2], spans[1::2])), data, where)
    if len(selection.kept) < 2:
        raise ValueError(f"data.files={data.files!r} is not allowed: {selection.summary(data)} at "
                         f"data.seq_len={data.seq_len}, at least 2 are needed (a training and a validation one)")
    return selection
