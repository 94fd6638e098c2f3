"""Preference pairs tokenized by the preparation job into their own token cache entry: each answer after its prompt
exactly as the model's real chat template renders and its tokenizer tokenizes them, the answer's span from where
the template has the model start to write to its end-of-turn token, and a key of their own."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from hpcsweep.files.token_cache import OFFSETS_NAME, SOURCES_NAME, SPANS_NAME, chat_rendering, text_corpus
from hpcsweep.files.token_file import read_token_header
from hpcsweep.prepare.text_documents import CorpusError
from hpcsweep.prepare.text_tokens import prepare_requested, write_entry
from tests.chat_fixtures import deepseek_v3_tokenizer, qwen3_tokenizer

PAIRS = [
    {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"},
    {"prompt": [{"role": "system", "content": "Answer in words."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour."}],
     "chosen": [{"role": "assistant", "content": "Blue is a colour."}],
     "rejected": [{"role": "assistant", "content": "Seven."}]},
]


def write_pairs(path, pairs):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return path


def messages_of(pair, answer):
    prompt = pair["prompt"] if isinstance(pair["prompt"], list) else [{"role": "user", "content": pair["prompt"]}]
    text = pair[answer] if isinstance(pair[answer], str) else pair[answer][0]["content"]
    return prompt, text


@pytest.mark.parametrize(("family", "end_of_turn"), [("qwen3", "<|im_end|>"), ("deepseek_v3", "<｜end▁of▁sentence｜>")])
def test_each_answer_follows_its_prompt_as_the_template_renders_it(tmp_path, family, end_of_turn):
    folder = {"qwen3": qwen3_tokenizer, "deepseek_v3": deepseek_v3_tokenizer}[family](tmp_path / "tokenizer")
    files = str(write_pairs(tmp_path / "pairs" / "a.jsonl", PAIRS))
    corpus = text_corpus(files, str(folder), str(tmp_path / "cache"), "data.tokenizer", chat_rendering(None, "assistant"),
                         preference=True)
    header = read_token_header(write_entry(corpus, workers=1))
    assert json.loads(corpus.token_path.with_suffix(".json").read_text())["kind"] == "preference"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokens = np.fromfile(corpus.token_path, dtype=header.dtype)
    offsets = np.fromfile(corpus.entry / OFFSETS_NAME, dtype=np.int64)
    spans = np.fromfile(corpus.entry / SPANS_NAME, dtype=np.int64).reshape(-1, 2)
    sources = np.fromfile(corpus.entry / SOURCES_NAME, dtype=np.int64).reshape(-1, 2)
    assert len(offsets) == 2 * len(PAIRS) + 1 and offsets[-1] == header.num_tokens == len(tokens)
    assert sources[:, 1].tolist() == [1, 1, 2, 2]
    for sequence in range(2 * len(PAIRS)):
        pair, answer = PAIRS[sequence // 2], ("chosen", "rejected")[sequence % 2]
        prompt, text = messages_of(pair, answer)
        ids = tokens[offsets[sequence] : offsets[sequence + 1]].tolist()
        # The sequence is apply_chat_template's tokens of the prompt and this one answer.
        assert ids == tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": text}],
                                                    tokenize=True, return_dict=False)
        start, end = spans[sequence]
        # The prompt is what the template asks the model with; the answer runs to its end-of-turn token.
        assert tokenizer.decode(ids[:start]) == tokenizer.apply_chat_template(prompt, tokenize=False,
                                                                             add_generation_prompt=True)
        answer_text = tokenizer.decode(ids[start:end])
        assert answer_text.endswith(text + end_of_turn), answer_text
        assert "Hello." not in answer_text  # a conversational prompt's own assistant turn is the prompt's


def test_pairs_have_an_entry_of_their_own_and_a_bad_pair_fails_the_job(tmp_path, capsys):
    folder = qwen3_tokenizer(tmp_path / "tokenizer")
    files = str(write_pairs(tmp_path / "pairs" / "a.jsonl", PAIRS))
    as_pairs = text_corpus(files, str(folder), str(tmp_path / "cache"), "data.tokenizer",
                           chat_rendering(None, "assistant"), preference=True)
    as_chat = text_corpus(files, str(folder), str(tmp_path / "cache"), "data.tokenizer",
                          chat_rendering(None, "assistant"))
    thinking_off = text_corpus(files, str(folder), str(tmp_path / "cache"), "data.tokenizer",
                               chat_rendering(None, "assistant", {"enable_thinking": False}), preference=True)
    assert len({as_pairs.key, as_chat.key, thinking_off.key}) == 3
    # The preparation job's request, as the login node writes it for a preference corpus.
    request = {"files": [f.path for f in as_pairs.files], "tokenizer": str(folder), "cache_dir": str(tmp_path / "cache"),
               "key": as_pairs.key, "preference": True, "chat": {"template": None, "train_on": "assistant"}}
    assert prepare_requested(request, workers=1) == as_pairs.token_path
    bad = write_pairs(tmp_path / "bad" / "b.jsonl", [PAIRS[0], {"prompt": "q", "chosen": "a"}])
    corpus = text_corpus(str(bad), str(folder), str(tmp_path / "cache"), "data.tokenizer",
                         chat_rendering(None, "assistant"), preference=True)
    with pytest.raises(CorpusError, match=rf"^{bad}:2: not a preference pair"):
        write_entry(corpus, workers=1)
    assert not corpus.is_cached()
