"""A ``data=chat`` trial's samples: read from the token cache entry, selected, split, served as rows.

The samples a trial uses are ``hpcsweep.files.chat_samples.select_samples``'s (``data.max_samples``,
``data.overlong``); a truncated sample with no loss token left is left out too. The validation split
is whole samples: a seeded ``data.val_fraction`` of them (at least one). Each split's rows come from
``hpcsweep.train.data.packing.SampleRows``; the global batch of a step is the next
``batch_size x world_size x grad_accum`` rows, and a rank and micro-step take one contiguous slice
of it, as windows are taken from a token file, so a batch is a pure function of its numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from hpcsweep.config import DataConfig
from hpcsweep.files.chat_samples import check_samples
from hpcsweep.files.token_cache import MASK_NAME, OFFSETS_NAME, chat_rendering, text_corpus
from hpcsweep.files.token_file import TokenFileError, read_token_header
from hpcsweep.model.ignore_index import IGNORE_INDEX
from hpcsweep.train.data.batch import Batch
from hpcsweep.train.data.packing import SampleRows

log = logging.getLogger(__name__)

_TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
_SPLITS = {"train": 0, "val": 1}


@dataclass(frozen=True)
class SampleCorpus:
    """The rows of a corpus of whole samples, training and validation: a chat corpus's samples, or a
    text corpus's documents (``hpcsweep.train.data.document_rows``)."""

    train: SampleRows
    val: SampleRows
    vocab_size: int
    dropped: int
    """Samples left out (too long under ``data.overlong=drop``, or truncated to no loss token)."""

    def batch(self, split: str, *, step: int, rank: int, micro_step: int, world_size: int, grad_accum: int,
              rows: int) -> Batch:
        """This rank's and micro-step's ``rows`` rows of the global batch of ``step``."""
        source = self.train if split == "train" else self.val
        slot = micro_step * world_size + rank
        first = (step * grad_accum * world_size + slot) * rows
        arrays = source.batch(first, rows)
        targets = torch.from_numpy(arrays.targets)
        return Batch(torch.from_numpy(arrays.inputs), targets, torch.from_numpy(arrays.position_ids),
                     int((targets != IGNORE_INDEX).sum()), torch.from_numpy(arrays.real))

    def fill_rate(self) -> float:
        """Useful positions over row positions of the training rows (their first epoch)."""
        return self.train.fill_rate()


def split_samples(count: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (into the selected samples, sorted) of the training and the validation samples."""
    order = np.random.default_rng([seed, count]).permutation(count)
    held_out = max(1, int(round(count * val_fraction)))
    return np.sort(order[held_out:]), np.sort(order[:held_out])


def load_chat_corpus(cfg: DataConfig, model_vocab_size: int, tokenizer: str, *,
                     trust_remote_code: bool = False) -> SampleCorpus:
    """The chat corpus ``cfg`` names, from its cache entry; ``ValueError`` naming the key when the entry
    is missing, or its vocabulary is larger than the model's. ``tokenizer`` (loaded with
    ``trust_remote_code``) gives the padding's id."""
    assert cfg.files is not None
    corpus = text_corpus(cfg.files, tokenizer, cfg.cache_dir, "data.tokenizer",
                         chat_rendering(cfg.chat_template, cfg.train_on, cfg.chat_template_kwargs))
    if not corpus.is_cached():
        raise ValueError(
            f"data.files={cfg.files!r} is not allowed: no token cache entry {corpus.entry} for it (the corpus, "
            "the tokenizer or the template changed since the sweep prepared it, or its preparation did not finish)"
        )
    try:
        header = read_token_header(corpus.token_path)
    except TokenFileError as err:
        raise ValueError(f"data.files={cfg.files!r} is not allowed: its cache entry is broken ({err})") from None
    if header.vocab_size > model_vocab_size:
        raise ValueError(f"model.vocab_size={model_vocab_size} is not allowed: data.files={cfg.files!r} needs at "
                         f"least {header.vocab_size} (its tokenizer's vocabulary)")
    selection = check_samples(corpus, cfg)
    tokens = np.memmap(corpus.token_path, dtype=_TOKEN_DTYPES[header.dtype], mode="r")
    mask = np.memmap(corpus.entry / MASK_NAME, dtype=np.uint8, mode="r")
    offsets = np.fromfile(corpus.entry / OFFSETS_NAME, dtype=np.int64)
    starts = offsets[np.asarray(selection.indices, dtype=np.int64)]
    lengths = np.asarray(selection.lengths, dtype=np.int64)
    # A sample's targets are its tokens after the first: keep those samples with a loss token among them.
    takes_loss = np.array([mask[s + 1 : s + n].any() for s, n in zip(starts.tolist(), lengths.tolist())], dtype=bool)
    starts, lengths = starts[takes_loss], lengths[takes_loss]
    dropped = selection.dropped + int((~takes_loss).sum())
    if len(starts) < 2:
        raise ValueError(f"data.files={cfg.files!r} is not allowed: {len(starts)} usable sample(s) at "
                         f"data.seq_len={cfg.seq_len}, at least 2 are needed")
    log.info("chat data: %s; %d left out with no loss token", selection.summary(cfg), int((~takes_loss).sum()))
    from hpcsweep.prepare.text_tokens import load_tokenizer, pad_token_id

    pad_id = pad_token_id(load_tokenizer(tokenizer, trust_remote_code=trust_remote_code))
    return sample_corpus(tokens, mask, starts, lengths, cfg, header.vocab_size, pad_id, dropped)


def sample_corpus(tokens: np.ndarray, mask: np.ndarray | None, starts: np.ndarray, lengths: np.ndarray,
                  cfg: DataConfig, vocab_size: int, pad_id: int, dropped: int = 0) -> SampleCorpus:
    """The samples at ``starts`` (``lengths`` tokens each) of ``tokens``, split into training and
    validation, as rows (``mask`` None: every target takes the loss; padding holds ``pad_id``)."""
    train_ids, val_ids = split_samples(len(starts), cfg.val_fraction, cfg.seed)
    log.info("%d training and %d validation samples, %s", len(train_ids), len(val_ids),
             "packed into rows" if cfg.packing else "one a row, padded")

    def rows(ids: np.ndarray, split: str) -> SampleRows:
        return SampleRows(tokens, mask, starts[ids], lengths[ids], seq_len=cfg.seq_len, packing=bool(cfg.packing),
                          seed=cfg.seed, split=_SPLITS[split], pad_id=pad_id)

    return SampleCorpus(rows(train_ids, "train"), rows(val_ids, "val"), vocab_size, dropped)
