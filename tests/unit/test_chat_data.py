"""``data=chat``: samples rendered by the tokenizer's own chat template into the token cache, the loss
mask on the assistant turns, the samples a trial uses, and the checks before submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcsweep.config import DataConfig, trial_config_from_dict
from hpcsweep.files.chat_samples import check_samples, select_samples
from hpcsweep.files.token_cache import MASK_NAME, OFFSETS_NAME, chat_rendering, text_corpus
from hpcsweep.files.token_file import read_token_header
from hpcsweep.sweep.prepare import validate_composed
from hpcsweep.sweep.text_preparation import preparation_request
from hpcsweep.train.data.samples import load_chat_corpus
from hpcsweep.prepare.text_documents import CorpusError
from hpcsweep.prepare.text_tokens import prepare_requested, write_entry
from tests.chat_fixtures import (
    NAMED_TEMPLATE,
    REAL_TEMPLATES,
    chat_tokenizer_folder,
    deepseek_v3_tokenizer,
    random_conversations,
    write_chat_corpus,
)

CONVERSATION = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "What does a sweep run?"},
    {"role": "assistant", "content": "Trials, each one a training run."},
    {"role": "user", "content": "And when one is preempted?"},
    {"role": "assistant", "content": "It saves, is requeued, and resumes where it stopped.\nNothing is lost."},
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """DeepSeek-V3's real tokenizer, and a small one without a template with a ChatML template file."""
    root = tmp_path_factory.mktemp("chat")
    template = root / "qwen3.jinja"
    template.write_text(NAMED_TEMPLATE)
    return deepseek_v3_tokenizer(root / "deepseek-v3"), chat_tokenizer_folder(root / "small"), template


def chat_corpus(folder: Path, tokenizer: Path, cache: Path, template: Path | None = None, train_on: str = "assistant"):
    return text_corpus(str(folder / "*.jsonl"), str(tokenizer), str(cache), "data.tokenizer",
                       chat_rendering(None if template is None else str(template), train_on))


def entry_samples(corpus) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each sample's tokens and mask, as the cache entry holds them."""
    dtype = {"uint16": np.uint16, "uint32": np.uint32}[read_token_header(corpus.token_path).dtype]
    tokens = np.fromfile(corpus.token_path, dtype=dtype)
    mask = np.fromfile(corpus.entry / MASK_NAME, dtype=np.uint8)
    offsets = np.fromfile(corpus.entry / OFFSETS_NAME, dtype=np.int64)
    assert offsets[-1] == len(tokens) == len(mask)
    return ([tokens[a:b] for a, b in zip(offsets[:-1], offsets[1:])],
            [mask[a:b] for a, b in zip(offsets[:-1], offsets[1:])])


def test_deepseek_v3_tokens_are_its_chat_template_and_the_mask_is_the_assistant_turns(tmp_path, tokenizers):
    from transformers import AutoTokenizer

    deepseek, _, _ = tokenizers
    write_chat_corpus(tmp_path / "data" / "a.jsonl", [
        {"messages": CONVERSATION},
        {"prompt": "Name the scheduler.", "completion": "Slurm"},
    ])
    corpus = chat_corpus(tmp_path / "data", deepseek, tmp_path / "cache")
    write_entry(corpus, workers=1)
    tokens, masks = entry_samples(corpus)
    tokenizer = AutoTokenizer.from_pretrained(deepseek, local_files_only=True)
    eos = "<｜end▁of▁sentence｜>"
    expected = [
        (CONVERSATION, f"Trials, each one a training run.{eos}It saves, is requeued, and resumes where it stopped.\n"
                       f"Nothing is lost.{eos}"),
        ([{"role": "user", "content": "Name the scheduler."}, {"role": "assistant", "content": "Slurm"}], f"Slurm{eos}"),
    ]
    for ids, mask, (messages, answers) in zip(tokens, masks, expected, strict=True):
        assert ids.tolist() == tokenizer.apply_chat_template(messages, tokenize=True)["input_ids"]
        assert tokenizer.decode(ids[mask == 1]) == answers
        # The mask covers whole runs: each assistant turn and its end-of-turn token, nothing of the prompt.
        assert tokenizer.decode(ids[mask == 0]).count("<｜Assistant｜>") == sum(m["role"] == "assistant" for m in messages)


def test_a_template_file_renders_a_tokenizer_without_one_and_train_on_all_masks_everything(tmp_path, tokenizers):
    from transformers import AutoTokenizer

    _, small, template = tokenizers
    write_chat_corpus(tmp_path / "data" / "a.jsonl", [{"messages": CONVERSATION[1:3]}])
    tokenizer = AutoTokenizer.from_pretrained(small, local_files_only=True)
    assistant = chat_corpus(tmp_path / "data", small, tmp_path / "cache", template)
    everything = chat_corpus(tmp_path / "data", small, tmp_path / "cache", template, train_on="all")
    assert assistant.key != everything.key != chat_corpus(tmp_path / "data", small, tmp_path / "cache").key
    for corpus in (assistant, everything):
        write_entry(corpus, workers=1)
    (ids,), (mask,) = entry_samples(assistant)
    rendered = tokenizer.apply_chat_template(CONVERSATION[1:3], chat_template=NAMED_TEMPLATE, tokenize=True)
    assert ids.tolist() == rendered["input_ids"]
    # Qwen 3 writes the last answer after an empty thinking block, which the model generates too; its end
    # of turn is "<|im_end|>", and the newline after it is the template's, not the model's.
    assert tokenizer.decode(ids[mask == 1]) == "<think>\n\n</think>\n\nTrials, each one a training run.<|im_end|>"
    (all_ids,), (all_mask,) = entry_samples(everything)
    assert all_ids.tolist() == ids.tolist() and all_mask.all()


ANSWERS = [m["content"] for m in CONVERSATION if m["role"] == "assistant"]


@pytest.mark.parametrize(("family", "masked"), [
    # Qwen 3 has the model write an empty reasoning block before the last answer, and renders earlier
    # answers without one: the first answer is found by its text, the last from the generation prompt.
    ("qwen3", [f"{ANSWERS[0]}<|im_end|>", f"<think>\n\n</think>\n\n{ANSWERS[1]}<|im_end|>"]),
    # Llama 3 trims each content and always ends with an assistant header, which is not the model's to write.
    ("llama3", [f"{ANSWERS[0]}<|eot_id|>", f"{ANSWERS[1]}<|eot_id|>"]),
])
def test_real_templates_of_other_families_mask_each_answer_and_its_end_of_turn_token(tmp_path, tokenizers, family, masked):
    from transformers import AutoTokenizer

    _, small, _ = tokenizers
    write_chat_corpus(tmp_path / "data" / "a.jsonl", [{"messages": CONVERSATION}])
    corpus = chat_corpus(tmp_path / "data", small, tmp_path / "cache", REAL_TEMPLATES[family])
    write_entry(corpus, workers=1)
    (ids,), (mask,) = entry_samples(corpus)
    tokenizer = AutoTokenizer.from_pretrained(small, local_files_only=True)
    template = REAL_TEMPLATES[family].read_text()
    assert ids.tolist() == tokenizer.apply_chat_template(CONVERSATION, chat_template=template, tokenize=True)["input_ids"]
    runs = np.split(np.arange(len(mask)), np.flatnonzero(np.diff(mask)) + 1)
    assert [tokenizer.decode(ids[run]) for run in runs if mask[run[0]]] == masked


def test_an_assistant_turn_the_template_changes_beyond_recognition_is_refused_with_its_file_and_line(tmp_path, tokenizers):
    _, small, _ = tokenizers
    shouting = tmp_path / "shouting.jinja"
    shouting.write_text(NAMED_TEMPLATE.replace("+ content.lstrip('\\n') }}", "+ content.lstrip('\\n') | upper }}"))
    path = write_chat_corpus(tmp_path / "data" / "a.jsonl", [{"prompt": "HI", "completion": "ALREADY LOUD"},
                                                             {"prompt": "hi", "completion": "quiet"}])
    with pytest.raises(CorpusError, match=rf"^{path}:2: the text of assistant turn 1 cannot be located"):
        write_entry(chat_corpus(tmp_path / "data", small, tmp_path / "cache", shouting), workers=1)
    assert not list((tmp_path / "cache").iterdir())  # nothing half-written


@pytest.mark.parametrize(("line", "error"), [
    ('{"messages": [{"role": "robot", "content": "x"}]}', "message 0 is not {'role': one of system, user, assistant"),
    ('{"messages": [{"role": "user", "content": "only a question"}]}', "the sample has no assistant turn"),
    ('{"text": "pretraining text"}', "not a sample: a JSON object with 'messages', or 'prompt' and 'completion'"),
    ("not json", "is not a JSON object"),
])
def test_a_line_that_is_not_a_sample_is_named_by_file_and_line(tmp_path, tokenizers, line, error):
    _, small, template = tokenizers
    path = tmp_path / "data" / "a.jsonl"
    path.parent.mkdir()
    path.write_text('{"prompt": "a", "completion": "b"}\n\n' + line + "\n")
    with pytest.raises(CorpusError, match=rf"^{path}:3[: ].*{error[:30]}"):
        write_entry(chat_corpus(tmp_path / "data", small, tmp_path / "cache", template), workers=1)


# The samples a trial uses


def test_max_samples_and_overlong_samples_dropped_truncated_or_refused():
    offsets = [0, 5, 30, 36, 80, 90]  # lengths 5, 25, 6, 44, 10
    drop = select_samples(offsets, DataConfig(seq_len=9))
    assert (drop.indices, drop.lengths, drop.dropped, drop.first_overlong) == ([0, 2, 4], [5, 6, 10], 2, 1)
    assert "data.overlong=drop: 2 longer than data.seq_len=9" in drop.summary(DataConfig(seq_len=9))
    cut = select_samples(offsets, DataConfig(seq_len=9, overlong="truncate"))
    assert (cut.indices, cut.lengths, cut.truncated) == ([0, 1, 2, 3, 4], [5, 10, 6, 10, 10], 2)
    first = select_samples(offsets, DataConfig(seq_len=9, max_samples=3))
    assert (first.indices, first.dropped) == ([0, 2], 1)


def test_an_overlong_sample_under_refuse_stops_the_sweep_naming_its_file_and_line(tmp_path, tokenizers):
    _, small, template = tokenizers
    samples = random_conversations(6, turns=(1,), words=(2, 4))
    samples.insert(3, {"prompt": "the cluster " * 60, "completion": "runs"})
    path = write_chat_corpus(tmp_path / "data" / "a.jsonl", samples)
    cache = tmp_path / "cache"
    data = {"kind": "chat", "files": str(tmp_path / "data" / "*.jsonl"), "tokenizer": str(small), "seq_len": 64,
            "cache_dir": str(cache), "chat_template": str(template)}
    corpus = chat_corpus(tmp_path / "data", small, cache, template)
    trial = trial_config_from_dict(composed(**data, overlong="refuse"))
    # The Slurm preparation job checks what its trials refuse, once the entry is written ...
    (request,) = json.loads(preparation_request([corpus], [trial]))
    assert request["chat"] == {"template": str(template), "train_on": "assistant",
                               "checks": [{"seq_len": 64, "overlong": "refuse", "max_samples": None}]}
    refusal = rf"^data.overlong=refuse is not allowed here: the sample at {path}:4 has \d+ tokens, more than"
    with pytest.raises(ValueError, match=refusal):
        prepare_requested(request, workers=1)
    # ... and the entry written, the login node refuses before submitting anything.
    assert corpus.is_cached()
    with pytest.raises(ValueError, match=refusal):
        validate_composed(composed(**data, overlong="refuse"))
    validate_composed(composed(**data))  # drop: the default
    selection = check_samples(corpus, DataConfig(**{k: v for k, v in data.items()}))
    assert selection.dropped == 1 and len(selection.indices) == 6


def composed(**data):
    return {"model": {"vocab_size": 384}, "data": data, "trainer": {"device": "cpu"}}


def test_data_chat_is_checked_before_submit(tmp_path, tokenizers):
    deepseek, small, template = tokenizers
    write_chat_corpus(tmp_path / "a.jsonl", random_conversations(4))
    trial = trial_config_from_dict(composed(kind="chat", files=str(tmp_path / "*.jsonl"), tokenizer="/t"))
    assert trial.data.packing is True and trial.data.train_on == "assistant" and trial.data.overlong == "drop"
    assert trial_config_from_dict(composed(kind="text", files="/c/*.txt", tokenizer="/t")).data.packing is False
    with pytest.raises(ValueError, match=r"^data.packing=True is not allowed: false unless data.kind=text, chat or preference"):
        trial_config_from_dict(composed(kind="synthetic", packing=True))
    with pytest.raises(ValueError, match=r"^data.train_on='answers' is not allowed"):
        trial_config_from_dict(composed(kind="chat", files="/c/*.jsonl", tokenizer="/t", train_on="answers"))
    with pytest.raises(ValueError, match=r"^data.tokenizer=None is not allowed: a Hugging Face tokenizer folder when data.kind=chat"):
        trial_config_from_dict(composed(kind="chat", files="/c/*.jsonl"))
    chat = {"kind": "chat", "files": str(tmp_path / "*.jsonl"), "cache_dir": str(tmp_path / "cache")}
    with pytest.raises(ValueError, match=r"^data.chat_template=null is not allowed: the tokenizer in .*small has no chat template"):
        validate_composed(composed(**chat, tokenizer=str(small)))
    with pytest.raises(ValueError, match=r"^data.chat_template='/nonexistent.jinja' is not allowed: No such file"):
        validate_composed(composed(**chat, tokenizer=str(small), chat_template="/nonexistent.jinja"))
    validate_composed(composed(**chat, tokenizer=str(small), chat_template=str(template)))
    validate_composed(composed(**chat, tokenizer=str(deepseek)))
    # A template saved with the tokenizer by transformers (chat_template.jinja beside it) is its own.
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(small, local_files_only=True)
    saved.chat_template = NAMED_TEMPLATE
    saved.save_pretrained(tmp_path / "saved")
    validate_composed(composed(**chat, tokenizer=str(tmp_path / "saved")))


def test_the_trainer_reads_whole_samples_split_into_training_and_validation(tmp_path, tokenizers):
    _, small, template = tokenizers
    write_chat_corpus(tmp_path / "data" / "a.jsonl", random_conversations(40, words=(2, 10)))
    cfg = DataConfig(kind="chat", files=str(tmp_path / "data" / "*.jsonl"), tokenizer=str(small), seq_len=160,
                     batch_size=2, cache_dir=str(tmp_path / "cache"), chat_template=str(template), val_fraction=0.1)
    corpus = chat_corpus(tmp_path / "data", small, tmp_path / "cache", template)
    write_entry(corpus, workers=1)
    chat = load_chat_corpus(cfg, 400, str(small))
    train, val = chat.train, chat.val
    assert chat.dropped == 0 and len(val.starts) == 4 and len(train.starts) == 36
    assert not set(train.starts.tolist()) & set(val.starts.tolist())
    batch = chat.batch("train", step=0, rank=0, micro_step=0, world_size=1, grad_accum=1, rows=2)
    assert batch.inputs.shape == batch.targets.shape == batch.position_ids.shape == (2, 160)
    assert batch.loss_tokens == int((batch.targets != -100).sum()) > 0
    # Rank 1 of 2 takes the rows after rank 0's: the global batch is the same for any split into ranks.
    whole = chat.batch("train", step=3, rank=0, micro_step=0, world_size=1, grad_accum=1, rows=4)
    half = chat.batch("train", step=3, rank=1, micro_step=0, world_size=2, grad_accum=1, rows=2)
    assert half.inputs.tolist() == whole.inputs[2:].tolist()
    assert 0.5 < chat.fill_rate() <= 1.0
    with pytest.raises(ValueError, match=r"^model.vocab_size=100 is not allowed: data.files=.* needs at least 389"):
        load_chat_corpus(cfg, 100, str(small))


def test_a_local_chat_sweep_prepares_its_samples_once_and_reports_the_fill_rate(tmp_path, tokenizers):
    _, small, template = tokenizers
    write_chat_corpus(tmp_path / "sft" / "a.jsonl", random_conversations(60, words=(2, 12)))
    args = ["-m", "hydra/launcher=local", "data=chat", f"data.files={tmp_path}/sft/*.jsonl", f"data.tokenizer={small}",
            f"data.chat_template={template}", "model.vocab_size=392", "model.lr=1e-3,2e-3", "trainer.max_steps=2",
            "trainer.eval_every=2", "trainer.ckpt_every=2", "trainer.eval_batches=1", "data.batch_size=2",
            "data.seq_len=64"]
    env = {**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf"}
    result = subprocess.run([sys.executable, "-m", "hpcsweep", *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert sum("tokenizing 1 files with" in line for line in output.splitlines()) == 1, output[-3000:]
    (sweep_file,) = tmp_path.glob("multirun/*/*/sweep.json")
    for trial in json.loads(sweep_file.read_text())["trials"]:
        metrics = json.loads((tmp_path / trial["trial_dir"] / "metrics.json").read_text())
        assert metrics["status"] == "completed", metrics
        assert 0.5 < metrics["fill_rate"] <= 1.0 and metrics["val_loss"] > 0
