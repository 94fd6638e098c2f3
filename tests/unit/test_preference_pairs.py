"""Which preference pairs a trial uses (``data.max_samples``, ``data.overlong``): one rule, applied by the login node
on a written entry, by the preparation job before any trial starts, and by the trial, which all agree."""

from __future__ import annotations

import json
import logging

import pytest

from hpcsweep.config import DataConfig
from hpcsweep.files.preference_pairs import check_pairs, select_pairs
from hpcsweep.files.token_cache import chat_rendering, text_corpus
from hpcsweep.prepare.text_tokens import prepare_requested
from hpcsweep.sweep import jsonl_checks, text_preparation
from hpcsweep.sweep.prepare import validate_composed
from hpcsweep.train.data.pairs import load_preference_corpus
from tests.chat_fixtures import deepseek_v3_tokenizer

WHERE = [f"p.jsonl:{line}" for line in (1, 1, 2, 2, 3, 3, 4, 4)]
# Four pairs, sequences (chosen, rejected) with their answer spans, rows of seq_len 9 (10 tokens with the target).
LENGTHS = [8, 9, 12, 6, 10, 10, 11, 14]
SPANS = [(4, 8), (4, 9), (9, 12), (3, 6), (5, 10), (5, 10), (3, 11), (11, 14)]


def data(overlong, max_samples=None):
    return DataConfig(kind="preference", files="p.jsonl", seq_len=9, overlong=overlong, max_samples=max_samples)


def test_a_pair_is_as_long_as_its_longer_sequence():
    dropped = select_pairs(LENGTHS, SPANS, data("drop"), WHERE)
    assert dropped.kept == [0, 2] and dropped.left_out == 2 and dropped.truncated == 0
    assert dropped.lengths == LENGTHS and dropped.spans == SPANS
    assert dropped.summary(data("drop")) == "2 pairs used; 2 left out (longer than data.seq_len=9, data.overlong=drop)"
    # Cut to a row: pair 1 keeps a piece of each answer; pair 3's rejected answer starts past the row, so it goes.
    cut = select_pairs(LENGTHS, SPANS, data("truncate"), WHERE)
    assert cut.kept == [0, 1, 2] and cut.left_out == 1 and cut.truncated == 1
    assert cut.lengths == [8, 9, 10, 6, 10, 10, 10, 10] and cut.spans[2] == (9, 10) and cut.spans[7] == (10, 10)
    with pytest.raises(ValueError, match=r"^data.overlong=refuse is not allowed here: the pair at p.jsonl:2 has a "
                                         r"sequence of 12 tokens, more than data.seq_len=9 \+ 1 \(set "
                                         r"data.overlong=drop or truncate, or a larger data.seq_len\)$"):
        select_pairs(LENGTHS, SPANS, data("refuse"), WHERE)
    # data.max_samples takes the first pairs before the rule: an overlong third one is never read.
    first_fit = [0, 1, 4, 5, 2, 3]  # pairs 0, 2, 1
    taken = select_pairs([LENGTHS[i] for i in first_fit], [SPANS[i] for i in first_fit], data("refuse", 2), WHERE)
    assert taken.kept == [0, 1] and taken.left_out == 0 and taken.lengths == [8, 9, 10, 10]


def write_pairs(path, answers):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": "Say it.", "chosen": a, "rejected": "no"}) + "\n" for a in answers))
    return path


def test_an_overlong_pair_is_refused_by_the_preparation_job_and_then_by_the_login_node(tmp_path, caplog):
    folder = deepseek_v3_tokenizer(tmp_path / "tokenizer")
    path = write_pairs(tmp_path / "pairs" / "a.jsonl", ["yes", "yes indeed", " ".join(["long"] * 80), "yes"])
    corpus = text_corpus(str(path), str(folder), str(tmp_path / "cache"), "data.tokenizer",
                         chat_rendering(None, "assistant"), preference=True)
    refuse = {"seq_len": 32, "overlong": "refuse", "max_samples": None}
    request = {"files": [str(path)], "tokenizer": str(folder), "cache_dir": str(tmp_path / "cache"), "key": corpus.key,
               "preference": True, "chat": {"template": None, "train_on": "assistant", "checks": [refuse]}}
    # The job fails (so no trial of the sweep starts), naming the pair's line.
    with pytest.raises(ValueError, match=rf"^data.overlong=refuse is not allowed here: the pair at {path}:3 has a "
                                         r"sequence of \d+ tokens, more than data.seq_len=32 \+ 1"):
        prepare_requested(request, workers=1)
    with caplog.at_level(logging.INFO, logger="hpcsweep.prepare.text_tokens"):
        prepare_requested({**request, "chat": {**request["chat"], "checks": [{**refuse, "overlong": "drop"}]}}, 1)
    assert "data.seq_len=32: 3 pairs used; 1 left out (longer than data.seq_len=32, data.overlong=drop)" in caplog.text
    # The entry is written now: a second sweep with refuse is stopped on the login node, before anything is queued.
    composed = {"model": {"vocab_size": 129280, "peft": "lora"}, "trainer": {"device": "cpu"},
                "objective": {"kind": "dpo"},
                "data": {"kind": "preference", "files": str(path), "cache_dir": str(tmp_path / "cache"),
                         "tokenizer": str(folder), "seq_len": 32, "overlong": "refuse"}}
    jsonl_checks._checked.clear()
    text_preparation._selections.clear()
    with pytest.raises(ValueError, match=rf"^data.overlong=refuse is not allowed here: the pair at {path}:3 "):
        validate_composed(composed)
    validate_composed({**composed, "data": {**composed["data"], "overlong": "truncate"}})
    # The trial uses what the login node and the job counted.
    trial_data = DataConfig(**{**composed["data"], "overlong": "drop"})
    pairs = load_preference_corpus(trial_data, 129280, str(folder))
    assert pairs.dropped == check_pairs(corpus, trial_data).left_out == 1
    # Fewer than a training and a validation pair left: refused, naming data.files.
    with pytest.raises(ValueError, match=rf"^data.files='{path}' is not allowed: 0 pairs used; 4 left out .* at "
                                         r"data.seq_len=2, at least 2 are needed"):
        check_pairs(corpus, DataConfig(**{**composed["data"], "overlong": "drop", "seq_len": 2}))
