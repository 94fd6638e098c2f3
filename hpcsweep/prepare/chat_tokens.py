"""Tokenize a ``data=chat`` corpus once, into its token cache entry (``hpcsweep.files.token_cache``).

Each sample (``hpcsweep.prepare.chat_render``) becomes its tokens, its loss mask and its place: the
entry holds ``tokens.bin`` (with its header ``tokens.json``, which also says what the other files
are), ``mask.bin``, ``offsets.bin`` and ``sources.bin``. As for ``data=text``, pieces of the corpus
are rendered by a pool of worker processes and written in corpus order, into a staging folder that
is renamed into place, so a reader sees a whole entry or none.

The Slurm preparation job (``python -m hpcsweep.prepare``) writes chat entries too: a
request with a ``chat`` field is one of these.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpcsweep.files.token_cache import MASK_NAME, OFFSETS_NAME, SOURCES_NAME, TOKENS_NAME, ChatRendering, TextCorpus
from hpcsweep.files.token_file import header_path, header_text
from hpcsweep.prepare.chat_render import load_chat_tokenizer, render_sample, renderer, samples_in, special_ids
from hpcsweep.prepare.text_documents import CorpusError, Piece, corpus_pieces, is_jsonl, line_number

log = logging.getLogger(__name__)

_worker: tuple[Any, Any, str, set[int]] | None = None
"""This worker process's (tokenizer, render, train_on, end-of-turn ids), loaded once by the pool's initializer."""


@dataclass(frozen=True)
class RenderedPiece:
    """The samples of one piece of the corpus, concatenated."""

    tokens: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    """Tokens of each sample (int64)."""
    lines: np.ndarray
    """The 1-based line of each sample (int64)."""
    path: str


def piece_samples(tokenizer: Any, render: Any, train_on: str, end_of_turn: set[int], piece: Piece) -> RenderedPiece:
    """Render every sample of ``piece``; ``CorpusError`` naming the file and line of a bad one."""
    with open(piece.path, "rb") as handle:
        handle.seek(piece.start)
        data = handle.read() if piece.end is None else handle.read(piece.end - piece.start)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{piece.path} is not UTF-8 text ({err})") from None
    first_line = line_number(piece.path, piece.start) if piece.start else 1
    ids, masks, lines = [], [], []
    for line, messages in samples_in(text, piece.path, first_line):
        sample_ids, sample_mask = render_sample(tokenizer, render, messages, train_on, f"{piece.path}:{line}",
                                                end_of_turn)
        ids.append(sample_ids)
        masks.append(sample_mask)
        lines.append(line)
    if not ids:
        empty = np.empty(0, dtype=np.int64)
        return RenderedPiece(empty, np.empty(0, dtype=np.uint8), empty, empty, piece.path)
    return RenderedPiece(np.concatenate(ids), np.concatenate(masks), np.array([len(i) for i in ids], dtype=np.int64),
                         np.array(lines, dtype=np.int64), piece.path)


def _init_worker(folder: str, rendering: ChatRendering, trust_remote_code: bool) -> None:
    global _worker
    tokenizer, template = load_chat_tokenizer(folder, rendering.template_path, trust_remote_code=trust_remote_code)
    _worker = (tokenizer, renderer(tokenizer, template, rendering.template_variables()), rendering.train_on,
               special_ids(tokenizer))


def _render_in_worker(piece: Piece) -> RenderedPiece:
    assert _worker is not None
    return piece_samples(*_worker, piece)


def rendered_pieces(corpus: TextCorpus, pieces: Sequence[Piece], workers: int) -> Iterator[RenderedPiece]:
    """Each piece's samples, in the order of ``pieces``, from ``workers`` processes (1: this one)."""
    assert corpus.chat is not None
    initargs = (corpus.tokenizer_folder, corpus.chat, corpus.trust_remote_code)
    if workers <= 1 or len(pieces) <= 1:
        _init_worker(*initargs)
        for piece in pieces:
            yield _render_in_worker(piece)
        return
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(min(workers, len(pieces)), mp_context=context,
                             initializer=_init_worker, initargs=initargs) as pool:
        yield from pool.map(_render_in_worker, pieces)


def write_chat_files(corpus: TextCorpus, staging: Path, workers: int, piece_bytes: int | None = None) -> int:
    """Render ``corpus`` into the entry's files in ``staging``; return the number of samples."""
    assert corpus.chat is not None
    not_jsonl = [f.path for f in corpus.files if not is_jsonl(f.path)]
    if not_jsonl:
        raise CorpusError(f"data.files matches {not_jsonl[0]}, not a .jsonl file: data.kind=chat reads JSON lines")
    tokenizer, _ = load_chat_tokenizer(corpus.tokenizer_folder, corpus.chat.template_path,
                                       trust_remote_code=corpus.trust_remote_code)
    vocab_size = len(tokenizer)
    dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
    index_of = {f.path: i for i, f in enumerate(corpus.files)}
    pieces = corpus_pieces([(f.path, f.size) for f in corpus.files], *([piece_bytes] if piece_bytes else []))
    count, offsets, sources = 0, [np.zeros(1, dtype=np.int64)], []
    with open(staging / TOKENS_NAME, "wb") as tokens, open(staging / MASK_NAME, "wb") as mask:
        for piece in rendered_pieces(corpus, pieces, workers):
            tokens.write(piece.tokens.astype(dtype).tobytes())
            mask.write(piece.mask.tobytes())
            offsets.append(count + np.cumsum(piece.lengths))
            sources.append(np.stack([np.full(len(piece.lines), index_of[piece.path]), piece.lines], axis=1))
            count += len(piece.tokens)
        for handle in (tokens, mask):
            handle.flush()
            os.fsync(handle.fileno())
    starts = np.concatenate(offsets)
    samples = len(starts) - 1
    starts.astype(np.int64).tofile(staging / OFFSETS_NAME)
    np.concatenate(sources).astype(np.int64).tofile(staging / SOURCES_NAME)
    header = json.loads(header_text(np.dtype(dtype).name, vocab_size, count, corpus.tokenizer_folder,
                                    corpus.tokenizer_sha256))
    header.update(kind="chat", samples=samples, mask=MASK_NAME, offsets=OFFSETS_NAME, sources=SOURCES_NAME,
                  files=[f.path for f in corpus.files], train_on=corpus.chat.train_on,
                  chat_template=corpus.chat.template_path or "the tokenizer's own",
                  chat_template_kwargs=corpus.chat.template_variables())
    header_path(staging / TOKENS_NAME).write_text(json.dumps(header, indent=2) + "\n")
    log.info("rendered %d samples of %d files with %s: %d tokens, %d of them taking the loss (%d workers)",
             samples, len(corpus.files), corpus.tokenizer_folder, count,
             int(np.fromfile(staging / MASK_NAME, dtype=np.uint8).sum()), workers)
    return samples
