"""Every line of a chat or preference corpus (and of a ``data=text`` corpus's ``.jsonl`` files) read on the login
node, before anything is queued: a line that is not JSON, or not a sample (a pair), is refused here with the
preparation job's own words (``FILE:LINE ...``) instead of after that job waited for a node.

These files are megabytes, checked at about 300 MB a CPU-second (64 MiB of multi-turn chat samples in 0.23 s,
measured when this was written): a corpus of up to ``CHECK_BYTES`` is read whole. A bigger
one is sampled: each file's first and last window and windows spread evenly between them, ``WINDOW_BYTES`` each
and ``CHECK_BYTES`` in all, cut at line boundaries; the preparation job still reads every line, and its refusal
names the line as this one would. The summary counts the samples (extrapolated from the windows when sampled)
and estimates their tokens from the bytes of their text, at the rate the trial's own tokenizer gives the first
``RATE_BYTES`` of it (``tokenizer.json``, with the ``tokenizers`` library, no torch), else at 4 bytes a token.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hpcsweep.files.token_cache import TextCorpus
from hpcsweep.prepare.chat_render import sample_messages
from hpcsweep.prepare.preference_samples import preference_pair
from hpcsweep.prepare.text_documents import CorpusError, is_jsonl, jsonl_lines, line_number, pieces_of

CHECK_BYTES = 64 << 20
"""A corpus up to this size is read whole; a bigger one is sampled to this much."""
WINDOW_BYTES = 1 << 20
"""The size of one sampled window of a big corpus."""
RATE_BYTES = 256 << 10
"""How much text the tokenizer reads to give the tokens-per-byte rate of the estimate."""
FALLBACK_BYTES_PER_TOKEN = 4
"""The estimate's rate where the tokenizer folder has no ``tokenizer.json`` (English text under BPE)."""


@dataclass(frozen=True)
class LinesChecked:
    """What the check read: the samples (chat), pairs (preference) or documents (text) of the lines read, their
    text's bytes, and how much of the corpus that was."""

    samples: int
    text_bytes: int
    checked_bytes: int
    total_bytes: int
    files: int

    @property
    def sampled(self) -> bool:
        return self.checked_bytes < self.total_bytes

    def scale(self) -> float:
        return self.total_bytes / self.checked_bytes if self.checked_bytes else 1.0

    def estimated_samples(self) -> int:
        return round(self.samples * self.scale())

    def summary(self, noun: str, tokens_per_byte: float, rate: str) -> str:
        """``12 files, 3.2 MB: 10,204 chat samples, about 2.9M tokens of text (...); every line checked``."""
        count = f"{self.samples:,}" if not self.sampled else f"about {self.estimated_samples():,}"
        tokens = _millions(self.text_bytes * self.scale() * tokens_per_byte)
        read = ("every line checked" if not self.sampled else
                f"{_megabytes(self.checked_bytes)} of it checked, in windows spread over each file (the preparation "
                "job reads every line)")
        return (f"{self.files} files, {_megabytes(self.total_bytes)}: {count} {noun}, about {tokens} tokens of "
                f"text ({rate}); {read}")


def windows(files: Sequence[tuple[str, int]], budget: int = CHECK_BYTES,
            window: int = WINDOW_BYTES) -> list[tuple[str, int, int]]:
    """``(path, start, end)`` byte ranges to read, at line boundaries: every file whole when they add up to at
    most ``budget``; else, in each file, its first and last ``window``-sized piece and pieces spread evenly
    between, as many as its share of ``budget`` allows."""
    total = sum(size for _, size in files)
    if total <= budget:
        return [(path, 0, size) for path, size in files]
    chosen = []
    for path, size in files:
        pieces = pieces_of(path, size, window)
        share = max(2, round(budget * size / total / window))
        if share >= len(pieces):
            picked = pieces
        else:
            step = (len(pieces) - 1) / (share - 1)
            picked = [pieces[round(i * step)] for i in range(share)]
        chosen.extend((p.path, p.start, p.end if p.end is not None else size) for p in picked)
    return chosen


def check_lines(files: Sequence[tuple[str, int]], kind: str, budget: int = CHECK_BYTES,
                window: int = WINDOW_BYTES) -> LinesChecked:
    """Read ``files`` (``(path, size)``; sampled as ``windows`` says) as ``kind``'s corpus: ``chat``, every
    line a sample (``messages``, or ``prompt`` and ``completion``) with an assistant turn, every file ``.jsonl``;
    ``preference``, every line a pair (``prompt``, ``chosen`` and ``rejected``, as strings or messages), every
    file ``.jsonl``; ``text``, every line of its ``.jsonl`` files a JSON object with a string ``text`` (its
    ``.txt`` files are whole documents, not read here). ``CorpusError`` names the first bad file and line."""
    if kind in ("chat", "preference"):
        not_jsonl = [path for path, _ in files if not is_jsonl(path)]
        if not_jsonl:
            raise CorpusError(f"data.files matches {not_jsonl[0]}, not a .jsonl file: data.kind={kind} reads JSON "
                              "lines")
    lines = [(path, size) for path, size in files if is_jsonl(path)]
    samples = text_bytes = checked = 0
    for path, start, end in windows(lines, budget, window):
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read(end - start)
        checked += len(data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise CorpusError(f"{path} is not UTF-8 text ({err})") from None
        found, nbytes = _read_window(text, path, start, _CONTENT[kind])
        samples, text_bytes = samples + found, text_bytes + nbytes
    return LinesChecked(samples, text_bytes, checked, sum(size for _, size in lines), len(lines))


def _chat_text(record: Any, where: str) -> str:
    return "".join(m["content"] for m in sample_messages(record, where))


def _document_text(record: Any, where: str) -> str:
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise CorpusError(f"{where} has no string field 'text'")
    return record["text"]


def _pair_text(record: Any, where: str) -> str:
    # The prompt once, though the preparation will render it with each answer: the estimate counts the text.
    pair = preference_pair(record, where)
    return "".join(m["content"] for m in pair.prompt) + pair.chosen + pair.rejected


_CONTENT: dict[str, Callable[[Any, str], str]] = {"chat": _chat_text, "text": _document_text,
                                                  "preference": _pair_text}
"""Each kind's reading of one parsed line: its text, or ``CorpusError`` naming ``FILE:LINE``."""


def _read_window(text: str, path: str, start: int, content: Callable[[Any, str], str]) -> tuple[int, int]:
    """``(samples, bytes of their text)`` of one window; its lines are numbered only when one is refused (the
    number of a line deep in a big file costs reading the file up to it)."""
    found = nbytes = 0
    for offset, line in enumerate(jsonl_lines(text)):
        if not line.strip():
            continue
        try:
            nbytes += len(content(json.loads(line), "\0").encode())
        except json.JSONDecodeError as err:
            raise CorpusError(f"{_where(path, start, offset)} is not a JSON object ({err.msg})") from None
        except CorpusError as err:
            raise CorpusError(str(err).replace("\0", _where(path, start, offset), 1)) from None
        found += 1
    return found, nbytes


def _where(path: str, start: int, offset: int) -> str:
    return f"{path}:{(line_number(path, start) if start else 1) + offset}"


def tokens_per_byte(folder: str | None, sample_text: str) -> tuple[float, str]:
    """The rate of the token estimate and how it was found: the folder's ``tokenizer.json`` on ``sample_text``,
    else ``FALLBACK_BYTES_PER_TOKEN``."""
    path = os.path.join(folder, "tokenizer.json") if folder else None
    nbytes = len(sample_text.encode())
    if path and os.path.isfile(path) and nbytes:
        from tokenizers import Tokenizer

        tokens = len(Tokenizer.from_file(path).encode(sample_text, add_special_tokens=False).ids)
        return tokens / nbytes, f"{tokens / nbytes:.2f} a byte, as its tokenizer.json splits the first {_megabytes(nbytes)}"
    return 1 / FALLBACK_BYTES_PER_TOKEN, f"at {FALLBACK_BYTES_PER_TOKEN} bytes a token: no tokenizer.json to count with"


def first_text(files: Sequence[tuple[str, int]], kind: str, limit: int = RATE_BYTES) -> str:
    """The text of the first samples (or documents) of ``files``, about ``limit`` bytes of it, for the rate."""
    parts, nbytes = [], 0
    for path, _ in files:
        with open(path, "rb") as handle:
            if is_jsonl(path):
                texts = (_CONTENT[kind](json.loads(line), path) for line in handle if line.strip())
            else:
                texts = iter([handle.read(limit - nbytes).decode("utf-8", "ignore")])
            for text in texts:
                parts.append(text)
                nbytes += len(text.encode())
                if nbytes >= limit:
                    break
        if nbytes >= limit:
            break
    return "".join(parts)


_checked: dict[tuple[str, str], str] = {}


def check_corpus_lines(corpus: TextCorpus, kind: str, files_setting: Any) -> str | None:
    """Check ``corpus``'s lines once per login-node command (a sweep's trials share a corpus); ``ValueError``
    naming ``data.files`` and the bad line. Returns the summary to print the first time, else None; None also
    for a ``data=text`` corpus with no ``.jsonl`` file (nothing to read line by line)."""
    key = (corpus.key, kind)
    if key in _checked:
        return None
    files = [(f.path, f.size) for f in corpus.files]
    try:
        checked = check_lines(files, kind)
        if not checked.files:
            _checked[key] = ""
            return None
        rate, how = tokens_per_byte(corpus.tokenizer_folder, first_text([f for f in files if is_jsonl(f[0])], kind))
    except CorpusError as err:
        raise ValueError(f"data.files={files_setting!r} is not allowed: {err}") from None
    noun = {"chat": "chat samples", "preference": "preference pairs"}.get(kind, "documents in .jsonl files")
    _checked[key] = f"data.files={files_setting!r}: {checked.summary(noun, rate, how)}"
    return _checked[key]


def _megabytes(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.1f} kB"


def _millions(count: float) -> str:
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.1f}M" if count >= 1e6 else f"{count / 1e3:.0f}k" \
        if count >= 1e3 else f"{count:.0f}"
