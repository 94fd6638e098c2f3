"""A ``data=preference`` trial's pairs: read from the token cache entry, split, served as rows of answers.

The entry (``hpcsweep.prepare.preference_tokens``) holds two sequences a pair, its prompt with the chosen answer
and with the rejected one, and each answer's span. A micro-batch is ``data.batch_size`` whole pairs (TRL's
per-device batch counts pairs too): their ``2 x batch_size`` sequences, chosen then rejected, pair after pair,
packed into ``data.seq_len`` rows as chat samples are (``hpcsweep.train.data.packing.pack_rows``: each sequence's
position ids restart at 0, so the trainer's attention keeps it apart, ``sample_attention``), or one sequence a
padded row with ``data.packing=false``. A target takes part only inside an answer: elsewhere (the prompt, the
padding) it is ``IGNORE_INDEX``, and ``Batch.answers`` says which answer each answer target is (pair ``p``'s
chosen ``2p``, its rejected ``2p + 1``, counted within the micro-batch), which is what
``hpcsweep.train.preference.answer_logps`` sums over.

Which pairs a step takes is a pure function of ``(seed, split, step, rank, micro-step)``: each epoch visits the
split's pairs in a seeded order, and the global batch of a step is the next ``batch_size x world_size x
grad_accum`` pairs of that sequence, a rank and micro-step taking one contiguous slice, as for chat samples. The
validation split is a seeded ``data.val_fraction`` of the pairs (at least one). Which pairs are used, under
``data.max_samples`` and ``data.overlong``, is ``hpcsweep.files.preference_pairs``' rule, the one the login node and
the preparation job apply before any trial starts.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import torch

from hpcsweep.config import DataConfig
from hpcsweep.files.preference_pairs import check_pairs
from hpcsweep.files.token_cache import OFFSETS_NAME, chat_rendering, text_corpus
from hpcsweep.files.token_file import TokenFileError, read_token_header
from hpcsweep.model.ignore_index import IGNORE_INDEX
from hpcsweep.train.data.batch import Batch
from hpcsweep.train.data.packing import pack_rows
from hpcsweep.train.data.samples import split_samples

log = logging.getLogger(__name__)

_TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
_SPLITS = {"train": 0, "val": 1}


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, split: int, epoch: int, pairs: int) -> np.ndarray:
    """The order one epoch visits a split's ``pairs`` in (kept for the epoch's batches: one permutation each)."""
    return np.random.default_rng([seed, split, epoch]).permutation(pairs)


@dataclass(frozen=True)
class PairRows:
    """One split's pairs: sequence ``2i`` of ``starts``/``lengths``/``spans`` is pair ``i``'s chosen, ``2i + 1`` its
    rejected (``spans``: each answer's ``[start, end)`` tokens, from its sequence's start)."""

    tokens: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    spans: np.ndarray
    seq_len: int
    packing: bool
    seed: int
    split: int
    pad_id: int
    batch_pairs: int
    """``data.batch_size``: the pairs of a micro-batch, whose sequences are packed together."""
    reference: np.ndarray | None = None
    """Each sequence's answer log-probability under the reference, precomputed (float64); None: none."""

    @property
    def pairs(self) -> int:
        return len(self.starts) // 2

    def pair_at(self, index: int) -> int:
        """The pair visited at global position ``index`` (epoch after epoch, each in its seeded order)."""
        epoch, at = divmod(index, self.pairs)
        return int(_epoch_order(self.seed, self.split, epoch, self.pairs)[at])

    def rows_of(self, pairs: list[int]) -> list[list[int]]:
        """The answers of each row holding ``pairs``' sequences, each answer numbered by its place in ``pairs``
        (``2 x place``: chosen, ``+ 1``: rejected), so a pair visited twice counts as two."""
        if not self.packing:
            return [[answer] for answer in range(2 * len(pairs))]
        needs = self.lengths[self._sequences(pairs)] - 1
        return pack_rows(needs, self.seq_len)

    @staticmethod
    def _sequences(pairs: list[int]) -> np.ndarray:
        """The split's sequences of ``pairs``, chosen then rejected, in the order of ``pairs``."""
        return (2 * np.asarray(pairs, dtype=np.int64)[:, None] + np.arange(2)).reshape(-1)

    def batch(self, first: int, count: int) -> Batch:
        """The ``count`` pairs visited from global position ``first``, as rows."""
        pairs = [self.pair_at(first + i) for i in range(count)]
        sequences = self._sequences(pairs)
        rows = self.rows_of(pairs)
        shape = (len(rows), self._width(sequences, rows))
        inputs = np.full(shape, self.pad_id, dtype=np.int64)
        targets = np.full(shape, IGNORE_INDEX, dtype=np.int64)
        answers = np.full(shape, -1, dtype=np.int64)
        positions = np.empty(shape, dtype=np.int64)
        real = np.zeros(shape, dtype=bool)
        for r, row in enumerate(rows):
            at = 0
            for answer in row:
                sequence = int(sequences[answer])
                start, n = int(self.starts[sequence]), int(self.lengths[sequence])
                lo, hi = (int(v) for v in self.spans[sequence])
                ids = np.asarray(self.tokens[start : start + n], dtype=np.int64)
                inputs[r, at : at + n - 1] = ids[:-1]
                # Answer token j is the target at position j - 1.
                targets[r, at + lo - 1 : at + hi - 1] = ids[lo:hi]
                answers[r, at + lo - 1 : at + hi - 1] = answer
                positions[r, at : at + n - 1] = np.arange(n - 1)
                at += n - 1
            positions[r, at:] = np.arange(shape[1] - at)
            real[r, :at] = True
        reference = None if self.reference is None else torch.from_numpy(self.reference[sequences])
        return Batch(torch.from_numpy(inputs), torch.from_numpy(targets), torch.from_numpy(positions), count,
                     torch.from_numpy(real), answers=torch.from_numpy(answers), pairs=count, reference=reference)

    def _width(self, sequences: np.ndarray, rows: list[list[int]]) -> int:
        """The positions of a micro-batch's rows: its fullest row's, at most ``data.seq_len``. Positions after every
        row's last sequence would hold padding alone (TRL pads to the batch's longest too), which a causal model's
        earlier positions never read; a padded row (``data.packing=false``) would be mostly that."""
        needs = self.lengths[sequences] - 1
        return max(int(sum(needs[answer] for answer in row)) for row in rows)

    def fill_rate(self) -> float:
        """Sequence positions over row positions of the split's first epoch, in micro-batches of ``batch_pairs``."""
        order = _epoch_order(self.seed, self.split, 0, self.pairs).tolist()
        positions = 0
        for i in range(0, self.pairs, self.batch_pairs):
            pairs = order[i : i + self.batch_pairs]
            rows = self.rows_of(pairs)
            positions += len(rows) * self._width(self._sequences(pairs), rows)
        return int((self.lengths - 1).sum()) / positions


@dataclass(frozen=True)
class PairCorpus:
    """The training and validation pairs of a preference corpus, served a micro-batch of pairs at a time."""

    train: PairRows
    val: PairRows
    vocab_size: int
    dropped: int
    """Pairs left out: a sequence too long under ``data.overlong=drop``, or an answer truncated away."""

    def batch(self, split: str, *, step: int, rank: int, micro_step: int, world_size: int, grad_accum: int,
              rows: int) -> Batch:
        """This rank's and micro-step's ``rows`` pairs (``data.batch_size``) of the global batch of ``step``."""
        source = self.train if split == "train" else self.val
        slot = micro_step * world_size + rank
        return source.batch((step * grad_accum * world_size + slot) * rows, rows)

    def fill_rate(self) -> float:
        """Useful positions over row positions of the training rows (their first epoch)."""
        return self.train.fill_rate()


def load_preference_corpus(cfg: DataConfig, model_vocab_size: int, tokenizer: str, *,
                           trust_remote_code: bool = False, reference: str | None = None) -> PairCorpus:
    """The preference corpus ``cfg`` names, from its cache entry; ``ValueError`` naming the key when the entry is
    missing or broken, its vocabulary is larger than the model's, or fewer than 2 pairs fit (``check_pairs``).
    ``tokenizer`` (loaded with ``trust_remote_code``) gives the padding's id. ``reference``: the model folder whose
    precomputed answer log-probabilities the rows carry (``hpcsweep.prepare.reference_logps``; None: none)."""
    assert cfg.files is not None
    corpus = text_corpus(cfg.files, tokenizer, cfg.cache_dir, "data.tokenizer",
                         chat_rendering(cfg.chat_template, cfg.train_on, cfg.chat_template_kwargs), preference=True)
    if not corpus.is_cached():
        raise ValueError(
            f"data.files={cfg.files!r} is not allowed: no token cache entry {corpus.entry} for it (the pairs, the "
            "tokenizer or the template changed since the sweep prepared it, or its preparation did not finish)")
    try:
        header = read_token_header(corpus.token_path)
    except TokenFileError as err:
        raise ValueError(f"data.files={cfg.files!r} is not allowed: its cache entry is broken ({err})") from None
    if header.vocab_size > model_vocab_size:
        raise ValueError(f"model.vocab_size={model_vocab_size} is not allowed: data.files={cfg.files!r} needs at "
                         f"least {header.vocab_size} (its tokenizer's vocabulary)")
    tokens = np.memmap(corpus.token_path, dtype=_TOKEN_DTYPES[header.dtype], mode="r")
    selection = check_pairs(corpus, cfg)
    kept = np.asarray(selection.kept, dtype=np.int64)
    lengths = np.asarray(selection.lengths, dtype=np.int64)
    spans = np.asarray(selection.spans, dtype=np.int64).reshape(-1, 2)
    starts = np.fromfile(corpus.entry / OFFSETS_NAME, dtype=np.int64)[: len(lengths)]
    reference_logps = None
    if reference is not None:
        from hpcsweep.prepare.reference_logps import reference_path

        path = reference_path(corpus.entry, reference)
        if not path.is_file():
            raise ValueError(f"model.path={reference} is not allowed: no reference log-probabilities {path} for "
                             "data.files (the folder changed since the sweep prepared them, or its preparation did "
                             "not finish)")
        reference_logps = np.fromfile(path, dtype=np.float64)
    dropped = selection.left_out
    from hpcsweep.prepare.text_tokens import load_tokenizer, pad_token_id

    pad_id = pad_token_id(load_tokenizer(tokenizer, trust_remote_code=trust_remote_code))
    train_ids, val_ids = split_samples(len(kept), cfg.val_fraction, cfg.seed)
    log.info("preference data: %d training and %d validation pairs, %d left out (longer than data.seq_len=%d, "
             "data.overlong=%s), %s", len(train_ids), len(val_ids), dropped, cfg.seq_len, cfg.overlong,
             "packed into rows" if cfg.packing else "one sequence a row, padded")

    def rows(ids: np.ndarray, split: str) -> PairRows:
        sequences = (2 * kept[ids][:, None] + np.arange(2)).reshape(-1)
        return PairRows(tokens, starts[sequences], lengths[sequences], spans[sequences], seq_len=cfg.seq_len,
                        packing=bool(cfg.packing), seed=cfg.seed, split=_SPLITS[split], pad_id=pad_id,
                        batch_pairs=cfg.batch_size, reference=None if reference_logps is None else reference_logps[sequences])

    return PairCorpus(rows(train_ids, "train"), rows(val_ids, "val"), header.vocab_size, dropped)
