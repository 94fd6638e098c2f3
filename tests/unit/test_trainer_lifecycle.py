"""Early stopping, re-running a finished trial, and a failing trial's report."""

import shutil
from pathlib import Path

import numpy as np
import torch

from hpcsweep.train import worker as train
from hpcsweep.train.checkpoint.manager import parse_name
from hpcsweep.train.data.corpora import write_token_file

from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)


LIFECYCLE = {
    "data.batch_size": 4, "data.seq_len": 16, "data.synthetic_tokens": 20_000, "trainer.device": "cpu",
    "trainer.max_steps": 40, "trainer.warmup_steps": 0, "trainer.eval_every": 2, "trainer.eval_batches": 1,
    "trainer.ckpt_every": 0,
}


def make_trial(path: Path, **overrides) -> Path:
    return make_trial_dir(path, {**LIFECYCLE, **overrides})


def test_a_stalled_val_loss_stops_early_and_a_rerun_does_nothing(tmp_path):
    # lr 1e-7 barely moves the weights: after the first evaluation none improves by min_delta.
    trial = make_trial(
        tmp_path / "t", **{"model.lr": 1e-7, "trainer.early_stop_patience": 2, "trainer.early_stop_min_delta": 0.01}
    )
    assert train.run_trial(trial) == 0
    first = read_metrics(trial)
    assert (first["status"], first["step"]) == ("stopped_early", 6)
    assert first["best_val_loss"] == min(first["best_val_loss"], first["val_loss"])
    assert len(first["weights_sha256"]) == 64

    assert train.run_trial(trial) == 0
    assert "already stopped_early: nothing to do" in (trial / "train.log").read_text()
    assert read_metrics(trial) == first  # not rewritten: nothing ran
    assert [parse_name(p.name)[0] for p in (trial / "checkpoints").glob("*.pt")] == [6]


def test_a_completed_trial_is_not_trained_twice(tmp_path):
    trial = make_trial(tmp_path / "t", **{"trainer.max_steps": 3})
    assert train.run_trial(trial) == 0
    first = read_metrics(trial)
    assert (first["status"], first["step"], first["restarts"]) == ("completed", 3, 0)
    assert first["intra_op_threads"] == torch.get_num_threads()
    assert train.run_trial(trial) == 0
    assert read_metrics(trial) == first
    assert "already completed: nothing to do" in (trial / "train.log").read_text()


def test_a_completed_status_without_its_final_checkpoint_is_trained(tmp_path):
    trial = make_trial(tmp_path / "t", **{"trainer.max_steps": 3})
    assert train.run_trial(trial) == 0
    shutil.rmtree(trial / "checkpoints")
    assert train.run_trial(trial) == 0
    again = read_metrics(trial)
    assert (again["status"], again["restarts"]) == ("completed", 1)


def test_a_failing_trial_reports_failed_with_the_error(tmp_path):
    tokens = tmp_path / "big_vocab.bin"
    write_token_file(tokens, np.arange(5000) % 1000, vocab_size=1000, tokenizer="test")
    trial = make_trial(tmp_path / "t", **{"data.kind": "file", "data.path": str(tokens)})
    assert train.run_trial(trial) == train.EXIT_FAILED
    report = read_metrics(trial)
    assert report["status"] == "failed"
    assert "model.vocab_size=256 is not allowed" in "\n".join(report["error"])


def test_a_trial_stopped_before_its_first_log_window_still_says_how_fast_it_ran(tmp_path, monkeypatch):
    trial = make_trial(tmp_path / "t", **{"trainer.log_every": 50, "trainer.eval_every": 50})
    monkeypatch.setenv("HPCSWEEP_FAULT", "stop,step=3,rank=0")
    assert train.run_trial(trial) == train.EXIT_STOPPED
    stopped = read_metrics(trial)
    assert stopped["step"] == 3 and stopped["tokens_per_s"] > 0, stopped
    assert stopped["tokens_per_s_over"] == "the steps before the stop: no log window ended"
    # No evaluation at step 3: its checkpoint's name carries no loss of another step.
    assert [p.name for p in (trial / "checkpoints").glob("*.pt")] == ["step00000003.pt"]
