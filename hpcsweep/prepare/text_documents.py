"""The documents of a text corpus, cut into pieces that worker processes tokenize side by side.

A ``.txt`` file is one document; a ``.jsonl`` file holds one document per line, in the line's
``text`` field (blank lines are skipped). A large ``.jsonl`` is cut at line boundaries into pieces
of about ``piece_bytes``, so its lines spread over the workers; a piece is a byte range of one file.
Reading a piece is a pure function of the file's bytes, so the order of pieces is the order of the
corpus, whatever worker reads which.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JSONL_SUFFIXES = (".jsonl",)
"""Files read as JSON lines; any other file is one plain-text document."""
PIECE_BYTES = 8 << 20
"""About how much of a JSON lines file one worker tokenizes at a time."""


class CorpusError(ValueError):
    """A corpus file that cannot be read as documents; the message names the file (and line)."""


@dataclass(frozen=True)
class Piece:
    """Bytes ``[start, end)`` of one file (``end`` None: to the end of a plain-text file)."""

    path: str
    start: int = 0
    end: int | None = None


def is_jsonl(path: str) -> bool:
    return Path(path).suffix.lower() in JSONL_SUFFIXES


def pieces_of(path: str, size: int, piece_bytes: int = PIECE_BYTES) -> list[Piece]:
    """The pieces of one file of ``size`` bytes: a plain-text file whole, a JSON lines file cut after
    a newline every ``piece_bytes`` or so."""
    if not is_jsonl(path) or size <= piece_bytes:
        return [Piece(path, 0, None if not is_jsonl(path) else size)]
    cuts = [0]
    with open(path, "rb") as handle:
        while cuts[-1] + piece_bytes < size:
            handle.seek(cuts[-1] + piece_bytes)
            handle.readline()  # to the end of the line the cut falls in
            position = handle.tell()
            if position >= size:
                break
            cuts.append(position)
    return [Piece(path, start, end) for start, end in zip(cuts, [*cuts[1:], size])]


def corpus_pieces(files: Sequence[tuple[str, int]], piece_bytes: int = PIECE_BYTES) -> list[Piece]:
    """Every piece of ``files`` (``(path, size)`` pairs), in corpus order."""
    return [piece for path, size in files for piece in pieces_of(path, size, piece_bytes)]


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{where} is not UTF-8 text ({err})") from None


def line_number(path: str, offset: int) -> int:
    """The 1-based number of the line that starts at byte ``offset`` of ``path``."""
    with open(path, "rb") as handle:
        return handle.read(offset).count(b"\n") + 1


def jsonl_lines(text: str) -> list[str]:
    """The lines of JSON Lines ``text``: split at ``\n`` only (a ``\r`` before it dropped), since a JSON
    string may hold U+2028, U+0085 or a form feed as they are, which ``str.splitlines`` splits at too."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def jsonl_records(text: str, path: str, first_line: int = 1) -> list[tuple[int, Any]]:
    """``(line, record)`` of every non-blank line of ``text`` (lines numbered from ``first_line``);
    ``CorpusError`` naming the file and line of one that is not JSON."""
    records = []
    for number, line in enumerate(jsonl_lines(text), start=first_line):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as err:
            raise CorpusError(f"{path}:{number} is not a JSON object ({err.msg})") from None
    return records


def jsonl_documents(text: str, path: str, first_line: int = 1) -> list[str]:
    """The ``text`` field of every non-blank line of ``text`` (lines numbered from ``first_line``)."""
    documents = []
    for number, record in jsonl_records(text, path, first_line):
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise CorpusError(f"{path}:{number} has no string field 'text'")
        documents.append(record["text"])
    return documents


def read_documents(piece: Piece) -> list[str]:
    """The documents in ``piece``."""
    with open(piece.path, "rb") as handle:
        handle.seek(piece.start)
        data = handle.read() if piece.end is None else handle.read(piece.end - piece.start)
    if not is_jsonl(piece.path):
        return [_decode(data, piece.path)]
    first_line = line_number(piece.path, piece.start) if piece.start else 1
    return jsonl_documents(_decode(data, piece.path), piece.path, first_line)
