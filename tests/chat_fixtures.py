"""Chat corpora and tokenizers with chat templates, for tests and benchmarks.

``deepseek_v3_tokenizer`` and ``qwen3_tokenizer`` unpack DeepSeek-V3's and Qwen 3's real tokenizer
files, chat templates included (``tests/data/README.md`` says where they come from). ``chat_tokenizer_folder`` is a small tokenizer
trained on the test's own text (``tests.model_folders``) for models with a vocabulary of hundreds; it
has no template of its own, and ``NAMED_TEMPLATE`` (Qwen 3's real one) is what a user would name with
``data.chat_template``. No template here is hand-written.
"""

from __future__ import annotations

import json
import random
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.model_folders import WORDS, corpus_documents, train_tokenizer

DATA = Path(__file__).resolve().parent / "data"
REAL_TEMPLATES = {"qwen3": DATA / "qwen3_chat_template.jinja", "llama3": DATA / "llama3_chat_template.jinja"}
"""Chat templates of real model families, verbatim from their tokenizer_config.json (tests/data/README.md)."""
NAMED_TEMPLATE = REAL_TEMPLATES["qwen3"].read_text()
"""Qwen 3's chat template (ChatML turns), named by ``data.chat_template`` for a tokenizer without one."""


def deepseek_v3_tokenizer(folder: Path) -> Path:
    """DeepSeek-V3's ``tokenizer.json`` and ``tokenizer_config.json``, unpacked into ``folder``."""
    return _unpack_tokenizer("deepseek_v3_tokenizer.tar.xz", folder)


def qwen3_tokenizer(folder: Path) -> Path:
    """Qwen 3's ``tokenizer.json`` and ``tokenizer_config.json`` (its chat template ``REAL_TEMPLATES["qwen3"]``),
    unpacked into ``folder``."""
    return _unpack_tokenizer("qwen3_tokenizer.tar.xz", folder)


def _unpack_tokenizer(archive_name: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    # The two files by name (not extractall: its ``filter`` needs Python >= 3.11.4, Debian 12 has 3.11.2).
    with tarfile.open(DATA / archive_name) as archive:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            member = next(m for m in archive.getmembers() if m.isfile() and Path(m.name).name == name)
            (folder / name).write_bytes(archive.extractfile(member).read())
    return folder


MARKERS = ("<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
"""The turn markers of ChatML (Qwen) and Llama 3, special tokens in those families' tokenizers."""


def chat_tokenizer_folder(folder: Path, vocab_size: int = 384) -> Path:
    """A small byte-level BPE tokenizer (no chat template) with ``MARKERS`` as special tokens, so the
    real templates of ``REAL_TEMPLATES`` render with it as with their own tokenizers (vocabulary 389)."""
    tokenizer = train_tokenizer(corpus_documents(), vocab_size=vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": list(MARKERS)})
    tokenizer.save_pretrained(folder)
    return folder


def random_conversations(count: int, seed: int = 0, turns: Sequence[int] = (1, 2, 3),
                         words: Sequence[int] = (2, 30)) -> list[dict[str, Any]]:
    """``count`` samples over ``WORDS``: ``{"messages": ...}`` with a system turn now and then and 1-3
    user/assistant exchanges, and every fourth a ``{"prompt", "completion"}``."""
    rng = random.Random(seed)

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words)))

    samples: list[dict[str, Any]] = []
    for i in range(count):
        if i % 4 == 3:
            samples.append({"prompt": text(), "completion": text()})
            continue
        messages = [{"role": "system", "content": text()}] if rng.random() < 0.3 else []
        for _ in range(rng.choice(list(turns))):
            messages += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
        samples.append({"messages": messages})
    return samples


def write_chat_corpus(path: Path, samples: Sequence[dict[str, Any]]) -> Path:
    """``samples`` as JSON lines at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    return path
