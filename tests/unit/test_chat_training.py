"""A chat trial's step is the mean over every target that takes the loss, whatever the split into ranks
and micro-batches: its micro-batches hold different numbers of answer tokens, so a mean of their
means would differ between 2 ranks x 2 rows, 1 rank x 4 rows and 1 rank x 2 micro-steps of 2 rows."""

from __future__ import annotations

import pytest
import torch

from hpcsweep.files.token_cache import chat_rendering, text_corpus
from hpcsweep.train import worker as train
from hpcsweep.prepare.text_tokens import write_entry
from tests.chat_fixtures import NAMED_TEMPLATE, chat_tokenizer_folder, random_conversations, write_chat_corpus

from .test_trainer_ddp import losses, torchrun
from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def chat_settings(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-training")
    tokenizer = chat_tokenizer_folder(root / "tokenizer")
    template = root / "qwen3.jinja"
    template.write_text(NAMED_TEMPLATE)
    write_chat_corpus(root / "sft" / "a.jsonl", random_conversations(80, words=(2, 12)))
    files, cache = str(root / "sft" / "*.jsonl"), str(root / "cache")
    write_entry(text_corpus(files, str(tokenizer), cache, "data.tokenizer",
                            chat_rendering(str(template), "assistant")), workers=1)
    return {
        "data.kind": "chat", "data.files": files, "data.tokenizer": str(tokenizer), "data.cache_dir": cache,
        "data.chat_template": str(template), "data.packing": True, "data.seq_len": 64, "data.batch_size": 2,
        "model.vocab_size": 392, "model.dropout": 0.0, "model.lr": 3e-3, "trainer.device": "cpu",
        "trainer.max_steps": 6, "trainer.warmup_steps": 1, "trainer.eval_every": 6, "trainer.eval_batches": 2,
        "trainer.log_every": 1, "trainer.ckpt_every": 0,
    }


def test_two_ranks_equal_one_rank_with_twice_the_rows_or_two_micro_steps(tmp_path, chat_settings):
    two = make_trial_dir(tmp_path / "two-ranks", chat_settings)
    assert torchrun(two) == 0, (two / "torchrun.err").read_text()[-3000:]
    curves = {"two ranks x 2 rows": losses(two)}
    for name, overrides in (("one rank x 4 rows", {"data.batch_size": 4}),
                            ("one rank x 2 micro-steps x 2 rows", {"trainer.grad_accum": 2})):
        single = make_trial_dir(tmp_path / name.replace(" ", "-"), {**chat_settings, **overrides})
        assert train.run_trial(single) == 0
        curves[name] = losses(single)
        assert abs(read_metrics(two)["val_loss"] - read_metrics(single)["val_loss"]) < 1e-5, name
    reference = curves.pop("two ranks x 2 rows")
    assert [s for s, _ in reference] == list(range(1, 7))
    for name, curve in curves.items():
        assert max(abs(a - b) for (_, a), (_, b) in zip(reference, curve, strict=True)) < 1e-5, name
    assert reference[-1][1] < reference[0][1] - 0.3  # real training, not a constant
    assert 0.5 < read_metrics(two)["fill_rate"] <= 1.0


def test_padded_chat_rows_and_packed_text_documents_train(tmp_path, chat_settings):
    """``data.packing=false`` (one sample a padded row) trains, with the fill rate padding leaves;
    ``data=text data.packing=true`` trains on its documents packed."""
    from tests.model_folders import corpus_documents, make_model_folder, write_text_corpus

    short = {**chat_settings, "trainer.max_steps": 2, "trainer.eval_every": 2, "data.seq_len": 160}
    padded = make_trial_dir(tmp_path / "padded", {**short, "data.packing": False})
    packed = make_trial_dir(tmp_path / "packed", short)
    folder = make_model_folder(tmp_path / "model", weights=False)
    corpus = write_text_corpus(tmp_path / "corpus", corpus_documents(count=24, words_per_document=10))
    files = [str(corpus / "*.txt"), str(corpus / "*.jsonl")]
    write_entry(text_corpus(files, str(folder), chat_settings["data.cache_dir"], "data.tokenizer"), workers=1)
    text = make_trial_dir(tmp_path / "text", {
        **{k: v for k, v in short.items() if k not in ("data.chat_template", "data.files", "data.tokenizer")},
        "data.kind": "text", "data.files": files, "data.tokenizer": str(folder), "data.packing": True,
        "data.val_fraction": 0.2, "data.seq_len": 48})
    for trial in (padded, packed, text):
        assert train.run_trial(trial) == 0
    fills = {trial.name: read_metrics(trial)["fill_rate"] for trial in (padded, packed, text)}
    assert fills["padded"] < fills["packed"] - 0.3 and fills["text"] > 0.8, fills
    for trial in (padded, packed, text):
        metrics = read_metrics(trial)
        assert metrics["status"] == "completed" and metrics["val_loss"] > 0, metrics
