"""Token data: a synthetic corpus with learnable structure, a memory-mapped token file, and a
sampler that is a pure function of ``(seed, step, rank, micro_step)``.

``data.kind=chat`` reads whole samples instead of windows (``hpcsweep.train.data.samples``), as does
``data.kind=text`` with ``data.packing`` (its documents); ``get_rows`` gives either as a ``Batch``.

Because a batch depends on nothing but those numbers, the sampler's position in a checkpoint is
just the step, and a resumed run sees exactly the batches it would have seen. The global batch of
a step is the same for any split into ranks x micro-steps, so 2 ranks x batch b equals 1 rank x 2b.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hpcsweep.config import DataConfig, check_corpus_fits
from hpcsweep.files.token_cache import text_corpus
from hpcsweep.files.token_file import TokenFileError, header_path, header_text, read_token_header

if TYPE_CHECKING:
    import torch

    from hpcsweep.train.data.batch import Batch
    from hpcsweep.train.data.pairs import PairCorpus
    from hpcsweep.train.data.samples import SampleCorpus

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
SUCCESSORS = 4
"""Synthetic corpus: each token has this many possible successors."""
_CHAINS = 1024
"""Synthetic corpus: independent chains generated side by side, so generation is vectorised."""
_TRAIN, _VAL = 0, 1


@dataclass(frozen=True)
class Corpus:
    """A token array (in memory or memory-mapped) split into train and validation parts."""

    tokens: np.ndarray
    vocab_size: int
    val_start: int
    """Tokens from here on are the validation split."""


def markov_corpus(vocab_size: int, num_tokens: int, seed: int) -> np.ndarray:
    """A seeded sparse Markov chain over the vocabulary.

    Each token has ``SUCCESSORS`` successors with skewed probabilities, so a model can learn to
    roughly 1 nat per token while the unigram entropy is about ``ln(vocab_size)``.
    """
    rng = np.random.default_rng([seed, vocab_size])
    successors = rng.integers(0, vocab_size, size=(vocab_size, SUCCESSORS))
    weights = rng.dirichlet(np.full(SUCCESSORS, 0.5), size=vocab_size)
    cumulative = np.cumsum(weights, axis=1)
    length = -(-num_tokens // _CHAINS)
    out = np.empty((_CHAINS, length), dtype=np.int64)
    out[:, 0] = rng.integers(0, vocab_size, size=_CHAINS)
    uniforms = rng.random((length, _CHAINS))
    for t in range(1, length):
        state = out[:, t - 1]
        choice = (uniforms[t][:, None] > cumulative[state]).sum(axis=1).clip(max=SUCCESSORS - 1)
        out[:, t] = successors[state, choice]
    return out.reshape(-1)[:num_tokens]


def write_token_file(path: Path, tokens: np.ndarray, vocab_size: int, tokenizer: str) -> None:
    """Write ``tokens`` as a raw ``.bin`` plus its JSON header (dtype, vocab size, count)."""
    dtype = "uint16" if vocab_size <= 2**16 else "uint32"
    np.asarray(tokens, dtype=DTYPES[dtype]).tofile(path)
    header_path(path).write_text(header_text(dtype, vocab_size, int(len(tokens)), tokenizer))


def open_token_file(path: Path) -> tuple[np.ndarray, int]:
    """The memory-mapped tokens of ``path`` and the vocabulary size from its header."""
    try:
        header = read_token_header(path)
    except TokenFileError as err:
        raise ValueError(f"data.path={str(path)!r} is not allowed: {err}") from None
    # One read-only memmap for the whole run: pages are shared between ranks on a node and only
    # the sampled windows are ever read.
    tokens = np.memmap(path, dtype=DTYPES[header.dtype], mode="r")
    return tokens, header.vocab_size


def load_corpus(
    cfg: DataConfig, model_vocab_size: int, tokenizer: str | None = None, *, trust_remote_code: bool = False,
    reference: str | None = None,
) -> Corpus | SampleCorpus | PairCorpus:
    """The corpus ``cfg`` names, checked against the model's vocabulary.

    ``data.kind=text`` reads its token cache entry as ``data.kind=file`` reads ``data.path``;
    ``tokenizer`` is the folder it was tokenized with (``hpcsweep.config.tokenizer_folder``), loaded
    (for packing's EOS) with ``trust_remote_code`` (``model.trust_remote_code``).
    ``data.kind=chat`` reads its samples (``hpcsweep.train.data.samples``), ``data.kind=preference`` its pairs
    (``hpcsweep.train.data.pairs``; with the precomputed log-probabilities of the folder ``reference``, if given), and ``data.kind=text`` with ``data.packing`` its documents
    (``hpcsweep.train.data.document_rows``).
    """
    if cfg.kind == "preference":
        from hpcsweep.train.data.pairs import load_preference_corpus

        assert tokenizer is not None
        return load_preference_corpus(cfg, model_vocab_size, tokenizer, trust_remote_code=trust_remote_code,
                                      reference=reference)
    if cfg.kind == "chat":
        from hpcsweep.train.data.samples import load_chat_corpus

        assert tokenizer is not None
        return load_chat_corpus(cfg, model_vocab_size, tokenizer, trust_remote_code=trust_remote_code)
    if cfg.kind == "synthetic":
        tokens = markov_corpus(model_vocab_size, cfg.synthetic_tokens, cfg.seed)
        vocab_size = model_vocab_size
        source = f"the synthetic corpus (data.synthetic_tokens={cfg.synthetic_tokens})"
    elif cfg.kind == "text":
        assert cfg.files is not None and tokenizer is not None
        corpus = text_corpus(cfg.files, tokenizer, cfg.cache_dir, "data.tokenizer")
        if not corpus.is_cached():
            raise ValueError(
                f"data.files={cfg.files!r} is not allowed: no token cache entry {corpus.entry} for it (the corpus "
                "or the tokenizer changed since the sweep prepared it, or its preparation did not finish)"
            )
        tokens, vocab_size = open_token_file(corpus.token_path)
        source = f"data.files={cfg.files!r} ({corpus.token_path})"
    else:
        tokens, vocab_size = open_token_file(Path(cfg.path))
        source = cfg.path
    check_corpus_fits(cfg, model_vocab_size, num_tokens=len(tokens), corpus_vocab_size=vocab_size, source=source)
    if cfg.packing:  # data.kind=text: its documents, packed
        from hpcsweep.train.data.document_rows import document_corpus

        assert tokenizer is not None
        return document_corpus(tokens, vocab_size, cfg, tokenizer, trust_remote_code=trust_remote_code)
    return Corpus(tokens, vocab_size, int(len(tokens) * (1 - cfg.val_fraction)))


def window_starts(seed: int, split: int, step: int, global_batch: int, num_starts: int) -> np.ndarray:
    """The start offsets of every sequence in one global batch: a pure function of its inputs."""
    rng = np.random.default_rng([seed, split, step])
    return rng.integers(0, num_starts, size=global_batch)


def wait_as_slow_storage(delay_ms: int) -> None:
    """``data.read_delay_ms``: hold a training batch read back, a test's stand-in for slow storage."""
    time.sleep(delay_ms / 1000)


def get_batch(
    corpus: Corpus,
    cfg: DataConfig,
    *,
    split: str,
    step: int,
    rank: int,
    micro_step: int,
    world_size: int,
    grad_accum: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets (``batch_size x seq_len`` each) for one rank and micro-step.

    The global batch of ``step`` is ``batch_size x world_size x grad_accum`` windows; this rank and
    micro-step take one contiguous slice of it. A training read waits ``data.read_delay_ms`` first.
    """
    import torch  # here, not at the top: scripts/prepare-data imports this module and needs no torch

    if split == "train" and cfg.read_delay_ms:
        wait_as_slow_storage(cfg.read_delay_ms)
    lo, hi = (0, corpus.val_start) if split == "train" else (corpus.val_start, len(corpus.tokens))
    global_batch = cfg.batch_size * world_size * grad_accum
    starts = window_starts(
        cfg.seed, _TRAIN if split == "train" else _VAL, step, global_batch, hi - lo - cfg.seq_len - 1
    )
    slot = micro_step * world_size + rank
    mine = lo + starts[slot * cfg.batch_size : (slot + 1) * cfg.batch_size]
    windows = corpus.tokens[mine[:, None] + np.arange(cfg.seq_len + 1)]
    windows = torch.from_numpy(windows.astype(np.int64))
    return windows[:, :-1], windows[:, 1:]


def get_rows(
    corpus: Corpus | SampleCorpus | PairCorpus,
    cfg: DataConfig,
    *,
    split: str,
    step: int,
    rank: int,
    micro_step: int,
    world_size: int,
    grad_accum: int,
) -> Batch:
    """``get_batch``'s windows, or a chat corpus's rows of samples, as a ``Batch`` (same arguments)."""
    from hpcsweep.train.data.batch import Batch  # here: scripts/prepare-data imports this module and needs no torch

    if isinstance(corpus, Corpus):
        inputs, targets = get_batch(corpus, cfg, split=split, step=step, rank=rank, micro_step=micro_step,
                                    world_size=world_size, grad_accum=grad_accum)
        return Batch(inputs, targets, None, targets.numel())
    if split == "train" and cfg.read_delay_ms:
        wait_as_slow_storage(cfg.read_delay_ms)
    return corpus.batch(split, step=step, rank=rank, micro_step=micro_step, world_size=world_size,
                        grad_accum=grad_accum, rows=cfg.batch_size)


def same_loss_tokens(corpus: Corpus | SampleCorpus | PairCorpus) -> bool:
    """Whether every micro-batch takes the loss on the same number of targets (windows do, and pairs: each
    micro-batch holds ``data.batch_size`` of them; rows of samples do not, so a step weighs its micro-batches by
    their counts)."""
    from hpcsweep.train.data.pairs import PairCorpus  # here: scripts/prepare-data imports this module and needs no torch

    return isinstance(corpus, (Corpus, PairCorpus))


def fill_rate(corpus: Corpus | SampleCorpus | PairCorpus) -> float | None:
    """A chat corpus's useful positions over its training rows' positions; None for windows (always full)."""
    return None if isinstance(corpus, Corpus) else corpus.fill_rate()
