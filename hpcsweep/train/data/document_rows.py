"""``data=text`` with ``data.packing=true``: the corpus's documents as samples, packed into rows.

A ``data=text`` cache entry puts the tokenizer's EOS after every document, so the documents are the
runs of tokens that end in EOS. A document longer than a row (``seq_len + 1`` tokens) is cut into
pieces of a row each, every piece starting at the last token of the one before, so each of its
targets is taken exactly once; a piece's position ids restart like a document's. Every target takes
the loss. The rest is a chat corpus's: a seeded share of the pieces is the validation split, and
rows are packed by ``hpcsweep.train.data.packing``.
"""

from __future__ import annotations

import logging

import numpy as np

from hpcsweep.config import DataConfig
from hpcsweep.train.data.samples import SampleCorpus, sample_corpus

log = logging.getLogger(__name__)


def document_pieces(ends: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The starts and lengths of the pieces of the documents that end (exclusive) at ``ends``: each
    at most ``seq_len + 1`` tokens, consecutive pieces of a document sharing one token, and no piece
    shorter than 2 tokens (it would have no target)."""
    doc_starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    doc_lengths = ends.astype(np.int64) - doc_starts
    doc_starts, doc_lengths = doc_starts[doc_lengths >= 2], doc_lengths[doc_lengths >= 2]
    counts = -(-(doc_lengths - 1) // seq_len)
    first_piece = np.repeat(np.cumsum(counts) - counts, counts)
    k = np.arange(int(counts.sum())) - first_piece
    starts = np.repeat(doc_starts, counts) + k * seq_len
    lengths = np.minimum(seq_len + 1, np.repeat(doc_lengths, counts) - k * seq_len)
    return starts, lengths


def document_corpus(
    tokens: np.ndarray, vocab_size: int, cfg: DataConfig, tokenizer: str, *, trust_remote_code: bool,
) -> SampleCorpus:
    """The text corpus ``tokens`` (its cache entry, tokenized by ``tokenizer``, which loads with
    ``trust_remote_code``) as packed rows of its documents; ``ValueError`` naming ``data.files`` when it
    holds fewer than 2."""
    from hpcsweep.prepare.text_tokens import load_tokenizer, pad_token_id

    loaded = load_tokenizer(tokenizer, trust_remote_code=trust_remote_code)
    eos = loaded.eos_token_id
    starts, lengths = document_pieces(np.flatnonzero(np.asarray(tokens) == eos) + 1, cfg.seq_len)
    if len(starts) < 2:
        raise ValueError(f"data.files={cfg.files!r} is not allowed: {len(starts)} document(s), at least 2 are needed "
                         "with data.packing=true (a training and a validation one)")
    log.info("text documents: %d pieces of at most data.seq_len=%d + 1 tokens", len(starts), cfg.seq_len)
    return sample_corpus(tokens, None, starts, lengths, cfg, vocab_size, pad_token_id(loaded))
