"""Whole trials on a MoE folder as published (``use_cache: true``): packed chat samples train the same whatever
``use_cache`` says, and padded rows route no padding into the router statistics."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hpcsweep.config import trial_config_from_dict
from hpcsweep.files.token_cache import chat_rendering, text_corpus
from hpcsweep.train.data import corpora
from hpcsweep.train import worker as train
from hpcsweep.prepare.text_tokens import write_entry
from tests.chat_fixtures import REAL_TEMPLATES, random_conversations, write_chat_corpus
from tests.model_folders import make_model_folder

from .trial_dirs import make_trial_dir, read_metrics, trial_config

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A DeepseekV3 MoE folder at its config defaults (``use_cache: true``), a copy whose config.json says
    false, and a chat corpus of short samples tokenized for both (the same tokenizer)."""
    root = tmp_path_factory.mktemp("published")
    folder = make_model_folder(root / "moe", chat_markers=True, n_routed_experts=8)
    assert json.loads((folder / "config.json").read_text())["use_cache"] is True
    no_cache = root / "moe-no-cache"
    shutil.copytree(folder, no_cache)
    config = json.loads((no_cache / "config.json").read_text())
    (no_cache / "config.json").write_text(json.dumps({**config, "use_cache": False}))
    write_chat_corpus(root / "sft" / "a.jsonl", random_conversations(60, turns=(1,), words=(2, 6)))
    files, cache, template = str(root / "sft" / "*.jsonl"), str(root / "cache"), str(REAL_TEMPLATES["qwen3"])
    for model in (folder, no_cache):
        write_entry(text_corpus(files, str(model), cache, "data.tokenizer", chat_rendering(template, "assistant")),
                    workers=1)
    settings = {
        "model.path": str(folder), "model.lr": 3e-3, "data.kind": "chat", "data.files": files, "data.cache_dir": cache,
        "data.chat_template": template, "data.packing": True, "data.seq_len": 96, "data.batch_size": 2,
        "trainer.device": "cpu", "trainer.max_steps": 3, "trainer.warmup_steps": 1, "trainer.eval_every": 3,
        "trainer.eval_batches": 2, "trainer.log_every": 1, "trainer.ckpt_every": 0,
    }
    return folder, no_cache, settings


def test_a_packed_chat_trial_trains_the_same_whether_its_folder_says_use_cache_true_or_false(tmp_path, published):
    folder, no_cache, settings = published
    results = {}
    for name, path in (("use_cache: true", folder), ("use_cache: false", no_cache)):
        trial = make_trial_dir(tmp_path / name.replace(": ", "-"), {**settings, "model.path": str(path)})
        assert train.run_trial(trial) == 0
        results[name] = read_metrics(trial)
    true, false = results["use_cache: true"], results["use_cache: false"]
    assert true["fill_rate"] > 0.5  # rows of several samples: something to keep apart
    assert abs(true["train_loss"] - false["train_loss"]) <= 1e-6
    assert abs(true["val_loss"] - false["val_loss"]) <= 1e-6


def test_padded_rows_route_only_their_sample_tokens(tmp_path, published):
    """``data.packing=false``: one short sample a row, mostly padding; the window's routed tokens are top-k
    times the step's sample tokens, not its positions."""
    folder, _, settings = published
    padded = {**settings, "data.packing": False, "data.seq_len": 192}
    trial = make_trial_dir(tmp_path / "padded", padded)
    assert train.run_trial(trial) == 0
    router = read_metrics(trial)["router"]
    cfg = trial_config_from_dict(trial_config(padded))
    corpus = corpora.load_corpus(cfg.data, 10_000, str(folder))
    last = corpora.get_rows(corpus, cfg.data, split="train", step=cfg.trainer.max_steps - 1, rank=0, micro_step=0,
                            world_size=1, grad_accum=1)
    sample_tokens = int(last.real.sum())
    assert sample_tokens < last.real.numel() / 2  # mostly padding: the check below can fail
    for layer in router["layers"].values():
        assert layer["tokens"] == router["top_k"] * sample_tokens
