"""A small learnable task for task-score tests: facts in a text corpus, and an lm-eval
multiple-choice task over the same facts whose data is a local file.

Each of ``NAMES`` has one of ``COLORS``; the corpus states every fact many times in shuffled
order, and the task asks for each name's colour among the four (chance: 0.25).

    corpus = write_fact_corpus(tmp_path / "corpus")
    tasks = write_fact_task(tmp_path / "tasks")        # task "facts", metric "acc"
    model = make_fact_model(tmp_path / "model")        # a tiny DeepseekV3 whose tokenizer knows the words
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.model_folders import make_model_folder, write_text_corpus

NAMES = ("anna", "bert", "carl", "dora", "emil", "fred", "gina", "hugo",
         "ida", "jan", "kai", "lena", "max", "nina", "otto", "paul")
COLORS = ("red", "blue", "green", "black")
TASK = "facts"
"""The task's name; its score is ``tasks.facts.acc``."""


def facts() -> list[tuple[str, str]]:
    """``(name, colour)`` of every fact: the colours in turn, so each answer is right as often."""
    return [(name, COLORS[i % len(COLORS)]) for i, name in enumerate(NAMES)]


def question(name: str) -> str:
    return f"the ball of {name} is"


def fact_documents(documents: int = 24, seed: int = 0) -> list[str]:
    """``documents`` texts, each every fact once in its own shuffled order."""
    rng = random.Random(seed)
    texts = []
    for _ in range(documents):
        sentences = [f"{question(name)} {color}." for name, color in facts()]
        rng.shuffle(sentences)
        texts.append(" ".join(sentences))
    return texts


def write_fact_corpus(folder: Path, documents: int = 24) -> Path:
    """The facts as ``data=text`` files (``folder/doc-NNN.txt``). Returns ``folder``."""
    return write_text_corpus(folder, fact_documents(documents), jsonl=False)


def task_yaml(name: str, data_file: Path) -> str:
    """An lm-eval multiple-choice task over ``data_file`` (JSON lines), read as a local file."""
    return (
        f"task: {name}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {data_file}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        "doc_to_target: label\n"
        "metric_list:\n"
        "  - metric: acc\n"
        "    aggregation: mean\n"
        "    higher_is_better: true\n"
    )


def write_fact_task(folder: Path, name: str = TASK) -> Path:
    """``folder/NAME.yaml`` and its data ``folder/NAME.jsonl``: one question per fact. Returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"question": question(n), "choices": list(COLORS), "label": COLORS.index(c)} for n, c in facts()]
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    (folder / f"{name}.yaml").write_text(task_yaml(name, data), encoding="utf-8")
    return folder


def make_fact_model(folder: Path, **overrides) -> Path:
    """A tiny DeepseekV3 folder whose tokenizer was trained on the facts (random weights: it knows none)."""
    return make_model_folder(folder, documents=fact_documents(4), vocab_size=320, **overrides)
