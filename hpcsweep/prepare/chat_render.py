"""One instruction sample as tokens and a loss mask, rendered by the tokenizer's own chat template.

A sample is a JSON line: ``{"messages": [{"role": ..., "content": ...}, ...]}`` (OpenAI style) or
``{"prompt": ..., "completion": ...}`` (a user turn and an assistant turn). Its tokens are exactly
``tokenizer.apply_chat_template(messages, tokenize=True)``: the template's text, tokenized without
adding special tokens, as transformers does.

Real templates carry no ``{% generation %}`` markers, so the assistant turns are found in the rendered
text. Where the model starts to generate turn ``i``: where the text of ``messages[:i]`` with the
generation prompt ends, when that text is a prefix of the whole sample's (so whatever the template has
the model write before the content, an empty ``<think></think>`` say, is the model's too); else where
the turn's content starts. Where it stops: after the content (searched for from the start, in order),
and after the end-of-turn token that follows it: the special token right after the content, past
whitespace only (DeepSeek's ``<｜end▁of▁sentence｜>``, ChatML's ``<|im_end|>``, Llama 3's ``<|eot_id|>``).
What the template adds after that (a newline, the next turn's header) is not the model's to write. A
token takes the loss when it starts inside a turn's span, or is its end-of-turn token.

Every render gives the template the same variables, ``data.chat_template_kwargs`` (its switches: Qwen 3's
``enable_thinking``), so where a turn starts is where the template, so switched, has the model start.
``chat_prompt`` is that same render of a question alone, up to where the answer starts: the text a task
must ask to ask what training taught.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from jinja2 import TemplateError

from hpcsweep.model.folder_tokenizer import load_folder_tokenizer
from hpcsweep.prepare.text_documents import CorpusError, jsonl_records

ROLES = ("system", "user", "assistant")
"""The roles a sample's messages may have."""

Span = tuple[int, int]
Render = Callable[[list[dict[str, str]], bool], str]
"""``render(messages, add_generation_prompt)``: the template's text."""


def checked_messages(messages: list[Any], where: str, what: str = "message") -> list[dict[str, str]]:
    """``messages`` as ``{'role', 'content'}`` dicts; ``CorpusError`` naming ``where`` and the first ``what`` (``message
    3``, ``prompt message 0``) that is not one with a role of ``ROLES`` and string content."""
    for number, message in enumerate(messages):
        if (not isinstance(message, dict) or message.get("role") not in ROLES
                or not isinstance(message.get("content"), str)):
            raise CorpusError(f"{where}: {what} {number} is not {{'role': one of {', '.join(ROLES)}, "
                              "'content': a string}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def sample_messages(record: Any, where: str) -> list[dict[str, str]]:
    """The messages of one parsed JSON line; ``CorpusError`` naming ``where`` (``FILE:LINE``) when it is
    neither form, or has no assistant turn (nothing would take the loss)."""
    if isinstance(record, dict) and "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise CorpusError(f"{where}: 'messages' is not a non-empty list")
        messages = checked_messages(messages, where)
    elif isinstance(record, dict) and isinstance(record.get("prompt"), str) and isinstance(record.get("completion"), str):
        messages = [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["completion"]}]
    else:
        raise CorpusError(f"{where}: not a sample: a JSON object with 'messages', or 'prompt' and 'completion' strings")
    if not any(m["role"] == "assistant" for m in messages):
        raise CorpusError(f"{where}: the sample has no assistant turn, so no token would take the loss")
    return messages


def samples_in(text: str, path: str, first_line: int = 1) -> list[tuple[int, list[dict[str, str]]]]:
    """``(line, messages)`` of every non-blank line of ``text`` (lines numbered from ``first_line``)."""
    return [(number, sample_messages(record, f"{path}:{number}"))
            for number, record in jsonl_records(text, path, first_line)]


def load_chat_tokenizer(folder: str, template_path: str | None, *, trust_remote_code: bool) -> tuple[Any, str | None]:
    """The tokenizer of ``folder`` (``load_folder_tokenizer``) and the template text to render with:
    ``template_path``'s, or None for the tokenizer's own. ``CorpusError`` naming ``data.chat_template``
    when there is none."""
    # Each worker process is one CPU's worth already: the Rust tokenizer must not add threads.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tokenizer = load_folder_tokenizer(folder, trust_remote_code=trust_remote_code)
    if template_path is not None:
        with open(template_path, encoding="utf-8") as handle:
            return tokenizer, handle.read()
    if not tokenizer.chat_template:
        raise CorpusError(f"data.chat_template=null is not allowed: the tokenizer in {folder} has no chat "
                          "template; name a Jinja file")
    return tokenizer, None


def renderer(tokenizer: Any, template: str | None, template_kwargs: Mapping[str, Any] | None = None) -> Render:
    """The template's text of a list of messages, rendered with the variables ``template_kwargs``
    (``data.chat_template_kwargs``) besides those transformers gives it."""
    variables = dict(template_kwargs or {})

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=add_generation_prompt, **variables)
    return render


def chat_prompt(tokenizer: str, question: str, *, system: str | None = None, chat_template: str | None = None,
                chat_template_kwargs: Mapping[str, Any] | None = None, trust_remote_code: bool = False) -> str:
    """The text before the answer to the user turn ``question`` (after a ``system`` turn, when given),
    rendered as a ``data=chat`` trial renders its samples: by the tokenizer folder ``tokenizer``
    (``data.tokenizer``, else ``model.path``), with ``chat_template`` (``data.chat_template``; None: the
    tokenizer's own) and ``chat_template_kwargs`` (``data.chat_template_kwargs``), up to where the
    template has the model start to write. A task's ``doc_to_text`` is this text with ``question``
    ``{{question}}``: the model is then asked exactly as it was taught, its answers' loss having started
    there (what the template has the model write after the generation prompt, as Qwen 3's empty
    ``<think></think>`` without ``enable_thinking: false``, took the loss and so is its to write)."""
    loaded, template = load_chat_tokenizer(tokenizer, chat_template, trust_remote_code=trust_remote_code)
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": question}]
    return renderer(loaded, template, chat_template_kwargs)(messages, True)


def assistant_spans(render: Render, messages: list[dict[str, str]], where: str) -> tuple[str, list[Span]]:
    """The rendered text of ``messages`` and, for each assistant turn, the characters from where the
    model starts to generate it to the end of its content; ``CorpusError`` naming ``where`` when a
    turn's content cannot be located."""
    full = render(messages, False)
    spans: list[Span] = []
    cursor = 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        generation = _generation_start(render, messages, index, full)
        # A generation start before the previous turn's end is a template that renders this turn apart.
        from_generation = generation is not None and generation >= cursor
        found = _find_content(full, message["content"], generation if from_generation else cursor)
        if found is None:
            raise CorpusError(f"{where}: the text of assistant turn {index} cannot be located in the sample as the "
                              "chat template renders it")
        content_start, content_end = found
        spans.append((generation if from_generation else content_start, content_end))
        cursor = content_end
    return full, spans


def _generation_start(render: Render, messages: list[dict[str, str]], index: int, full: str) -> int | None:
    try:
        before = render(messages[:index], True)
    except TemplateError:  # a template may refuse a conversation cut short (its raise_exception)
        return None
    return len(before) if before and full.startswith(before) else None


def _find_content(full: str, content: str, start: int) -> Span | None:
    for needle in (content, content.strip()):
        at = full.find(needle, start) if needle else -1
        if at >= 0:
            return at, at + len(needle)
    return None


def token_mask(offsets: Sequence[tuple[int, int]], text: str, spans: Sequence[Span], end_of_turn: set[int],
               ids: Sequence[int]) -> np.ndarray:
    """1 for each token whose first character lies in one of ``spans``, and for the end-of-turn token
    (one of ``end_of_turn``) right after a span, past whitespace tokens only, which then count too."""
    starts = np.fromiter((start for start, _ in offsets), dtype=np.int64, count=len(offsets))
    mask = np.zeros(len(offsets), dtype=np.uint8)
    for lo, hi in spans:
        mask[(starts >= lo) & (starts < hi)] = 1
        following = int(np.searchsorted(starts, hi))
        for at in range(following, len(ids)):
            if ids[at] in end_of_turn:
                mask[following : at + 1] = 1
                break
            if text[offsets[at][0] : offsets[at][1]].strip():
                break
    return mask


def special_ids(tokenizer: Any) -> set[int]:
    """The ids of the tokenizer's special tokens, its added ones marked special included."""
    added = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    return set(tokenizer.all_special_ids) | added


def render_sample(tokenizer: Any, render: Render, messages: list[dict[str, str]], train_on: str,
                  where: str, end_of_turn: set[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The token ids (int64) of one sample and its loss mask (uint8); ``end_of_turn``: ``special_ids``
    of the tokenizer (computed once by the caller, or here)."""
    if train_on == "all":
        ids = np.asarray(tokenizer(render(messages, False), add_special_tokens=False)["input_ids"], dtype=np.int64)
        return ids, np.ones(len(ids), dtype=np.uint8)
    text, spans = assistant_spans(render, messages, where)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(encoded["input_ids"], dtype=np.int64)
    specials = special_ids(tokenizer) if end_of_turn is None else end_of_turn
    mask = token_mask(encoded["offset_mapping"], text, spans, specials, encoded["input_ids"])
    if not mask.any():
        raise CorpusError(f"{where}: no token of its assistant turns is left once tokenized")
    return ids, mask
