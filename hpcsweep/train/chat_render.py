"""One instruction sample as tokens and a loss mask, rendered by the tokenizer's own chat template.

A sample is a JSON line: ``{"messages": [{"role": ..., "content": ...}, ...]}`` (OpenAI style) or
``{"prompt": ..., "completion": ...}`` (a user turn and an assistant turn). Its tokens are exactly
``tokenizer.apply_chat_template(messages, tokenize=True)``: the template's text, tokenized without
adding special tokens, as transformers does.

Real templates carry no ``{% generation %}`` markers, so the assistant turns are found in the rendered
text: for assistant turn ``i``, the text of ``messages[:i]`` with the generation prompt is a prefix of
the text of ``messages[:i + 1]``, and what the latter adds is the turn's content and its end-of-turn
markup. A template that renders earlier turns differently once later ones follow (one that drops
reasoning from past turns, say) breaks that prefix property; then the content is searched for in the
whole text, in order, and the tokenizer's EOS right after it joins the span. A token takes the loss
when it starts inside a span.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jinja2 import TemplateError

from hpcsweep.train.text_documents import CorpusError

ROLES = ("system", "user", "assistant")
"""The roles a sample's messages may have."""

Span = tuple[int, int]
Render = Callable[[list[dict[str, str]], bool], str]
"""``render(messages, add_generation_prompt)``: the template's text."""


def sample_messages(record: Any, where: str) -> list[dict[str, str]]:
    """The messages of one parsed JSON line; ``CorpusError`` naming ``where`` (``FILE:LINE``) when it is
    neither form, or has no assistant turn (nothing would take the loss)."""
    if isinstance(record, dict) and "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise CorpusError(f"{where}: 'messages' is not a non-empty list")
        for number, message in enumerate(messages):
            if (not isinstance(message, dict) or message.get("role") not in ROLES
                    or not isinstance(message.get("content"), str)):
                raise CorpusError(f"{where}: message {number} is not {{'role': one of {', '.join(ROLES)}, "
                                  "'content': a string}")
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    elif isinstance(record, dict) and isinstance(record.get("prompt"), str) and isinstance(record.get("completion"), str):
        messages = [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["completion"]}]
    else:
        raise CorpusError(f"{where}: not a sample: a JSON object with 'messages', or 'prompt' and 'completion' strings")
    if not any(m["role"] == "assistant" for m in messages):
        raise CorpusError(f"{where}: the sample has no assistant turn, so no token would take the loss")
    return messages


def samples_in(text: str, path: str, first_line: int = 1) -> list[tuple[int, list[dict[str, str]]]]:
    """``(line, messages)`` of every non-blank line of ``text`` (lines numbered from ``first_line``)."""
    samples = []
    for number, line in enumerate(text.splitlines(), start=first_line):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise CorpusError(f"{path}:{number} is not a JSON object ({err.msg})") from None
        samples.append((number, sample_messages(record, f"{path}:{number}")))
    return samples


def load_chat_tokenizer(folder: str, template_path: str | None) -> tuple[Any, str | None]:
    """The tokenizer of ``folder`` (offline) and the template text to render with: ``template_path``'s,
    or None for the tokenizer's own. ``CorpusError`` naming ``data.chat_template`` when there is none."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if template_path is not None:
        with open(template_path, encoding="utf-8") as handle:
            return tokenizer, handle.read()
    if not tokenizer.chat_template:
        raise CorpusError(f"data.chat_template=null is not allowed: the tokenizer in {folder} has no chat "
                          "template; name a Jinja file")
    return tokenizer, None


def renderer(tokenizer: Any, template: str | None) -> Render:
    """The template's text of a list of messages."""
    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    return render


def assistant_spans(render: Render, messages: list[dict[str, str]], eos: str | None, where: str) -> tuple[str, list[Span]]:
    """The rendered text of ``messages`` and the character spans of its assistant turns (content and
    end-of-turn markup); ``CorpusError`` naming ``where`` when a turn's content cannot be located."""
    full = render(messages, False)
    spans: list[Span] = []
    cursor = 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        span = _span_by_prefixes(render, messages, index, full)
        if span is None or span[0] < cursor:
            span = _span_by_search(full, message["content"], cursor, eos)
        if span is None:
            raise CorpusError(f"{where}: the text of assistant turn {index} cannot be located in the sample as the "
                              "chat template renders it")
        spans.append(span)
        cursor = span[1]
    return full, spans


def _span_by_prefixes(render: Render, messages: list[dict[str, str]], index: int, full: str) -> Span | None:
    try:
        before = render(messages[:index], True)
        through = render(messages[: index + 1], False)
    except TemplateError:  # a template may refuse a conversation cut short (its raise_exception)
        return None
    if not (through.startswith(before) and full.startswith(through)):
        return None
    if messages[index]["content"].strip() not in through[len(before):]:
        return None
    return len(before), len(through)


def _span_by_search(full: str, content: str, cursor: int, eos: str | None) -> Span | None:
    for needle in (content, content.strip()):
        start = full.find(needle, cursor) if needle else -1
        if start >= 0:
            end = start + len(needle)
            if eos and full.startswith(eos, end):
                end += len(eos)
            return start, end
    return None


def token_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[Span]) -> np.ndarray:
    """1 for each token whose first character lies in one of ``spans``, else 0 (uint8)."""
    starts = np.fromiter((start for start, _ in offsets), dtype=np.int64, count=len(offsets))
    mask = np.zeros(len(offsets), dtype=np.uint8)
    for lo, hi in spans:
        mask[(starts >= lo) & (starts < hi)] = 1
    return mask


def render_sample(tokenizer: Any, render: Render, messages: list[dict[str, str]], train_on: str,
                  where: str) -> tuple[np.ndarray, np.ndarray]:
    """The token ids (int64) of one sample and its loss mask (uint8)."""
    text, spans = assistant_spans(render, messages, tokenizer.eos_token, where)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(encoded["input_ids"], dtype=np.int64)
    if train_on == "all":
        return ids, np.ones(len(ids), dtype=np.uint8)
    mask = token_mask(encoded["offset_mapping"], spans)
    if not mask.any():
        raise CorpusError(f"{where}: no token of its assistant turns is left once tokenized")
    return ids, mask
