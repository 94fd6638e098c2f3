"""The default model learns the synthetic corpus, and the learning rate visibly matters."""

import json
from pathlib import Path

import numpy as np
import torch
import yaml

from hpcsweep.config import trial_config_from_dict, trial_config_to_dict
from hpcsweep.train import worker as train
from hpcsweep.train.data.corpora import markov_corpus

torch.set_num_threads(1)

STEPS = 40
THRESHOLD = 2.5
"""Val loss (nats/token) deepseek_tiny must reach in STEPS steps at the default lr (it gets ~1.9)."""


def run(path: Path, lr: float) -> dict:
    cfg = trial_config_to_dict(trial_config_from_dict({}))
    cfg["model"]["lr"] = lr
    cfg["data"].update(batch_size=8, seq_len=32, synthetic_tokens=100_000)
    cfg["trainer"].update(
        device="cpu", max_steps=STEPS, warmup_steps=5, eval_every=STEPS, eval_batches=2, log_every=10, ckpt_every=0
    )
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert train.run_trial(path) == 0
    return json.loads((path / "metrics.json").read_text())


def unigram_entropy(tokens: np.ndarray) -> float:
    p = np.bincount(tokens) / len(tokens)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def test_val_loss_falls_far_below_the_unigram_entropy(tmp_path):
    unigram = unigram_entropy(markov_corpus(256, 100_000, seed=1234))
    assert unigram > 5.0
    good = run(tmp_path / "good", lr=3e-3)
    assert good["val_loss"] < THRESHOLD < unigram
    assert good["tokens_per_s"] > 0 and good["mfu"] is None  # no honest peak to divide by on CPU

    bad = run(tmp_path / "bad", lr=1.0)
    assert bad["val_loss"] > good["val_loss"] + 2.0
