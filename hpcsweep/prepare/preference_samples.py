"""One preference pair read from a JSON line: a prompt, the chosen answer and the rejected one.

A line takes one of the two forms of TRL's preference datasets. The standard form has strings,
``{"prompt": "...", "chosen": "...", "rejected": "..."}``: the prompt is one user turn. The conversational form
has messages, ``{"prompt": [{"role": "user", "content": "..."}, ...], "chosen": [{"role": "assistant",
"content": "..."}], "rejected": [...]}``: the prompt is a conversation (system, user and assistant turns, ending
with a user turn) and each answer is one assistant message. Either way the pair is read into the same
``PreferencePair``: the prompt's messages and each answer's text, which the model's chat template renders as
``data=chat`` renders a sample. A line that is neither is refused with ``CorpusError`` naming ``FILE:LINE`` and
what is wrong, in ``hpcsweep.prepare.chat_render``'s words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcsweep.prepare.chat_render import checked_messages
from hpcsweep.prepare.text_documents import CorpusError

ANSWERS = ("chosen", "rejected")
"""A pair's two answers, by their keys."""


@dataclass(frozen=True)
class PreferencePair:
    """A prompt's messages, and the text of the chosen and of the rejected answer to it."""

    prompt: list[dict[str, str]]
    chosen: str
    rejected: str


def preference_pair(record: Any, where: str) -> PreferencePair:
    """The pair of one parsed JSON line; ``CorpusError`` naming ``where`` (``FILE:LINE``) when it is neither form,
    or an answer is empty (it would have nothing to compare)."""
    if not isinstance(record, dict) or not all(key in record for key in ("prompt", *ANSWERS)):
        raise CorpusError(f"{where}: not a preference pair: a JSON object with 'prompt', 'chosen' and 'rejected'")
    prompt = record["prompt"]
    if isinstance(prompt, str):
        for key in ANSWERS:
            if not isinstance(record[key], str):
                raise CorpusError(f"{where}: '{key}' is not a string, as 'prompt' is (or make all three lists of "
                                  "messages: the conversational form)")
        messages = [{"role": "user", "content": prompt}]
        answers = [record[key] for key in ANSWERS]
    elif isinstance(prompt, list):
        messages = _prompt_messages(prompt, where)
        answers = [_assistant_answer(record[key], key, where) for key in ANSWERS]
    else:
        raise CorpusError(f"{where}: 'prompt' is neither a string nor a list of messages")
    for key, answer in zip(ANSWERS, answers):
        if not answer.strip():
            raise CorpusError(f"{where}: the '{key}' answer is empty, so it has nothing to compare")
    return PreferencePair(messages, *answers)


def _prompt_messages(prompt: list[Any], where: str) -> list[dict[str, str]]:
    if not prompt:
        raise CorpusError(f"{where}: 'prompt' is an empty list of messages")
    messages = checked_messages(prompt, where, "prompt message")
    if messages[-1]["role"] != "user":
        raise CorpusError(f"{where}: the prompt ends with role {messages[-1]['role']!r}, not 'user': the chosen and "
                          "rejected answers reply to a user turn")
    return messages


def _assistant_answer(answer: Any, key: str, where: str) -> str:
    if (not isinstance(answer, list) or len(answer) != 1 or not isinstance(answer[0], dict)
            or answer[0].get("role") != "assistant" or not isinstance(answer[0].get("content"), str)):
        raise CorpusError(f"{where}: '{key}' is not a list of one message {{'role': 'assistant', 'content': a "
                          "string}, as the conversational form has it")
    return answer[0]["content"]
