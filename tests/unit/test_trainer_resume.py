"""Exact resume in one process: N steps straight equals N/2, stop request, resume, N/2 more."""

from pathlib import Path

import pytest
import torch

from hpcsweep.train import worker as train
from hpcsweep.train.checkpoint.manager import parse_name

from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)

SMALL = {
    "data.batch_size": 4,
    "data.seq_len": 32,
    "data.synthetic_tokens": 50_000,
    "trainer.device": "cpu",
    "trainer.max_steps": 8,
    "trainer.warmup_steps": 2,
    "trainer.eval_every": 4,
    "trainer.eval_batches": 1,
    "trainer.log_every": 2,
    "trainer.ckpt_every": 0,
}


def make_trial(path: Path, **overrides) -> Path:
    return make_trial_dir(path, {**SMALL, **overrides})


@pytest.mark.parametrize("arch", ["deepseek_v3", "llama"])
def test_stop_and_resume_gives_the_same_weights(tmp_path, monkeypatch, arch):
    # Dropout > 0 so the result depends on the restored RNG state, not only on the weights.
    overrides = {"model.arch": arch, "model.dropout": 0.1, "trainer.grad_accum": 2}
    straight = make_trial(tmp_path / "straight", **overrides)
    assert train.run_trial(straight) == 0

    resumed = make_trial(tmp_path / "resumed", **overrides)
    monkeypatch.setenv("HPCSWEEP_FAULT", "stop,step=4,rank=0")
    assert train.run_trial(resumed) == train.EXIT_STOPPED
    stopped = read_metrics(resumed)
    assert (stopped["status"], stopped["step"], stopped["weights_sha256"]) == ("running", 4, None)
    assert [parse_name(p.name)[0] for p in (resumed / "checkpoints").glob("*.pt")] == [4]
    assert not train.STOP_REQUESTED.is_set()

    monkeypatch.delenv("HPCSWEEP_FAULT")
    assert train.run_trial(resumed) == 0
    done, reference = read_metrics(resumed), read_metrics(straight)
    assert (done["status"], done["step"], done["restarts"]) == ("completed", 8, 1)
    assert reference["restarts"] == 0
    assert done["weights_sha256"] == reference["weights_sha256"]
    assert done["val_loss"] == reference["val_loss"]
    assert "resumed from step00000004" in (resumed / "train.log").read_text()


def test_a_different_seed_gives_different_weights(tmp_path):
    # Guards the test above: equal digests must not come from a digest that ignores the weights.
    a = make_trial(tmp_path / "a", **{"trainer.max_steps": 2})
    b = make_trial(tmp_path / "b", **{"trainer.max_steps": 2, "trainer.seed": 1})
    assert train.run_trial(a) == 0 and train.run_trial(b) == 0
    assert read_metrics(a)["weights_sha256"] != read_metrics(b)["weights_sha256"]
