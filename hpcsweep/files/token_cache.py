"""Where the user's text lies once tokenized: one cache entry per (tokenizer, corpus).

An entry is ``CACHE_DIR/KEY/tokens.bin`` plus its header ``tokens.json`` (``hpcsweep.files.token_file``).
A ``data=chat`` entry also holds ``mask.bin`` (uint8, 1 where the loss is taken), ``offsets.bin`` (int64,
each sample's first token, then the total) and ``sources.bin`` (int64 pairs: each sample's file index
and line), and its key also hashes the chat template file, ``data.train_on`` and
``data.chat_template_kwargs``. A ``data=preference`` entry (``hpcsweep.prepare.preference_tokens``) holds
``offsets.bin``, ``spans.bin`` and ``sources.bin`` of its sequences (each pair's prompt with its chosen answer,
then with its rejected one); its key hashes the template and its variables as chat's does, and the kind.
``KEY`` hashes the tokenizer folder's files (their names and bytes) and the corpus files' absolute
paths, sizes and modification times, so a changed tokenizer or a touched file makes a new entry, and
the order the globs list files in does not matter (documents are read in path order).

Standard library only: the login node computes the key of every trial without numpy, torch or
transformers, and the trainer finds the same entry with the same functions.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)
"""The files of a Hugging Face tokenizer folder that decide how text becomes ids."""
FORMAT_VERSION = 1
"""Bumped when the way documents become tokens changes (EOS placement, jsonl parsing)."""
TOKENS_NAME = "tokens.bin"
"""The token file inside a cache entry (its header is ``tokens.json``)."""
MASK_NAME = "mask.bin"
"""``data=chat``: one uint8 per token, 1 where the loss is taken."""
OFFSETS_NAME = "offsets.bin"
"""``data=chat``: int64, the first token of each sample, then the number of tokens."""
SOURCES_NAME = "sources.bin"
"""``data=chat``: int64 pairs, each sample's file (its index in the entry's file list) and 1-based line
(``data=preference``: each sequence's)."""
SPANS_NAME = "spans.bin"
"""``data=preference``: int64 pairs, each sequence's answer: its first token and one past its last, from the
sequence's start (the tokens before it are the prompt's)."""


class TokenCacheError(ValueError):
    """The tokenizer or the corpus of a ``data=text`` trial cannot be used; the message names the key."""


@dataclass(frozen=True)
class CorpusFile:
    """One file of a corpus, as its cache key sees it."""

    path: str
    """Absolute path."""
    size: int
    mtime_ns: int


def tokenizer_sha256(folder: str | os.PathLike[str]) -> str:
    """The SHA-256 over the names and bytes of the tokenizer files in ``folder``, its own code included.

    ``TokenCacheError`` when the folder holds none of ``TOKENIZER_FILES``.
    """
    root = Path(folder)
    present = [name for name in TOKENIZER_FILES if (root / name).is_file()]
    if not present:
        raise TokenCacheError(
            f"it holds no tokenizer files (one of {', '.join(TOKENIZER_FILES[:3])}, ...)"
        )
    # A tokenizer that ships its own code (tokenization_*.py, run with model.trust_remote_code) tokenizes
    # as that code says: an edit of it is another tokenizer, and must not reuse the old entry.
    present += sorted(path.name for path in root.glob("tokenization*.py") if path.is_file())
    digest = hashlib.sha256()
    for name in present:
        digest.update(name.encode() + b"\0")
        with open(root / name, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def has_chat_template(folder: str | os.PathLike[str]) -> bool:
    """Whether the tokenizer folder carries a chat template: in ``tokenizer_config.json``, or in the
    ``chat_template.jinja``/``chat_template.json`` that transformers saves beside it."""
    root = Path(folder)
    if (root / "chat_template.jinja").is_file() or (root / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((root / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def chat_template_texts(folder: str | os.PathLike[str]) -> list[str]:
    """The text of every chat template the tokenizer folder carries (``has_chat_template``'s places; a
    ``tokenizer_config.json`` may hold a list of named ones); empty when it carries none."""
    root = Path(folder)
    texts = []
    if (root / "chat_template.jinja").is_file():
        texts.append((root / "chat_template.jinja").read_text(encoding="utf-8"))
    for name in ("chat_template.json", "tokenizer_config.json"):
        try:
            config = json.loads((root / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        found = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(found, str):
            texts.append(found)
        elif isinstance(found, list):
            texts.extend(t["template"] for t in found if isinstance(t, dict) and isinstance(t.get("template"), str))
    return texts


def glob_patterns(files: str | Sequence[str]) -> list[str]:
    """``data.files`` as a list of globs (a single glob may be given as a string)."""
    return [files] if isinstance(files, str) else list(files)


def corpus_files(files: str | Sequence[str]) -> list[CorpusFile]:
    """The files that the globs ``files`` match, absolute and in path order, with their sizes and mtimes.

    ``TokenCacheError`` naming ``data.files`` when a glob matches no file.
    """
    found: dict[str, os.stat_result] = {}
    for pattern in glob_patterns(files):
        matches = [
            os.path.abspath(match)
            for match in glob.glob(os.path.expanduser(pattern), recursive=True)
            if os.path.isfile(match)
        ]
        if not matches:
            raise TokenCacheError(f"data.files={pattern!r} is not allowed: it matches no file")
        for match in matches:
            found[match] = os.stat(match)
    return [CorpusFile(path, found[path].st_size, found[path].st_mtime_ns) for path in sorted(found)]


@dataclass(frozen=True)
class ChatRendering:
    """How a ``data=chat`` corpus becomes tokens besides its tokenizer: the template and the loss mask."""

    template_path: str | None
    """``data.chat_template`` (absolute), or None: the tokenizer's own template."""
    template_sha256: str | None
    """The SHA-256 of ``template_path``'s bytes (the tokenizer's own is in the tokenizer's hash)."""
    train_on: str
    """``data.train_on``: ``assistant`` or ``all``."""
    template_kwargs: tuple[tuple[str, Any], ...] = field(default=())
    """``data.chat_template_kwargs``, sorted by name (a tuple, so a rendering can be a cache key of its own)."""

    def template_variables(self) -> dict[str, Any]:
        """``template_kwargs`` as the mapping the template is rendered with."""
        return dict(self.template_kwargs)


def chat_rendering(template_path: str | None, train_on: str,
                   template_kwargs: Mapping[str, Any] | None = None) -> ChatRendering:
    """``ChatRendering`` of ``data.chat_template``, ``data.train_on`` and ``data.chat_template_kwargs``;
    ``TokenCacheError`` naming ``data.chat_template`` when it is not a readable file."""
    kwargs = tuple(sorted((template_kwargs or {}).items()))
    if template_path is None:
        return ChatRendering(None, None, train_on, kwargs)
    path = os.path.abspath(os.path.expanduser(template_path))
    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as err:
        raise TokenCacheError(f"data.chat_template={template_path!r} is not allowed: {err.strerror}") from None
    return ChatRendering(path, digest, train_on, kwargs)


def cache_key(tokenizer_hash: str, files: Sequence[CorpusFile], chat: ChatRendering | None = None,
              preference: bool = False) -> str:
    """The cache entry's name for this tokenizer and corpus (order of ``files`` does not matter); ``preference``:
    the corpus's lines are preference pairs, rendered by ``chat``'s template."""
    described: dict[str, object] = {
        "format": FORMAT_VERSION,
        "tokenizer_sha256": tokenizer_hash,
        "files": sorted([f.path, f.size, f.mtime_ns] for f in files),
    }
    if chat is not None:
        described["chat"] = {"template_sha256": chat.template_sha256, "train_on": chat.train_on}
        if chat.template_kwargs:
            # Only when set: the entries rendered before the key existed keep their names.
            described["chat"]["template_kwargs"] = chat.template_variables()
    if preference:
        described["kind"] = "preference"
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class TextCorpus:
    """What one ``data=text`` trial tokenizes and where the result goes."""

    tokenizer_folder: str
    """Absolute path."""
    tokenizer_sha256: str
    files: list[CorpusFile]
    cache_dir: str
    """Absolute path."""
    chat: ChatRendering | None = None
    """``data=chat``: how samples are rendered and masked; None for ``data=text``."""
    trust_remote_code: bool = False
    """``model.trust_remote_code``: the tokenizer loads with the code its folder ships. Not in the key:
    a tokenizer that needs it does not load without it, so no entry is ever written without it."""
    preference: bool = False
    """``data=preference``: the lines are pairs (``chat`` says how they are rendered)."""

    @property
    def key(self) -> str:
        return cache_key(self.tokenizer_sha256, self.files, self.chat, self.preference)

    @property
    def entry(self) -> Path:
        """The cache entry's folder."""
        return Path(self.cache_dir) / self.key

    @property
    def token_path(self) -> Path:
        """The token file the trainer reads (``data=file`` format)."""
        return self.entry / TOKENS_NAME

    def is_cached(self) -> bool:
        """Whether the entry has been written (entries appear whole, by one rename)."""
        return self.token_path.is_file() and self.token_path.with_suffix(".json").is_file()

    def sample_offsets(self) -> list[int]:
        """``data=chat``: the first token of each sample, then the number of tokens (stdlib only, for the
        login node)."""
        offsets = array("q")
        offsets.frombytes((self.entry / OFFSETS_NAME).read_bytes())
        return offsets.tolist()

    def sample_source(self, index: int) -> str:
        """``data=chat``: ``FILE:LINE`` of sample ``index``."""
        sources = array("q")
        sources.frombytes((self.entry / SOURCES_NAME).read_bytes())
        return f"{self.files[sources[2 * index]].path}:{sources[2 * index + 1]}"


def text_corpus(
    files: str | Sequence[str], tokenizer_folder: str, cache_dir: str, tokenizer_key: str,
    chat: ChatRendering | None = None, *, trust_remote_code: bool = False, preference: bool = False,
) -> TextCorpus:
    """The corpus ``data.files`` names, tokenized by ``tokenizer_folder`` (trusting the code it ships
    when ``trust_remote_code``), cached in ``cache_dir`` (relative paths: from the current directory).
    ``TokenCacheError`` naming the key at fault (``tokenizer_key``: the config key that named the
    tokenizer folder; ``preference``: its lines are preference pairs, rendered as ``chat`` says)."""
    folder = os.path.abspath(os.path.expanduser(tokenizer_folder))
    if not os.path.isdir(folder):
        raise TokenCacheError(f"{tokenizer_key}={tokenizer_folder!r} is not allowed: not a directory")
    try:
        digest = tokenizer_sha256(folder)
    except TokenCacheError as err:
        raise TokenCacheError(f"{tokenizer_key}={tokenizer_folder!r} is not allowed: {err}") from None
    return TextCorpus(
        tokenizer_folder=folder,
        tokenizer_sha256=digest,
        files=corpus_files(files),
        cache_dir=os.path.abspath(os.path.expanduser(cache_dir)),
        chat=chat,
        trust_remote_code=trust_remote_code,
        preference=preference,
    )
