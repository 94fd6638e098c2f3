"""A worker's failure under the torchrun agent becomes the trial's failure, traceback in the log."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np


def test_failing_workers_fail_the_trial_with_their_traceback(tmp_path):
    # Valid config, but a token file whose header understates its vocabulary: no check before the
    # run reads every token, so every worker raises at its first batch (an id past the embedding).
    tokens = tmp_path / "corpus.bin"
    np.arange(5_000, dtype=np.uint16).tofile(tokens)
    tokens.with_suffix(".json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 256, "num_tokens": 5_000}))
    result = subprocess.run(
        [sys.executable, "-m", "hpcsweep", "trainer.nproc_per_node=2", "data=file", f"data.path={tokens}",
         "data.seq_len=64", "hydra.run.dir=trial"],
        cwd=tmp_path, env={**os.environ, "SLURM_CONF": "/nonexistent"},
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    trial = tmp_path / "trial"
    log = (trial / "hpcsweep.log").read_text()
    assert "failed:" in log and "exitcode" in log
    # The worker's traceback: its last frames (a long one is cut at the top) and its error.
    assert "in forward\n" in log and "IndexError: index out of range in self" in log
    metrics = json.loads((trial / "metrics.json").read_text())
    assert metrics["status"] == "failed"
    assert any("IndexError" in line for line in metrics["error"])


def test_a_corpus_too_short_for_one_sequence_is_refused_before_any_worker_starts(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hpcsweep", "trainer.nproc_per_node=2", "data.synthetic_tokens=100",
         "data.seq_len=64", "hydra.run.dir=trial"],
        cwd=tmp_path, env={**os.environ, "SLURM_CONF": "/nonexistent"},
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("data.seq_len=64 is not allowed: at most 3: the synthetic corpus")
    assert not (tmp_path / "trial").exists()
