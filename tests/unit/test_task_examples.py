"""The task-scores page's example (docs/user/examples/facts/): its chat corpus is the test suite's
fact samples, and its lm-eval task asks each fact exactly as the chat template the page names renders
a user turn for the example model's tokenizer, so that what the example trains is what it scores."""

from __future__ import annotations

import json
from pathlib import Path

from hpcsweep.prepare.chat_render import sample_messages
from tests.model_folders import train_tokenizer
from tests.task_fixtures import CHAT_TEMPLATE, fact_chat_samples, facts

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "user" / "examples" / "facts"


def test_the_example_chat_corpus_is_the_fact_samples_and_states_the_facts():
    lines = (EXAMPLE / "chat" / "facts.jsonl").read_text(encoding="utf-8").splitlines()
    samples = [json.loads(line) for line in lines]
    assert samples == fact_chat_samples()
    answered = {(m[0]["content"], m[1]["content"]) for m in (sample_messages(s, "example") for s in samples)}
    assert answered == {(f"the ball of {name} is", color) for name, color in facts()}


def test_the_example_task_asks_each_fact_as_the_chat_template_renders_it(monkeypatch):
    from lm_eval.tasks import TaskManager

    # The same special tokens as scripts/make-example-model's tokenizer: the template's BOS is its <|bos|>.
    tokenizer = train_tokenizer(["the ball of anna is red."], vocab_size=270)
    template = CHAT_TEMPLATE.read_text(encoding="utf-8")
    monkeypatch.chdir(REPO)  # the task's data_files path is relative to where a sweep is submitted
    task = TaskManager(include_path=str(EXAMPLE / "tasks"), include_defaults=False).load("facts")["tasks"]["facts"]
    docs = list(task.test_docs())
    assert len(docs) == len(facts())
    for doc, (name, color) in zip(docs, facts()):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": doc["question"]}], tokenize=False,
                                                 add_generation_prompt=True, chat_template=template)
        assert task.doc_to_text(doc) == rendered
        assert doc["question"] == f"the ball of {name} is" and doc["choices"][doc["label"]] == color
        assert task.config.target_delimiter == ""
