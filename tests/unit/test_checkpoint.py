"""Checkpoints: names and retention, RNG round trip, stale temp files, safe loading, old-format trial dirs."""

import json
import logging
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcsweep.files.attempt_file import WorkerAttempt, write_attempt
from hpcsweep.train import worker as train
from hpcsweep.train.checkpoint.manager import (
    RESUME_DIR,
    TRAINER_FILE,
    WEIGHTS_DIR,
    CheckpointError,
    CheckpointManager,
    checkpoint_name,
    checkpoint_paths,
    load_checkpoint_file,
    parse_name,
    plan_retention,
    remove_stale_temp,
)
from hpcsweep.train.checkpoint.store import check_complete, read_metadata
from hpcsweep.train.distributed import init_distributed
from hpcsweep.train.checkpoint.rng_state import rng_state, set_rng_state
from hpcsweep.train.trainer import Trainer

from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)
CPU_WORLD = init_distributed("cpu", 60, env={})


class NotATensor:
    pass


def test_names_round_trip_and_retention_keeps_the_newest_whole_and_the_best_as_weights():
    assert parse_name(checkpoint_name(50, 1.25)) == (50, 1.25)
    assert parse_name(checkpoint_name(7, None)) == (7, float("inf"))
    assert parse_name("notes.txt") is None and parse_name(".tmp-" + checkpoint_name(7, None)) is None
    names = [checkpoint_name(s, v) for s, v in [(10, 3.0), (20, 2.0), (30, 2.5), (40, 1.0), (50, 4.0)]]
    plan = plan_retention(names, keep_top_k=2)
    assert (plan.full, plan.weights_only) == ({names[4]}, {names[3], names[1]})
    assert plan_retention(names, keep_top_k=0).weights_only == set()
    best_is_newest = plan_retention(names[:4], keep_top_k=1)
    assert (best_is_newest.full, best_is_newest.weights_only) == ({names[3]}, set())


def test_rng_state_round_trips_and_loads_with_weights_only(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    path = tmp_path / "rng.pt"
    torch.save(rng_state(torch.device("cpu")), path)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(torch.load(path, weights_only=True), torch.device("cpu"))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def tiny_parts(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_saves_in_place_prune_to_newest_whole_and_best_weights_and_resume_exactly(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=1, world=CPU_WORLD)
    for step, val in [(1, 3.0), (2, 1.0), (3, 2.0), (4, 5.0)]:
        model, optimizer = tiny_parts(step)
        manager.save(model=model, optimizer=optimizer, trainer_state={"status": "running"}, step=step, val_loss=val,
                     wait=step == 4)
    manager.close()
    assert [p.name for p in checkpoint_paths(tmp_path)] == [checkpoint_name(4, 5.0), checkpoint_name(2, 1.0)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in checkpoint_paths(tmp_path))
    newest, best = checkpoint_paths(tmp_path)
    assert sorted(p.name for p in newest.iterdir()) == sorted([RESUME_DIR, WEIGHTS_DIR, TRAINER_FILE])
    assert sorted(p.name for p in best.iterdir()) == sorted([WEIGHTS_DIR, TRAINER_FILE])  # weights only

    model, optimizer = tiny_parts(99)
    resumed = CheckpointManager(tmp_path, keep_top_k=1, world=CPU_WORLD)
    state = resumed.resume(model, optimizer)
    expected_model, expected_optimizer = tiny_parts(4)
    assert (state["step"], state["status"], state["rng_restored"]) == (4, "running", True)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), expected_model.state_dict().values()))
    got, want = optimizer.state_dict()["state"], expected_optimizer.state_dict()["state"]
    assert all(torch.equal(got[i][k], want[i][k]) for i in want for k in want[i])
    resumed.close()


def test_stale_temp_files_of_killed_saves_are_removed(tmp_path):
    (tmp_path / f".tmp-{checkpoint_name(6, None)}" / WEIGHTS_DIR).mkdir(parents=True)
    (tmp_path / f".{checkpoint_name(4, 1.0)}.tmp4242").write_bytes(b"half a file of the old format")
    kept = tmp_path / checkpoint_name(3, 2.0)
    (kept / ".tmp-resume").mkdir(parents=True)  # a prune cut short
    (kept / WEIGHTS_DIR).mkdir()
    assert remove_stale_temp(tmp_path) == [
        f".{checkpoint_name(4, 1.0)}.tmp4242", f".tmp-{checkpoint_name(6, None)}", f"{kept.name}/.tmp-resume"
    ]
    assert sorted(p.name for p in tmp_path.rglob("*")) == [WEIGHTS_DIR, kept.name]


def test_dcp_metadata_that_names_another_class_is_refused(tmp_path):
    model, optimizer = tiny_parts(0)
    manager = CheckpointManager(tmp_path, keep_top_k=0, world=CPU_WORLD)
    manager.save(model=model, optimizer=optimizer, trainer_state={"status": "running"}, step=1, val_loss=None, wait=True)
    manager.close()
    weights = checkpoint_paths(tmp_path)[0] / WEIGHTS_DIR
    assert read_metadata(weights).state_dict_metadata["model.weight"].size == torch.Size([3, 4])
    (weights / ".metadata").write_bytes(pickle.dumps(NotATensor()))
    with pytest.raises(pickle.UnpicklingError, match="NotATensor is not part of DCP metadata: refused"):
        read_metadata(weights)
    assert "refused" in check_complete(weights)


class _ByName:
    """Pickles as ``getattr(owner, name)``: how some Pythons (Debian 12's 3.11.2) pickle an enum member."""

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __reduce__(self):
        return getattr, (self.owner, self.name)


def test_dcp_metadata_enum_members_pickled_by_name_are_read_and_nothing_else_by_getattr(tmp_path):
    from pathlib import PosixPath

    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    (tmp_path / ".metadata").write_bytes(pickle.dumps([_ByName(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT")]))
    assert read_metadata(tmp_path) == [_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT]
    # PosixPath is a class metadata may hold; getattr on it would reach its methods.
    for owner, name in ((PosixPath, "home"), (_MEM_FORMAT_ENCODING, "__class__"), (_MEM_FORMAT_ENCODING, "mro")):
        (tmp_path / ".metadata").write_bytes(pickle.dumps(_ByName(owner, name)))
        with pytest.raises(pickle.UnpicklingError, match=r"getattr\(.*\) is not part of DCP metadata: refused"):
            read_metadata(tmp_path)


def test_an_old_format_file_with_a_pickled_object_is_refused(tmp_path, caplog):
    state = {"model": {}, "optimizer": {}, "scheduler": {}, "step": 2, "status": "running", "payload": NotATensor()}
    evil = tmp_path / checkpoint_name(2, 0.5)
    torch.save(state, evil)
    with pytest.raises(CheckpointError, match="Unpickl|weights_only"):
        load_checkpoint_file(evil)
    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointError, match="no checkpoint .* can be resumed from"):
        CheckpointManager(tmp_path, keep_top_k=0, world=CPU_WORLD).newest_valid()
    assert "skipping unusable checkpoint" in caplog.text and evil.name in caplog.text


def make_trial(path: Path, **trainer) -> Path:
    return make_trial_dir(path, {
        "data.batch_size": 4, "data.seq_len": 16, "data.synthetic_tokens": 20_000, "trainer.device": "cpu",
        "trainer.max_steps": 6, "trainer.warmup_steps": 1, "trainer.eval_every": 2, "trainer.eval_batches": 1,
        "model.dropout": 0.1, **{f"trainer.{key}": value for key, value in trainer.items()},
    })


def write_old_format(trial: Path) -> Path:
    """Turn the trial's newest checkpoint into one file of the format before sharded checkpoints."""
    import yaml

    from hpcsweep.config import trial_config_from_dict

    cfg = trial_config_from_dict(yaml.safe_load((trial / "config.yaml").read_text()))
    trainer = Trainer(cfg, CPU_WORLD, trial)
    assert trainer.resume()
    state = {
        "model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
        **trainer.trainer_state("running"), "step": trainer.step, "val_loss": trainer.val_loss, "world_size": 1,
        "rng": [rng_state(torch.device("cpu"))],
    }
    trainer.close()
    newest = checkpoint_paths(trial / "checkpoints")[0]
    shutil.rmtree(trial / "checkpoints")
    (trial / "checkpoints").mkdir()
    torch.save(state, newest)
    return newest


def test_an_old_format_trial_dir_resumes_exactly(tmp_path, monkeypatch):
    straight = make_trial(tmp_path / "straight", ckpt_every=0)
    assert train.run_trial(straight) == 0
    trial = make_trial(tmp_path / "old", ckpt_every=0)
    monkeypatch.setenv("HPCSWEEP_FAULT", "stop,step=4,rank=0")
    assert train.run_trial(trial) == train.EXIT_STOPPED
    old_file = write_old_format(trial)
    assert old_file.is_file() and old_file.name.startswith("step00000004-")

    monkeypatch.delenv("HPCSWEEP_FAULT")
    assert train.run_trial(trial) == 0
    assert f"resumed from {old_file.name} at step 4" in (trial / "train.log").read_text()
    assert read_metrics(trial)["weights_sha256"] == read_metrics(straight)["weights_sha256"]
    # Retention treats the old file like any checkpoint; kept among the best, it stays whole (a file).
    newest, best = checkpoint_paths(trial / "checkpoints")
    assert (newest.is_dir(), best) == (True, old_file)


def test_a_truncated_newest_checkpoint_is_refused_with_the_reason(tmp_path, monkeypatch):
    trial = make_trial(tmp_path / "trial", ckpt_every=2)
    monkeypatch.setenv("HPCSWEEP_FAULT", "stop,step=4,rank=0")
    assert train.run_trial(trial) == train.EXIT_STOPPED
    newest = checkpoint_paths(trial / "checkpoints")[0]
    shard = newest / RESUME_DIR / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    monkeypatch.delenv("HPCSWEEP_FAULT")
    assert train.run_trial(trial) == train.EXIT_FAILED
    error = "\n".join(read_metrics(trial)["error"])
    # The older checkpoint keeps its weights only: resuming from it would not be exact, and
    # starting over would silently discard the training; the trial fails and says why.
    assert f"{shard}: " in error and "the index needs" in error and "move the directory away" in error


def test_saving_by_minutes_logs_the_first_save_time(tmp_path):
    trial = make_trial(tmp_path / "t", ckpt_every=0, ckpt_every_min=1e-9, keep_top_k=10)
    attempt_file = tmp_path / "attempt.json"  # as the runner writes it under Slurm
    write_attempt(attempt_file, WorkerAttempt(signal_delay_s=120))
    assert train.run_trial(trial, attempt_file) == 0
    # Every step is "due" by the clock; the final save is step 6.
    assert [parse_name(p.name)[0] for p in checkpoint_paths(trial / "checkpoints")] == [6, 5, 4, 3, 2, 1]
    log = (trial / "train.log").read_text()
    assert log.count("checkpoint preflight: the first save took ") == 1
    assert "a stop signal comes signal_delay_s=120 s before the time limit" in log
    assert json.loads((trial / "metrics.json").read_text())["status"] == "completed"


def test_a_checkpoint_name_carries_the_loss_of_its_own_step_or_none():
    assert checkpoint_name(44, None) == "step00000044.pt" and checkpoint_name(25, 5.156744) == "step00000025-val5.156744.pt"
    # names of earlier versions still resume
    assert parse_name("step00000044-val5.156744.pt") == (44, 5.156744)
    assert parse_name("step00000004-valinf.pt") == (4, float("inf"))
