"""The synthetic corpus, the token file format, prepare-data, and the pure sampler."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcsweep.config import DataConfig
from hpcsweep.train.data import corpora
from hpcsweep.train.data.corpora import (
    Corpus,
    get_batch,
    load_corpus,
    markov_corpus,
    open_token_file,
    write_token_file,
)

REPO = Path(__file__).resolve().parents[2]


def batch(corpus, cfg, **where):
    args = {"split": "train", "step": 0, "rank": 0, "micro_step": 0, "world_size": 1, "grad_accum": 1, **where}
    return get_batch(corpus, cfg, **args)


def test_markov_corpus_is_seeded_and_sparse():
    a = markov_corpus(64, 10_000, seed=1)
    assert np.array_equal(a, markov_corpus(64, 10_000, seed=1))
    assert not np.array_equal(a, markov_corpus(64, 10_000, seed=2))
    assert len(a) == 10_000 and a.min() >= 0 and a.max() < 64
    pairs = set(zip(a[:-1].tolist(), a[1:].tolist()))
    # Chains are generated side by side and concatenated, so a few pairs cross chain boundaries.
    assert len(pairs) <= 64 * 4 + 1024


def test_targets_are_inputs_shifted_by_one():
    cfg = DataConfig(seq_len=8, batch_size=3, synthetic_tokens=5_000)
    x, y = batch(load_corpus(cfg, 32), cfg)
    assert x.shape == y.shape == (3, 8) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_sampler_is_a_pure_function_of_seed_step_rank_and_micro_step():
    cfg = DataConfig(seq_len=8, batch_size=4, synthetic_tokens=5_000)
    corpus = load_corpus(cfg, 32)
    assert torch.equal(batch(corpus, cfg, step=5)[0], batch(corpus, cfg, step=5)[0])
    assert not torch.equal(batch(corpus, cfg, step=5)[0], batch(corpus, cfg, step=6)[0])
    assert not torch.equal(batch(corpus, cfg, split="val")[0], batch(corpus, cfg)[0])


def test_the_global_batch_does_not_depend_on_how_it_is_split():
    tokens = np.arange(10_000) % 97
    corpus = Corpus(tokens, 97, val_start=9_000)
    wide = DataConfig(seq_len=8, batch_size=8)
    narrow = DataConfig(seq_len=8, batch_size=4)
    whole = batch(corpus, wide, step=3)[0]
    two_ranks = [batch(corpus, narrow, step=3, rank=r, world_size=2)[0] for r in (0, 1)]
    two_micro = [batch(corpus, narrow, step=3, micro_step=m, grad_accum=2)[0] for m in (0, 1)]
    assert torch.equal(torch.cat(two_ranks), whole) and torch.equal(torch.cat(two_micro), whole)


def test_validation_windows_stay_in_the_validation_split():
    tokens = np.arange(2_000)
    corpus = Corpus(tokens, 2_000, val_start=1_900)
    cfg = DataConfig(seq_len=8, batch_size=64)
    val = batch(corpus, cfg, split="val")[1]
    train = batch(corpus, cfg)[1]
    assert val.min() >= 1_900 and train.max() < 1_900


def test_prepare_data_writes_a_byte_level_token_file(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("hello, world ü\n" * 40)
    out = tmp_path / "data" / "corpus.bin"
    subprocess.run([sys.executable, str(REPO / "scripts" / "prepare-data"), "--out", str(out), str(text)], check=True)
    header = json.loads(out.with_suffix(".json").read_text())
    assert header == {"dtype": "uint16", "vocab_size": 256, "num_tokens": 40 * 16, "tokenizer": "bytes"}
    tokens, vocab = open_token_file(out)
    assert vocab == 256 and bytes(tokens[:16].tolist()).decode() == "hello, world ü\n"
    cfg = DataConfig(kind="file", path=str(out), seq_len=8, batch_size=2, val_fraction=0.1)
    x, _ = batch(load_corpus(cfg, 256), cfg)
    assert x.shape == (2, 8)


def test_uint32_is_used_for_large_vocabularies(tmp_path):
    path = tmp_path / "big.bin"
    write_token_file(path, np.array([0, 70_000, 5]), vocab_size=100_000, tokenizer="t")
    tokens, vocab = open_token_file(path)
    assert tokens.dtype == np.uint32 and tokens.tolist() == [0, 70_000, 5] and vocab == 100_000


def test_read_delay_holds_back_training_reads_only_and_changes_no_batch(monkeypatch):
    cfg = DataConfig(seq_len=8, batch_size=2, synthetic_tokens=5_000)
    slow = DataConfig(seq_len=8, batch_size=2, synthetic_tokens=5_000, read_delay_ms=30)
    corpus = load_corpus(cfg, 64)
    start = time.perf_counter()
    inputs, _ = batch(corpus, slow, step=3)
    assert time.perf_counter() - start >= 0.03
    assert torch.equal(inputs, batch(corpus, cfg, step=3)[0])
    waits = []
    monkeypatch.setattr(corpora, "wait_as_slow_storage", waits.append)
    batch(corpus, slow, split="val")
    batch(corpus, slow, split="train")
    assert waits == [30]


def test_read_delay_must_not_be_negative():
    with pytest.raises(ValueError, match=r"data.read_delay_ms=-1 .*an integer >= 0"):
        DataConfig(read_delay_ms=-1)
