"""A chat corpus (and a text corpus's ``.jsonl`` files) read line by line on the login node before any job: the
preparation job's own refusal, naming the file and line, now comes before submit; the summary counts the samples
and estimates their tokens with the trial's tokenizer; a big corpus is sampled in windows."""

from __future__ import annotations

import json
import logging
import re

import pytest

from hpcsweep.prepare.chat_render import sample_messages
from hpcsweep.prepare.text_documents import CorpusError, jsonl_documents
from hpcsweep.sweep import jsonl_checks
from hpcsweep.sweep.jsonl_checks import check_lines, tokens_per_byte, windows
from hpcsweep.sweep.prepare import validate_composed
from tests.chat_fixtures import deepseek_v3_tokenizer, random_conversations, write_chat_corpus


def files_of(*paths):
    return [(str(p), p.stat().st_size) for p in paths]


@pytest.mark.parametrize(("line", "error"), [
    ('{"messages": [{"role": "robot", "content": "x"}]}', "message 0 is not {'role': one of system, user, assistant"),
    ('{"messages": [{"role": "user", "content": "only a question"}]}', "the sample has no assistant turn"),
    ('{"text": "pretraining text"}', "not a sample: a JSON object with 'messages', or 'prompt' and 'completion'"),
    ('{"prompt": "a", "completion": "b"', "is not a JSON object (Expecting ',' delimiter)"),
])
def test_a_bad_chat_line_is_refused_with_the_preparation_jobs_words(tmp_path, line, error):
    path = tmp_path / "a.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n\n' + line + "\n")
    with pytest.raises(CorpusError) as refused:
        check_lines(files_of(path), "chat")
    assert str(refused.value).startswith(f"{path}:3")
    assert error in str(refused.value)
    # The same words as the preparation job's reader gives for that line (sample_messages, json's message).
    if "JSON" not in error:
        with pytest.raises(CorpusError) as job:
            sample_messages(json.loads(line), f"{path}:3")
        assert str(job.value) == str(refused.value)


def test_a_text_corpus_checks_its_jsonl_lines_and_leaves_txt_files_whole(tmp_path):
    (tmp_path / "a.txt").write_text("not json at all {")
    (tmp_path / "b.jsonl").write_text('{"text": "one"}\n{"txt": "two"}\n')
    with pytest.raises(CorpusError, match=rf"^{tmp_path}/b.jsonl:2 has no string field 'text'$"):
        check_lines(files_of(tmp_path / "a.txt", tmp_path / "b.jsonl"), "text")
    (tmp_path / "b.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    checked = check_lines(files_of(tmp_path / "a.txt", tmp_path / "b.jsonl"), "text")
    assert (checked.samples, checked.text_bytes, checked.files, checked.sampled) == (2, 6, 1, False)


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_a_json_string_holding_a_unicode_line_separator_is_one_line_to_the_check_and_the_job(tmp_path, separator):
    # json.dumps(ensure_ascii=False) writes these as they are (control characters below 0x20 it escapes);
    # str.splitlines split the line at them.
    text = f"one{separator}two"
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"text": text}, ensure_ascii=False) + "\r\n" + json.dumps({"text": "three"}) + "\n",
                    encoding="utf-8")
    checked = check_lines(files_of(path), "text")
    assert (checked.samples, checked.text_bytes) == (2, len(text.encode()) + 5)
    assert jsonl_documents(path.read_bytes().decode("utf-8"), str(path)) == [text, "three"]


def test_a_chat_corpus_must_be_json_lines(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    with pytest.raises(CorpusError, match=r"not a \.jsonl file: data.kind=chat reads JSON lines"):
        check_lines(files_of(tmp_path / "a.txt"), "chat")


def test_a_big_corpus_is_sampled_in_windows_that_cover_both_ends_of_every_file(tmp_path):
    line = json.dumps({"prompt": "q" * 40, "completion": "a" * 40}) + "\n"
    paths = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(line * 2000)  # 2000 lines of 113 bytes: 226 kB
        paths.append(path)
    files = files_of(*paths)
    chosen = windows(files, budget=40_000, window=4_000)
    for path, size in files:
        spans = sorted((s, e) for p, s, e in chosen if p == path)
        assert spans[0][0] == 0 and spans[-1][1] == size  # first and last window of each file
        assert len(spans) == 5 and all(s % len(line) == 0 for s, _ in spans)  # at line boundaries
    checked = check_lines(files, "chat", budget=40_000, window=4_000)
    assert checked.sampled and checked.checked_bytes < 50_000
    assert abs(checked.estimated_samples() - 4000) <= 40
    # A bad line deep in a sampled window is named by its real line number.
    lines = (line * 2000).splitlines(keepends=True)
    lines[1999] = "{oops\n"
    paths[1].write_text("".join(lines))
    with pytest.raises(CorpusError, match=rf"^{paths[1]}:2000 is not a JSON object"):
        check_lines(files_of(*paths), "chat", budget=40_000, window=4_000)
    # Whole below the budget.
    assert windows(files, budget=10**6) == [(path, 0, size) for path, size in files]


def test_the_token_estimate_uses_the_trials_own_tokenizer(tmp_path):
    folder = deepseek_v3_tokenizer(tmp_path / "deepseek-v3")
    text = "The cluster runs every trial of the sweep as one task of a job array. " * 20
    rate, how = tokens_per_byte(str(folder), text)
    from tokenizers import Tokenizer

    expected = len(Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids)
    assert rate == expected / len(text.encode()) and 0.1 < rate < 0.5
    assert re.fullmatch(r"0\.\d\d a byte, as its tokenizer.json splits the first 1\.4 kB", how)
    assert tokens_per_byte(str(tmp_path), text) == (0.25, "at 4 bytes a token: no tokenizer.json to count with")


def composed(**data):
    return {"model": {"vocab_size": 384}, "data": data, "trainer": {"device": "cpu"}}


def test_the_login_node_refuses_a_bad_line_before_any_job_and_says_what_the_corpus_holds(tmp_path, caplog):
    folder = deepseek_v3_tokenizer(tmp_path / "deepseek-v3")
    samples = random_conversations(30)
    path = write_chat_corpus(tmp_path / "data" / "a.jsonl", samples)
    chat = {"kind": "chat", "files": str(tmp_path / "data" / "*.jsonl"), "cache_dir": str(tmp_path / "cache"),
            "tokenizer": str(folder)}
    jsonl_checks._checked.clear()
    with caplog.at_level(logging.INFO, logger="hpcsweep.sweep.prepare"):
        validate_composed(composed(**chat))
    (summary,) = [r.getMessage() for r in caplog.records if "chat samples" in r.getMessage()]
    assert re.fullmatch(rf"data.files='{tmp_path}/data/\*.jsonl': 1 files, [\d.]+ kB: 30 chat samples, about "
                        r"\d+k? tokens of text \(0\.\d\d a byte, as its tokenizer.json splits the first [\d.]+ kB\); "
                        "every line checked", summary), summary
    assert not (tmp_path / "cache").exists()  # read, not tokenized
    lines = path.read_text().splitlines()
    lines[5] = lines[5][:-1]  # a line cut short
    path.write_text("\n".join(lines) + "\n")
    jsonl_checks._checked.clear()
    with pytest.raises(ValueError, match=rf"^data.files='{tmp_path}/data/\*.jsonl' is not allowed: {path}:6 is not a "
                                         r"JSON object \("):
        validate_composed(composed(**chat))
