"""Tokenize a ``data=preference`` corpus once, into its token cache entry (``hpcsweep.files.token_cache``).

Each pair (``hpcsweep.prepare.preference_samples``) becomes two sequences, the prompt with its chosen answer and
the prompt with its rejected one, each rendered by the model's chat template as ``data=chat`` renders a sample
(``hpcsweep.prepare.chat_render``: the template's text of the prompt's messages and one assistant turn, with
``data.chat_template_kwargs``) and tokenized whole, as ``apply_chat_template(tokenize=True)`` would. Each
sequence's answer span is recorded: the tokens from where the template has the model start to write the answer
to its end-of-turn token (``chat_render.token_mask`` of the last assistant turn); the tokens before it are the
prompt's. The entry holds ``tokens.bin`` (its header ``tokens.json`` says ``kind: preference``), ``offsets.bin``
(the first token of each sequence, then the total: pair ``i``'s chosen sequence is number ``2i``, its rejected
one ``2i + 1``), ``spans.bin`` (int64 pairs per sequence: the answer's first token and one past its last,
counted from the sequence's start) and ``sources.bin`` (each sequence's file and line). As for chat, pieces of
the corpus are rendered by worker processes and written in corpus order into a staging folder renamed into place.
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

from hpcsweep.files.token_cache import OFFSETS_NAME, SOURCES_NAME, SPANS_NAME, TOKENS_NAME, TextCorpus
from hpcsweep.files.token_file import header_path, header_text
from hpcsweep.prepare.chat_render import Render, assistant_spans, load_chat_tokenizer, renderer, special_ids, token_mask
from hpcsweep.prepare.preference_samples import ANSWERS, PreferencePair, preference_pair
from hpcsweep.prepare.text_documents import CorpusError, Piece, corpus_pieces, is_jsonl, jsonl_records, line_number

log = logging.getLogger(__name__)

_worker: tuple[Any, Render, set[int]] | None = None
"""This worker process's (tokenizer, render, end-of-turn ids), loaded once by the pool's initializer."""


def answer_sequence(tokenizer: Any, render: Render, pair: PreferencePair, answer: str, where: str,
                    end_of_turn: set[int]) -> tuple[np.ndarray, tuple[int, int]]:
    """The token ids (int64) of ``pair``'s prompt followed by ``answer`` (one assistant turn), as the template
    renders them, and the answer's ``[start, end)`` tokens; ``CorpusError`` naming ``where`` when the answer cannot
    be located or no token of it is left once tokenized."""
    messages = [*pair.prompt, {"role": "assistant", "content": answer}]
    text, spans = assistant_spans(render, messages, where)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(encoded["input_ids"], dtype=np.int64)
    # Only the answer's turn: a conversational prompt's own assistant turns are the prompt's.
    taken = np.flatnonzero(token_mask(encoded["offset_mapping"], text, spans[-1:], end_of_turn, encoded["input_ids"]))
    if not len(taken):
        raise CorpusError(f"{where}: no token of the answer is left once tokenized")
    start, end = int(taken[0]), int(taken[-1]) + 1
    if start == 0:
        raise CorpusError(f"{where}: the answer starts at the sequence's first token: the template renders no prompt")
    return ids, (start, end)


@dataclass(frozen=True)
class RenderedPairs:
    """The sequences of one piece's pairs (chosen, rejected, next pair's chosen, ...), concatenated."""

    tokens: np.ndarray
    lengths: np.ndarray
    """Tokens of each sequence (int64)."""
    spans: np.ndarray
    """Each sequence's answer ``[start, end)``, ``sequences x 2`` (int64)."""
    lines: np.ndarray
    """The 1-based line of each sequence's pair (int64)."""
    path: str


def piece_pairs(tokenizer: Any, render: Render, end_of_turn: set[int], piece: Piece) -> RenderedPairs:
    """Render every pair of ``piece``; ``CorpusError`` naming the file and line of a bad one."""
    with open(piece.path, "rb") as handle:
        handle.seek(piece.start)
        data = handle.read() if piece.end is None else handle.read(piece.end - piece.start)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{piece.path} is not UTF-8 text ({err})") from None
    first_line = line_number(piece.path, piece.start) if piece.start else 1
    ids, spans, lines = [], [], []
    for line, record in jsonl_records(text, piece.path, first_line):
        where = f"{piece.path}:{line}"
        pair = preference_pair(record, where)
        for key in ANSWERS:
            sequence, span = answer_sequence(tokenizer, render, pair, getattr(pair, key), f"{where} ({key})",
                                             end_of_turn)
            ids.append(sequence)
            spans.append(span)
            lines.append(line)
    if not ids:
        empty = np.empty(0, dtype=np.int64)
        return RenderedPairs(empty, empty, np.empty((0, 2), dtype=np.int64), empty, piece.path)
    return RenderedPairs(np.concatenate(ids), np.array([len(i) for i in ids], dtype=np.int64),
                         np.array(spans, dtype=np.int64), np.array(lines, dtype=np.int64), piece.path)


def _init_worker(corpus: TextCorpus) -> None:
    global _worker
    assert corpus.chat is not None
    tokenizer, template = load_chat_tokenizer(corpus.tokenizer_folder, corpus.chat.template_path,
                                              trust_remote_code=corpus.trust_remote_code)
    _worker = (tokenizer, renderer(tokenizer, template, corpus.chat.template_variables()), special_ids(tokenizer))


def _render_in_worker(piece: Piece) -> RenderedPairs:
    assert _worker is not None
    return piece_pairs(*_worker, piece)


def rendered_pieces(corpus: TextCorpus, pieces: Sequence[Piece], workers: int) -> Iterator[RenderedPairs]:
    """Each piece's pairs, in the order of ``pieces``, from ``workers`` processes (1: this one)."""
    if workers <= 1 or len(pieces) <= 1:
        _init_worker(corpus)
        for piece in pieces:
            yield _render_in_worker(piece)
        return
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(min(workers, len(pieces)), mp_context=context,
                             initializer=_init_worker, initargs=(corpus,)) as pool:
        yield from pool.map(_render_in_worker, pieces)


def write_preference_files(corpus: TextCorpus, staging: Path, workers: int, piece_bytes: int | None = None) -> int:
    """Render ``corpus``'s pairs into the entry's files in ``staging``; return the number of pairs."""
    assert corpus.chat is not None and corpus.preference
    not_jsonl = [f.path for f in corpus.files if not is_jsonl(f.path)]
    if not_jsonl:
        raise CorpusError(f"data.files matches {not_jsonl[0]}, not a .jsonl file: data.kind=preference reads JSON "
                          "lines")
    tokenizer, _ = load_chat_tokenizer(corpus.tokenizer_folder, corpus.chat.template_path,
                                       trust_remote_code=corpus.trust_remote_code)
    vocab_size = len(tokenizer)
    dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
    index_of = {f.path: i for i, f in enumerate(corpus.files)}
    pieces = corpus_pieces([(f.path, f.size) for f in corpus.files], *([piece_bytes] if piece_bytes else []))
    count, offsets, spans, sources = 0, [np.zeros(1, dtype=np.int64)], [], []
    with open(staging / TOKENS_NAME, "wb") as tokens:
        for piece in rendered_pieces(corpus, pieces, workers):
            tokens.write(piece.tokens.astype(dtype).tobytes())
            offsets.append(count + np.cumsum(piece.lengths))
            spans.append(piece.spans)
            sources.append(np.stack([np.full(len(piece.lines), index_of[piece.path]), piece.lines], axis=1))
            count += len(piece.tokens)
        tokens.flush()
        os.fsync(tokens.fileno())
    starts = np.concatenate(offsets)
    pairs = (len(starts) - 1) // 2
    starts.astype(np.int64).tofile(staging / OFFSETS_NAME)
    np.concatenate(spans).astype(np.int64).tofile(staging / SPANS_NAME)
    np.concatenate(sources).astype(np.int64).tofile(staging / SOURCES_NAME)
    header = json.loads(header_text(np.dtype(dtype).name, vocab_size, count, corpus.tokenizer_folder,
                                    corpus.tokenizer_sha256))
    header.update(kind="preference", pairs=pairs, offsets=OFFSETS_NAME, spans=SPANS_NAME, sources=SOURCES_NAME,
                  files=[f.path for f in corpus.files],
                  chat_template=corpus.chat.template_path or "the tokenizer's own",
                  chat_template_kwargs=corpus.chat.template_variables())
    header_path(staging / TOKENS_NAME).write_text(json.dumps(header, indent=2) + "\n")
    log.info("rendered %d preference pairs of %d files with %s: %d tokens in %d sequences (%d workers)",
             pairs, len(corpus.files), corpus.tokenizer_folder, count, 2 * pairs, workers)
    return pairs
