"""The token file's header, read without numpy or torch, and every way a token file can be wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from hpcsweep.files.token_file import TokenFileError, TokenHeader, read_token_header
from hpcsweep.train.data.corpora import open_token_file, write_token_file


def test_the_header_prepare_data_writes_is_read_back(tmp_path):
    path = tmp_path / "corpus.bin"
    write_token_file(path, np.arange(300) % 173, vocab_size=173, tokenizer="toy")
    assert read_token_header(path) == TokenHeader("uint16", 173, 300, "toy")
    tokens, vocab = open_token_file(path)
    assert vocab == 173 and tokens.tolist() == (np.arange(300) % 173).tolist()


def broken(tmp_path, header, tokens=b"\0\0" * 10):
    path = tmp_path / "corpus.bin"
    path.write_bytes(tokens)
    if header is not None:
        path.with_suffix(".json").write_text(header if isinstance(header, str) else json.dumps(header))
    return path


GOOD = {"dtype": "uint16", "vocab_size": 256, "num_tokens": 10, "tokenizer": "bytes"}


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "its header corpus.json is missing (scripts/prepare-data writes both)"),
        ("{not json", "its header corpus.json is not readable JSON"),
        ("[1, 2]", "its header corpus.json is not a JSON object"),
        ({**GOOD, "dtype": "int8"}, "its header says dtype='int8', not one of uint16, uint32"),
        ({**GOOD, "vocab_size": "256"}, "its header says vocab_size='256', not an integer >= 1"),
        ({**GOOD, "num_tokens": 0}, "its header says num_tokens=0, not an integer >= 1"),
        ({**GOOD, "num_tokens": 11}, "it holds 20 bytes, but its header says 11 uint16 tokens (22 bytes)"),
    ],
    ids=["no-header", "bad-json", "not-object", "dtype", "vocab", "count", "size"],
)
def test_a_broken_token_file_says_what_is_wrong(tmp_path, header, message):
    with pytest.raises(TokenFileError) as err:
        read_token_header(broken(tmp_path, header))
    assert str(err.value).startswith(message)


def test_a_missing_token_file_is_named_as_such(tmp_path):
    with pytest.raises(TokenFileError, match="^no such token file$"):
        read_token_header(tmp_path / "no" / "such.bin")
    with pytest.raises(TokenFileError, match="^not a file$"):
        read_token_header(tmp_path)


def test_the_trainer_names_the_path_not_the_header(tmp_path):
    with pytest.raises(ValueError, match=r"^data.path='.*/such.bin' is not allowed: no such token file$"):
        open_token_file(tmp_path / "such.bin")


def test_reading_a_header_imports_neither_numpy_nor_torch():
    code = ("import sys, hpcsweep.files.token_file; "
            "print(sorted(m for m in ('numpy', 'torch') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
