"""A small learnable task for task-score tests: facts in a text corpus or as chat samples, and an
lm-eval multiple-choice task over the same facts whose data is a local file.

Each of ``NAMES`` has one of ``COLORS``; the corpus states every fact many times in shuffled
order, and the task asks for each name's colour among the four (chance: 0.25).

    corpus = write_fact_corpus(tmp_path / "corpus")
    tasks = write_fact_task(tmp_path / "tasks")        # task "facts", metric "acc"
    model = make_fact_model(tmp_path / "model")        # a tiny DeepseekV3 whose tokenizer knows the words

The chat form (``data=chat``): the model's tokenizer carries Llama 3's real chat template, the
corpus asks each question as a user turn answered by the assistant, and the task's questions are
rendered by that same template up to where the assistant starts to write, so that what a trial
learns is what the task asks.

    model = make_fact_chat_model(tmp_path / "model")
    corpus = write_fact_chat_corpus(tmp_path / "chat")  # chat/facts-N.jsonl
    tasks = write_fact_chat_task(tmp_path / "tasks", model)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from hpcsweep.prepare.chat_render import sample_messages
from tests.chat_fixtures import MARKERS, REAL_TEMPLATES, write_chat_corpus
from tests.model_folders import TINY_DEEPSEEK, make_model_folder, train_tokenizer, write_text_corpus

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


def task_yaml(name: str, data_file: Path, target_delimiter: str = " ") -> str:
    """An lm-eval multiple-choice task over ``data_file`` (JSON lines), read as a local file; a choice
    follows the question after ``target_delimiter`` (lm-eval's default: a space)."""
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
        f"target_delimiter: {json.dumps(target_delimiter)}\n"
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


CHAT_TEMPLATE = REAL_TEMPLATES["llama3"]
"""Llama 3's template: its generation prompt ends exactly where the answer starts (Qwen 3's has the
model write an empty ``<think></think>`` first, which a one-word choice would not continue)."""


def fact_chat_samples(repeats: int = 24, seed: int = 0) -> list[dict]:
    """Every fact ``repeats`` times in shuffled order, a question and its one-word answer, in both
    forms of ``data=chat``: ``{"prompt", "completion"}`` and single-turn ``{"messages"}``."""
    rng = random.Random(seed)
    samples: list[dict] = []
    for _ in range(repeats):
        shuffled = facts()
        rng.shuffle(shuffled)
        for name, color in shuffled:
            if len(samples) % 2:
                samples.append({"messages": [{"role": "user", "content": question(name)},
                                             {"role": "assistant", "content": color}]})
            else:
                samples.append({"prompt": question(name), "completion": color})
    return samples


def write_fact_chat_corpus(folder: Path, repeats: int = 24, files: int = 2) -> Path:
    """The facts as ``data=chat`` files (``folder/facts-N.jsonl``). Returns ``folder``."""
    samples = fact_chat_samples(repeats)
    for i in range(files):
        write_chat_corpus(folder / f"facts-{i}.jsonl", samples[i::files])
    return folder


def make_fact_chat_model(folder: Path, vocab_size: int = 320, seed: int = 0, **overrides) -> Path:
    """A tiny DeepseekV3 folder whose tokenizer has ``CHAT_TEMPLATE`` as its own chat template (saved
    as ``chat_template.jinja``, where transformers 5 writes a model's), Llama 3's turn markers as
    special tokens, and a vocabulary trained on the facts as that template renders them (random
    weights: it knows none)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    first = _chat_tokenizer(fact_documents(4), vocab_size)
    rendered = [first.apply_chat_template(sample_messages(s, "facts"), tokenize=False) for s in fact_chat_samples(2)]
    # Trained again on the samples as rendered, so the template's words ("user", "assistant") are tokens too.
    tokenizer = _chat_tokenizer(fact_documents(4) + rendered, vocab_size)
    config = DeepseekV3Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                              **{**TINY_DEEPSEEK, **overrides})
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    DeepseekV3ForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def _chat_tokenizer(documents: list[str], vocab_size: int):
    tokenizer = train_tokenizer(documents, vocab_size=vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": list(MARKERS)})
    tokenizer.chat_template = CHAT_TEMPLATE.read_text(encoding="utf-8")
    return tokenizer


def chat_question(tokenizer, name: str) -> str:
    """The question about ``name`` as the tokenizer's chat template renders a user turn, up to where
    the assistant starts to write (its generation prompt)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question(name)}], tokenize=False,
                                         add_generation_prompt=True)


def write_fact_chat_task(folder: Path, model: Path, name: str = TASK) -> Path:
    """``folder/NAME.yaml`` and ``folder/NAME.jsonl``: one question per fact, rendered by the chat
    template of ``model``'s tokenizer, each choice the answer right after it (no delimiter), as an
    assistant turn starts. Returns ``folder``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"question": chat_question(tokenizer, n), "choices": list(COLORS), "label": COLORS.index(c)}
            for n, c in facts()]
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    (folder / f"{name}.yaml").write_text(task_yaml(name, data, target_delimiter=""), encoding="utf-8")
    return folder
