"""Checkpoint files: naming and retention, RNG round trip, atomic writes, corrupt and unsafe files."""

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcsweep.train import worker as train
from hpcsweep.train.checkpoint import (
    CheckpointError,
    CheckpointManager,
    checkpoint_name,
    files_to_keep,
    load_checkpoint_file,
    parse_name,
    rng_state,
    set_rng_state,
)

from .trial_dirs import make_trial_dir

torch.set_num_threads(1)


def minimal_state(step: int) -> dict:
    return {"model": {"w": torch.full((3,), float(step))}, "optimizer": {}, "scheduler": {}, "step": step, "status": "running"}


class NotATensor:
    pass


def test_names_round_trip_and_retention_keeps_newest_plus_top_k():
    assert parse_name(checkpoint_name(50, 1.25)) == (50, 1.25)
    assert parse_name(checkpoint_name(7, None)) == (7, float("inf"))
    assert parse_name("notes.txt") is None
    names = [checkpoint_name(s, v) for s, v in [(10, 3.0), (20, 2.0), (30, 2.5), (40, 1.0), (50, 4.0)]]
    assert files_to_keep(names, keep_top_k=2) == {names[4], names[3], names[1]}
    assert files_to_keep(names, keep_top_k=0) == {names[4]}


def test_save_prunes_and_leaves_no_temp_files(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=1, enable=True)
    for step, val in [(1, 3.0), (2, 1.0), (3, 2.0), (4, 5.0)]:
        manager.save(minimal_state(step), step=step, val_loss=val)
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_name(2, 1.0), checkpoint_name(4, 5.0)]
    assert CheckpointManager(tmp_path, keep_top_k=1, enable=False).save(minimal_state(9), step=9, val_loss=0.0) is None


def test_rng_state_round_trips_and_loads_with_weights_only(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    path = tmp_path / "rng.pt"
    torch.save(rng_state(torch.device("cpu")), path)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(torch.load(path, weights_only=True), torch.device("cpu"))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_a_pickled_object_that_is_not_a_tensor_is_refused(tmp_path, caplog):
    manager = CheckpointManager(tmp_path, keep_top_k=2, enable=True)
    manager.save(minimal_state(1), step=1, val_loss=1.0)
    evil = tmp_path / checkpoint_name(2, 0.5)
    torch.save({**minimal_state(2), "payload": NotATensor()}, evil)
    with pytest.raises(CheckpointError, match="Unpickl|weights_only"):
        load_checkpoint_file(evil)
    with caplog.at_level(logging.WARNING):
        path, state = manager.newest_valid()
    assert (path.name, state["step"]) == (checkpoint_name(1, 1.0), 1)
    assert "skipping unusable checkpoint" in caplog.text and evil.name in caplog.text


def make_trial(path: Path, **trainer) -> Path:
    return make_trial_dir(path, {
        "data.batch_size": 4, "data.seq_len": 16, "data.synthetic_tokens": 20_000, "trainer.device": "cpu",
        "trainer.max_steps": 6, "trainer.warmup_steps": 1, "trainer.eval_every": 2, "trainer.eval_batches": 1,
        **{f"trainer.{key}": value for key, value in trainer.items()},
    })


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, monkeypatch):
    straight = make_trial(tmp_path / "straight", ckpt_every=2)
    assert train.run_trial(straight) == 0

    trial = make_trial(tmp_path / "trial", ckpt_every=2)
    monkeypatch.setenv("HPCSWEEP_TEST_STOP_AT_STEP", "4")
    assert train.run_trial(trial) == train.EXIT_REQUEUE
    newest = max((trial / "checkpoints").glob("step00000004-*.pt"))
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])

    monkeypatch.delenv("HPCSWEEP_TEST_STOP_AT_STEP")
    assert train.run_trial(trial) == 0
    log = (trial / "train.log").read_text()
    assert f"skipping unusable checkpoint: {newest}" in log
    assert "resumed from step00000002" in log
    final = json.loads((trial / "metrics.json").read_text())
    assert final["weights_sha256"] == json.loads((straight / "metrics.json").read_text())["weights_sha256"]
