"""``data.chat_template_kwargs``: the chat template's own switches (Qwen 3's ``enable_thinking``) reach every
place it renders: the samples, their cache key, the preparation job, ``chat_prompt`` (a task's prompt) and
the export's model card; bad values stop the sweep on the login node."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from transformers import AutoTokenizer
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from hpcsweep.config import CHAT_TEMPLATE_OWN_NAMES, trial_config_from_dict, trial_config_to_dict
from hpcsweep.export.model_card import chat_section
from hpcsweep.export.writer import chat_facts
from hpcsweep.files.token_cache import MASK_NAME, chat_rendering, text_corpus
from hpcsweep.files.token_file import read_token_header
from hpcsweep.sweep.compose import SweepComposer
from hpcsweep.sweep.prepare import validate_composed
from hpcsweep.sweep.text_preparation import preparation_request
from hpcsweep.train.data.samples import load_chat_corpus
from hpcsweep.prepare.chat_render import chat_prompt
from hpcsweep.prepare.text_tokens import prepare_requested, write_entry
from hpcsweep.trial.identity import config_differences
from tests.chat_fixtures import qwen3_tokenizer, write_chat_corpus

from .test_compose import loader_and_master

REPO = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of Hungary?"
ANSWER = "Budapest"
NO_THINKING = {"enable_thinking": False}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """Qwen 3's real tokenizer, its own chat template included."""
    return qwen3_tokenizer(tmp_path_factory.mktemp("qwen3") / "tokenizer")


def written_sample(tmp_path, folder, template_kwargs):
    """The one sample ``QUESTION``/``ANSWER`` as the preparation writes it: its ids and loss mask."""
    write_chat_corpus(tmp_path / "sft" / "a.jsonl", [{"prompt": QUESTION, "completion": ANSWER}])
    corpus = text_corpus(str(tmp_path / "sft" / "*.jsonl"), str(folder), str(tmp_path / "cache"), "data.tokenizer",
                         chat_rendering(None, "assistant", template_kwargs))
    write_entry(corpus, workers=1)
    dtype = {"uint16": np.uint16, "uint32": np.uint32}[read_token_header(corpus.token_path).dtype]
    return np.fromfile(corpus.token_path, dtype=dtype), np.fromfile(corpus.entry / MASK_NAME, dtype=np.uint8)


def test_with_enable_thinking_false_a_tasks_prompt_is_the_training_render_up_to_the_answer(tmp_path, qwen3):
    tokenizer = AutoTokenizer.from_pretrained(qwen3, local_files_only=True)
    ids, mask = written_sample(tmp_path / "off", qwen3, NO_THINKING)
    answer_at = int(np.argmax(mask))
    prompt = chat_prompt(str(qwen3), QUESTION, chat_template_kwargs=NO_THINKING)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # The prompt is every token before the first one that takes the loss, and the loss is the answer alone.
    assert tokenizer(prompt, add_special_tokens=False)["input_ids"] == ids[:answer_at].tolist()
    assert tokenizer.decode(ids[mask == 1]) == f"{ANSWER}<|im_end|>"

    # Without the switch (the issue): training takes the loss on the empty think block the template writes
    # before the last answer, which the generation prompt does not hold; a model so trained writes it.
    ids, mask = written_sample(tmp_path / "default", qwen3, None)
    assert tokenizer.decode(ids[mask == 1]) == f"<think>\n\n</think>\n\n{ANSWER}<|im_end|>"
    default_prompt = chat_prompt(str(qwen3), QUESTION)
    assert default_prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer(default_prompt, add_special_tokens=False)["input_ids"] == ids[: int(np.argmax(mask))].tolist()


def test_the_switches_are_part_of_the_cache_key_and_reach_the_preparation_job(tmp_path, qwen3):
    write_chat_corpus(tmp_path / "sft" / "a.jsonl", [{"prompt": QUESTION, "completion": ANSWER}] * 3)

    def corpus(template_kwargs):
        return text_corpus(str(tmp_path / "sft" / "*.jsonl"), str(qwen3), str(tmp_path / "cache"), "data.tokenizer",
                           chat_rendering(None, "assistant", template_kwargs))

    keys = {name: corpus(kwargs).key for name, kwargs in
            [("none", None), ("empty", {}), ("off", NO_THINKING), ("on", {"enable_thinking": True})]}
    # {} is no switch at all: the entries written before the key existed keep their names.
    assert keys["none"] == keys["empty"] and len({keys["none"], keys["off"], keys["on"]}) == 3
    trial = trial_config_from_dict(composed(tmp_path, qwen3, chat_template_kwargs=NO_THINKING))
    (request,) = json.loads(preparation_request([corpus(NO_THINKING)], [trial]))
    assert request["key"] == keys["off"] and request["chat"]["template_kwargs"] == NO_THINKING
    token_path = prepare_requested(request, workers=1)
    header = json.loads(token_path.with_suffix(".json").read_text())
    assert header["chat_template_kwargs"] == NO_THINKING and token_path.parent.name == keys["off"]
    # The trial, on its node, finds that entry from its config alone.
    assert load_chat_corpus(trial.data, 151_700, str(qwen3)).vocab_size == len(AutoTokenizer.from_pretrained(qwen3))


def composed(tmp_path, tokenizer, **data):
    data = {"kind": "chat", "files": str(tmp_path / "sft" / "*.jsonl"), "tokenizer": str(tokenizer),
            "cache_dir": str(tmp_path / "cache"), "seq_len": 64, "val_fraction": 0.34, **data}
    return {"model": {"vocab_size": 151_700}, "data": data, "trainer": {"device": "cpu"}}


def test_bad_switches_are_refused_before_submit_naming_the_key(tmp_path, qwen3):
    write_chat_corpus(tmp_path / "sft" / "a.jsonl", [{"prompt": QUESTION, "completion": ANSWER}] * 3)

    def refused(kwargs, match, kind="chat"):
        with pytest.raises(ValueError, match=match):
            validate_composed(composed(tmp_path, qwen3, chat_template_kwargs=kwargs, kind=kind))

    refused("enable_thinking=false", r"^data.chat_template_kwargs='enable_thinking=false' is not allowed: a mapping")
    refused({"enable_thinking": [False]}, r"^data.chat_template_kwargs.enable_thinking=\[False\] is not allowed: "
                                          "true or false or an integer or a number or a string or null")
    refused({"x": float("nan")}, r"^data.chat_template_kwargs.x=nan is not allowed: a finite number")
    refused({"add_generation_prompt": True}, r"^data.chat_template_kwargs=.* is not allowed: names of template "
                                             r"variables \('add_generation_prompt' is not one")
    refused({"enable-thinking": False}, r"'enable-thinking' is not one: a name is letters, digits and _")
    refused(NO_THINKING, r"^data.chat_template_kwargs=.* is not allowed: null or \{\} unless data.kind=chat",
            kind="text")
    # A name the template never reads (a typo) would change nothing but the cache key.
    refused({"enable_thinkng": False}, r"^data.chat_template_kwargs.enable_thinkng is not allowed: the chat template "
                                       r"of .*tokenizer never reads enable_thinkng \(the variables it reads that the "
                                       r"key may set: .*enable_thinking")
    assert validate_composed(composed(tmp_path, qwen3, chat_template_kwargs=NO_THINKING)).data.chat_template_kwargs \
        == NO_THINKING
    validate_composed(composed(tmp_path, qwen3, chat_template_kwargs={}))


def test_no_switch_may_set_what_apply_chat_template_takes_itself():
    own = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters) - {"self", "kwargs"}
    assert own <= set(CHAT_TEMPLATE_OWN_NAMES)


def test_the_switches_sweep_from_the_command_line_and_are_part_of_the_trial_identity(tmp_path):
    (sweep,) = OverridesParser.create().parse_overrides(
        ["data.chat_template_kwargs={enable_thinking:false},{enable_thinking:true}"])
    lines = [f"{sweep.get_key_element()}={value}" for value in sweep.sweep_string_iterator()]
    composer = SweepComposer(*loader_and_master())
    chat = ["data=chat", f"data.files={tmp_path}/*.jsonl", "data.tokenizer=/t"]
    trials = [trial_config_from_dict(composer.compose_values([*chat, line])) for line in lines]
    assert [t.data.chat_template_kwargs for t in trials] == [{"enable_thinking": False}, {"enable_thinking": True}]
    assert trial_config_from_dict(composer.compose_values(chat)).data.chat_template_kwargs is None
    # A trial dir trained with one is not resumed with the other.
    assert [str(d) for d in config_differences(*[trial_config_to_dict(t) for t in trials])] == [
        "data.chat_template_kwargs={enable_thinking: false} (now {enable_thinking: true})"]


def test_the_model_card_says_how_to_prompt_as_trained(tmp_path, qwen3):
    data = trial_config_from_dict(composed(tmp_path, qwen3, chat_template_kwargs=NO_THINKING)).data
    facts = chat_facts(data, None, False)
    assert facts["prompt"] == chat_prompt(str(qwen3), "{{question}}", chat_template_kwargs=NO_THINKING)
    text = "\n".join(chat_section(facts))
    assert 'the template variables `{"enable_thinking": false}`' in text
    assert ("apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)"
            in text)
    assert "```text\n<|im_start|>user\n{{question}}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n\n```" in text
    # Exported where the template file the trial named is not: the card says so, the export goes on.
    elsewhere = dataclasses.replace(data, chat_template="/moved/llama3.jinja", chat_template_kwargs=None)
    plain = "\n".join(chat_section(chat_facts(elsewhere, None, False)))
    assert "the Jinja file `/moved/llama3.jinja`, its variables at their defaults" in plain
    assert "(A user turn's prompt could not be rendered where this was exported: [Errno 2] No such file" in plain


def test_the_docs_helper_prints_the_example_tasks_prompt(tmp_path):
    # task-scores.md's call on its example: the example model's tokenizer (scripts/make-example-model's special
    # tokens) and the template its sweep names give exactly the task's doc_to_text.
    import yaml

    from tests.model_folders import train_tokenizer
    from tests.task_fixtures import CHAT_TEMPLATE

    train_tokenizer(["the ball of anna is red."], vocab_size=270).save_pretrained(tmp_path / "tok")
    task = yaml.safe_load((REPO / "docs/user/examples/facts/tasks/facts.yaml").read_text(encoding="utf-8"))
    assert chat_prompt(str(tmp_path / "tok"), "{{question}}", chat_template=str(CHAT_TEMPLATE)) == task["doc_to_text"]
