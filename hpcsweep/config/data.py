"""The ``data`` group: where training tokens come from and how they are batched, and whether a corpus fits."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from .validation import _require


CHAT_TEMPLATE_OWN_NAMES = (
    "messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "conversation",
    "conversations", "chat_template", "tokenize", "sanitize_control_tokens", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "bos_token", "eos_token",
    "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "additional_special_tokens",
)
"""Names that ``data.chat_template_kwargs`` may not set: what ``apply_chat_template`` takes itself, and the
variables that it (the messages, the generation prompt) or the tokenizer (its special tokens) gives the template."""

TEMPLATE_KINDS = ("chat", "preference")
"""The data kinds whose samples the model's chat template renders (``data.chat_template``, its kwargs)."""


@dataclass(kw_only=True)
class DataConfig:
    """Where training tokens come from and how they are batched."""

    kind: Literal["synthetic", "file", "text", "chat", "preference"] = "synthetic"
    """``synthetic``: a built-in corpus with learnable structure; ``file``: a token file at ``path``;
    ``text``: the user's text files (``files``), tokenized once into ``cache_dir``; ``chat``: the user's
    instruction samples (``.jsonl`` ``files``), rendered with the tokenizer's chat template; ``preference``:
    the user's preference pairs (``.jsonl`` ``files``: a prompt, a chosen and a rejected answer), for
    ``objective=dpo``."""
    path: str | None = None
    """The memory-mapped token file (``kind=file``), made by ``scripts/prepare-data``."""
    seq_len: int = 64
    """Tokens per training sequence."""
    batch_size: int = 16
    """Sequences per rank per micro-step."""
    val_fraction: float = 0.05
    """Fraction of the corpus held out for validation."""
    synthetic_tokens: int = 1_000_000
    """Size of the synthetic corpus, in tokens."""
    seed: int = 1234
    """Seed of the synthetic corpus and the sampler."""
    files: str | list[str] | None = None
    """``kind=text``: a glob, or a list of globs, of UTF-8 text files (``.txt``: one document each) and
    JSON lines files (``.jsonl``: one document per line, its ``text`` field)."""
    tokenizer: str | None = None
    """A Hugging Face tokenizer folder for ``kind=text`` (null: the model folder's, ``model.path``). Also
    checked against the tokenizer recorded in a ``kind=file`` token file's header."""
    cache_dir: str = "multirun/token-cache"
    """``kind=text``: where the tokenized corpus is kept, one entry per (tokenizer, corpus). The default
    lies beside Hydra's default sweep dirs (``multirun/DATE/TIME``), relative to where the sweep is
    submitted, so every sweep submitted from there shares it."""
    prepare_cpus: int = 8
    """``kind=text``/``chat``: the CPUs the Slurm preparation job asks for, whose worker processes tokenize the
    corpus side by side (one job for the sweep: the most any of its trials sets). Its own setting, not the
    trials' ``cpus_per_task``: a GPU node's 64 CPUs would keep the job queued behind whole nodes for work a
    few CPUs do. A local sweep tokenizes on every CPU of its machine."""
    read_delay_ms: int = 0
    """A test knob, not a tuning one: every training batch read waits this long first, as from slow
    storage, so that a test can make one trial of a sweep wait on data (``data.read_delay_ms=0,0,0,50``
    makes the last of four trials slow). 0: no wait."""
    chat_template: str | None = None
    """``kind=chat``: a Jinja file to render samples with, for a tokenizer whose ``tokenizer_config.json``
    has no ``chat_template`` (null: the tokenizer's own)."""
    train_on: Literal["assistant", "all"] = "assistant"
    """``kind=chat``: ``assistant`` takes the loss on the assistant turns' tokens and their end-of-turn
    token only; ``all`` on every token."""
    max_samples: int | None = None
    """``kind=chat``: use only the first this many samples of the corpus (in file and line order); null: all."""
    overlong: Literal["truncate", "drop", "refuse"] = "drop"
    """``kind=chat``: what becomes of a sample longer than a row (more than ``seq_len + 1`` tokens):
    ``drop`` leaves it out (the count is printed), ``truncate`` keeps its first ``seq_len + 1`` tokens,
    ``refuse`` stops the sweep before any trial starts, naming its file and line."""
    chat_template_kwargs: dict[str, bool | int | float | str | None] | None = None
    """``kind=chat``: variables the chat template reads, its switches (``{enable_thinking: false}`` for
    Qwen 3), given to it wherever it renders: the samples, their cache key, ``chat_prompt`` (a task's
    prompt), the export's model card. Values are true/false, numbers, strings or null; a name must be
    one the template reads (checked before any job), not one transformers or hpcsweep sets
    (``CHAT_TEMPLATE_OWN_NAMES``). null (not {}: Hydra could then only merge into it, never set it whole) or
    {}: the template's own defaults."""
    packing: bool | None = None
    """Pack whole samples (``kind=chat``) or documents (``kind=text``, a long one cut into row-sized
    pieces) into ``seq_len`` rows, each apart: its position ids restart and it attends to no other.
    ``false``: ``kind=chat`` has one sample a row, padded (padding takes no loss); ``kind=text`` reads
    windows across documents; ``kind=preference`` packs each micro-batch's sequences (prompt and answer) or pads
    one a row. null: true for ``kind=chat`` and ``kind=preference``, false otherwise."""

    def __post_init__(self) -> None:
        if self.packing is None:
            self.packing = self.kind in ("chat", "preference")
        _require(not self.packing or self.kind in ("text", "chat", "preference"), "data.packing", self.packing,
                 "false unless data.kind=text, chat or preference (packing needs sample boundaries)")
        _require(self.max_samples is None or self.max_samples >= 2, "data.max_samples", self.max_samples,
                 "null or an integer >= 2 (a training and a validation sample)")
        _require(not self.chat_template_kwargs or self.kind in TEMPLATE_KINDS, "data.chat_template_kwargs",
                 self.chat_template_kwargs, "null or {} unless data.kind=chat or preference (only chat samples and "
                 "preference pairs are rendered by a template)")
        for name, value in (self.chat_template_kwargs or {}).items():
            _require(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None and name not in CHAT_TEMPLATE_OWN_NAMES,
                     "data.chat_template_kwargs", self.chat_template_kwargs,
                     f"names of template variables ({name!r} is not one: a name is letters, digits and _, and not "
                     "one that transformers or hpcsweep gives the template: " + ", ".join(CHAT_TEMPLATE_OWN_NAMES) + ")")
            _require(not isinstance(value, float) or math.isfinite(value), f"data.chat_template_kwargs.{name}", value,
                     "a finite number (the value is part of the JSON cache key and the model card)")
        if self.kind == "file":
            _require(bool(self.path), "data.path", self.path, "a token file path when data.kind=file")
        if self.kind in ("text", "chat", "preference"):
            patterns = [self.files] if isinstance(self.files, str) else list(self.files or [])
            _require(
                bool(patterns) and all(patterns), "data.files", self.files,
                f"a glob or a list of globs of .jsonl files when data.kind={self.kind}" if self.kind != "text"
                else "a glob or a list of globs of .txt/.jsonl files when data.kind=text",
            )
            _require(bool(self.cache_dir), "data.cache_dir", self.cache_dir, f"a directory when data.kind={self.kind}")
        _require(self.seq_len >= 2, "data.seq_len", self.seq_len, "an integer >= 2")
        _require(self.batch_size >= 1, "data.batch_size", self.batch_size, "an integer >= 1")
        _require(self.prepare_cpus >= 1, "data.prepare_cpus", self.prepare_cpus, "an integer >= 1 (CPUs)")
        _require(self.read_delay_ms >= 0, "data.read_delay_ms", self.read_delay_ms, "an integer >= 0 (milliseconds)")
        _require(
            0.0 < self.val_fraction < 0.5,
            "data.val_fraction",
            self.val_fraction,
            "0 < val_fraction < 0.5",
        )


def check_corpus_fits(
    data: DataConfig,
    model_vocab_size: int,
    *,
    num_tokens: int,
    corpus_vocab_size: int,
    source: str,
    vocab_key: str = "model.vocab_size",
) -> None:
    """Raise ``ValueError`` when a corpus of ``num_tokens`` ids below ``corpus_vocab_size`` cannot
    train a model of ``model_vocab_size`` on sequences of ``data.seq_len`` (``source`` names it;
    ``vocab_key`` names where the model's vocabulary comes from)."""
    _require(
        corpus_vocab_size <= model_vocab_size,
        vocab_key,
        model_vocab_size,
        f"{source} needs at least {corpus_vocab_size} (its vocabulary)",
    )
    val_start = int(num_tokens * (1 - data.val_fraction))
    # A window is seq_len inputs plus one target; val_fraction < 0.5 makes validation the smaller split.
    shortest_split = min(val_start, num_tokens - val_start)
    _require(
        data.seq_len + 1 < shortest_split,
        "data.seq_len",
        data.seq_len,
        f"at most {shortest_split - 2}: {source} holds {num_tokens} tokens, its validation split "
        f"(data.val_fraction={data.val_fraction}) {shortest_split}",
    )
