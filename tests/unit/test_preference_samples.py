"""Preference pairs as JSON lines, in TRL's standard and conversational forms: each read into one pair, each bad
line refused naming ``FILE:LINE`` and what is wrong, on the login node before anything is queued."""

from __future__ import annotations

import json
import logging
import re

import pytest

from hpcsweep.prepare.preference_samples import PreferencePair, preference_pair
from hpcsweep.prepare.text_documents import CorpusError
from hpcsweep.sweep import jsonl_checks
from hpcsweep.sweep.jsonl_checks import check_lines
from hpcsweep.sweep.prepare import validate_composed
from tests.chat_fixtures import deepseek_v3_tokenizer

STANDARD = {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"}
CONVERSATIONAL = {
    "prompt": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2 + 2?"}],
    "chosen": [{"role": "assistant", "content": "4"}],
    "rejected": [{"role": "assistant", "content": "5"}],
}


def test_both_forms_read_into_the_same_pair():
    assert preference_pair(STANDARD, "p.jsonl:1") == PreferencePair(
        [{"role": "user", "content": "What is 2 + 2?"}], "4", "5")
    assert preference_pair(CONVERSATIONAL, "p.jsonl:1") == PreferencePair(CONVERSATIONAL["prompt"], "4", "5")
    # A multi-turn prompt keeps its turns; keys beyond the three (TRL's datasets carry scores, ids) are not read.
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "2 + 2?"}]
    pair = preference_pair({**CONVERSATIONAL, "prompt": turns, "score_chosen": 9.0}, "p.jsonl:1")
    assert pair.prompt == turns


@pytest.mark.parametrize(("record", "words"), [
    ("a string", "not a preference pair: a JSON object with 'prompt', 'chosen' and 'rejected'"),
    ({"prompt": "q", "chosen": "a"}, "not a preference pair: a JSON object with 'prompt', 'chosen' and 'rejected'"),
    ({"messages": [{"role": "user", "content": "q"}]},
     "not a preference pair: a JSON object with 'prompt', 'chosen' and 'rejected'"),
    ({**STANDARD, "rejected": 5}, "'rejected' is not a string, as 'prompt' is (or make all three lists of messages: "
                                  "the conversational form)"),
    ({**STANDARD, "chosen": CONVERSATIONAL["chosen"]}, "'chosen' is not a string, as 'prompt' is"),
    ({**STANDARD, "prompt": {"text": "q"}}, "'prompt' is neither a string nor a list of messages"),
    ({**STANDARD, "chosen": "  "}, "the 'chosen' answer is empty, so it has nothing to compare"),
    ({**CONVERSATIONAL, "prompt": []}, "'prompt' is an empty list of messages"),
    ({**CONVERSATIONAL, "prompt": [{"role": "robot", "content": "q"}]},
     "prompt message 0 is not {'role': one of system, user, assistant, 'content': a string}"),
    ({**CONVERSATIONAL, "prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": 4}]},
     "prompt message 1 is not {'role': one of system, user, assistant, 'content': a string}"),
    ({**CONVERSATIONAL, "prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
     "the prompt ends with role 'assistant', not 'user': the chosen and rejected answers reply to a user turn"),
    ({**CONVERSATIONAL, "chosen": "4"},
     "'chosen' is not a list of one message {'role': 'assistant', 'content': a string}, as the conversational form "
     "has it"),
    ({**CONVERSATIONAL, "rejected": [{"role": "user", "content": "5"}]},
     "'rejected' is not a list of one message {'role': 'assistant', 'content': a string}"),
    ({**CONVERSATIONAL, "rejected": [{"role": "assistant", "content": "5"}, {"role": "assistant", "content": "6"}]},
     "'rejected' is not a list of one message {'role': 'assistant', 'content': a string}"),
    ({**CONVERSATIONAL, "rejected": [{"role": "assistant", "content": ""}]},
     "the 'rejected' answer is empty, so it has nothing to compare"),
])
def test_a_bad_line_is_refused_naming_file_line_and_what_is_wrong(tmp_path, record, words):
    with pytest.raises(CorpusError) as refused:
        preference_pair(record, "pairs.jsonl:7")
    assert str(refused.value).startswith(f"pairs.jsonl:7: {words}")
    # The login node's check of the file gives the same words, at the line's own number.
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(STANDARD) + "\n\n" + json.dumps(CONVERSATIONAL) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(CorpusError) as checked:
        check_lines([(str(path), path.stat().st_size)], "preference")
    assert str(checked.value) == str(refused.value).replace("pairs.jsonl:7", f"{path}:4", 1)


def test_preference_files_are_json_lines_and_their_text_is_counted(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    with pytest.raises(CorpusError, match=r"a\.txt, not a \.jsonl file: data.kind=preference reads JSON lines$"):
        check_lines([(str(tmp_path / "a.txt"), 5)], "preference")
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(STANDARD) + "\n" + json.dumps(CONVERSATIONAL) + "\n")
    checked = check_lines([(str(path), path.stat().st_size)], "preference")
    # The text of the estimate: the prompt's messages, the chosen and the rejected answer.
    prompt_bytes = len("What is 2 + 2?") + len("Answer briefly.What is 2 + 2?")
    assert (checked.samples, checked.text_bytes, checked.files) == (2, prompt_bytes + 4, 1)


def composed(peft="lora", **data):
    return {"model": {"vocab_size": 384, "peft": peft}, "data": data, "trainer": {"device": "cpu"},
            "objective": {"kind": "dpo"}}


def test_the_login_node_checks_every_pair_and_takes_lora_dpo_only(tmp_path, caplog):
    folder = deepseek_v3_tokenizer(tmp_path / "deepseek-v3")
    path = tmp_path / "pairs" / "a.jsonl"
    path.parent.mkdir()
    lines = [json.dumps(STANDARD if i % 2 else CONVERSATIONAL) for i in range(20)]
    path.write_text("\n".join(lines) + "\n")
    pairs = {"kind": "preference", "files": str(tmp_path / "pairs" / "*.jsonl"), "cache_dir": str(tmp_path / "cache"),
             "tokenizer": str(folder)}
    jsonl_checks._checked.clear()
    with caplog.at_level(logging.INFO, logger="hpcsweep.sweep.prepare"):
        validate_composed(composed(**pairs))
    (summary,) = [r.getMessage() for r in caplog.records if "preference pairs" in r.getMessage()]
    assert re.fullmatch(rf"data.files='{tmp_path}/pairs/\*.jsonl': 1 files, [\d.]+ kB: 20 preference pairs, about "
                        r"\d+ tokens of text \(0\.\d\d a byte, as its tokenizer.json splits the first [\d.]+ kB\); "
                        "every line checked", summary), summary
    assert not (tmp_path / "cache").exists()  # read, not tokenized
    # Full fine-tuning compares with the pretrained folder it starts from, or a reference folder that exists.
    with pytest.raises(ValueError, match=r"^model.path=null is not allowed with objective=dpo and model.peft=none: "
                                         r"full fine-tuning DPO compares with the pretrained folder it starts from "
                                         r".*; name one \(model=pretrained model.path=DIR\), or set model.peft=lora$"):
        validate_composed(composed(peft="none", **pairs))
    with pytest.raises(ValueError, match=r"^objective.reference=/sft is not allowed: no such folder$"):
        validate_composed({**composed(**pairs), "objective": {"kind": "dpo", "reference": "/sft"}})
    lines[12] = lines[12].replace('"rejected"', '"rejeted"')
    path.write_text("\n".join(lines) + "\n")
    jsonl_checks._checked.clear()
    with pytest.raises(ValueError, match=rf"^data.files='{tmp_path}/pairs/\*.jsonl' is not allowed: {path}:13: not a "
                                         "preference pair: a JSON object with 'prompt', 'chosen' and 'rejected'$"):
        validate_composed(composed(**pairs))
