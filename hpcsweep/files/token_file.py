"""The header of a token file (``scripts/prepare-data``): ``data.bin`` holds raw token ids, ``data.json``
beside it says their dtype, the vocabulary and how many there are, the tokenizer's name and, for a
Hugging Face tokenizer folder, the SHA-256 of its files (``hpcsweep.files.token_cache.tokenizer_sha256``).

Pure reading, no numpy and no torch: the login node checks a sweep's data with it before anything
is submitted, and the trainer opens the tokens with what it returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TOKEN_BYTES = {"uint16": 2, "uint32": 4}
"""The dtypes a token file may hold, and the bytes of one token in each."""


class TokenFileError(ValueError):
    """A token file that cannot be read; the message says why, without naming the file."""


@dataclass(frozen=True)
class TokenHeader:
    """What a token file's header says, checked against the file itself."""

    dtype: str
    vocab_size: int
    num_tokens: int
    tokenizer: str | None
    tokenizer_sha256: str | None = None
    """The hash of the tokenizer folder the tokens were made with; None for files made without one."""


def header_path(token_path: Path) -> Path:
    """The JSON sidecar of a token file: ``data.bin`` -> ``data.json``."""
    return token_path.with_suffix(".json")


def header_text(
    dtype: str, vocab_size: int, num_tokens: int, tokenizer: str, tokenizer_sha256: str | None = None
) -> str:
    """The header of a token file, as ``scripts/prepare-data`` writes it."""
    header = {"dtype": dtype, "vocab_size": vocab_size, "num_tokens": num_tokens, "tokenizer": tokenizer}
    if tokenizer_sha256 is not None:
        header["tokenizer_sha256"] = tokenizer_sha256
    return json.dumps(header, indent=2) + "\n"


def read_token_header(token_path: Path) -> TokenHeader:
    """The header of the token file ``token_path``; ``TokenFileError`` when the file, its header, or
    the two together do not make a token file."""
    header_file = header_path(token_path)
    if not token_path.is_file():
        raise TokenFileError("no such token file" if not token_path.exists() else "not a file")
    try:
        header = json.loads(header_file.read_text())
    except FileNotFoundError:
        raise TokenFileError(f"its header {header_file.name} is missing (scripts/prepare-data writes both)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TokenFileError(f"its header {header_file.name} is not readable JSON ({err})") from None
    if not isinstance(header, dict):
        raise TokenFileError(f"its header {header_file.name} is not a JSON object")
    dtype, vocab_size, num_tokens = header.get("dtype"), header.get("vocab_size"), header.get("num_tokens")
    if dtype not in TOKEN_BYTES:
        raise TokenFileError(f"its header says dtype={dtype!r}, not one of {', '.join(sorted(TOKEN_BYTES))}")
    for name, value in (("vocab_size", vocab_size), ("num_tokens", num_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TokenFileError(f"its header says {name}={value!r}, not an integer >= 1")
    size = token_path.stat().st_size
    if size != num_tokens * TOKEN_BYTES[dtype]:
        raise TokenFileError(
            f"it holds {size} bytes, but its header says {num_tokens} {dtype} tokens ({num_tokens * TOKEN_BYTES[dtype]} bytes)"
        )
    tokenizer, digest = header.get("tokenizer"), header.get("tokenizer_sha256")
    return TokenHeader(
        dtype, vocab_size, num_tokens,
        tokenizer if isinstance(tokenizer, str) else None,
        digest if isinstance(digest, str) else None,
    )
