"""One record of a model folder: read and fingerprinted once per attempt on each node, carried to the
workers in the attempt file, and read by the resume guard, the environment record, the checkpoint's base
identity and the worker's memory plan instead of the folder (issue 30, item 7)."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
import torch

from hpcsweep.config import trial_config_from_dict
from hpcsweep.control import stop
from hpcsweep.files.attempt_file import read_attempt
from hpcsweep.model.folder import model_identity, read_model_folder
from hpcsweep.model.record import ModelRecord, read_model_record, record_from_dict
from hpcsweep.trial import runner
from hpcsweep.trial.attempt import build_attempt
from hpcsweep.trial.identity import ConfigMismatch

from ..folder_reads import opens_in
from .trial_dirs import trial_config

torch.set_num_threads(1)


def small_trial(folder, **settings):
    return trial_config_from_dict(trial_config({
        "model.path": str(folder), "data.batch_size": 2, "data.seq_len": 16, "data.synthetic_tokens": 20_000,
        "trainer.device": "cpu", "trainer.max_steps": 2, "trainer.warmup_steps": 1, "trainer.eval_every": 2,
        "trainer.eval_batches": 1, "trainer.log_every": 1, "trainer.ckpt_every": 0, "trainer.nproc_per_node": 1,
        **settings,
    }))


@pytest.mark.parametrize("kind", ["single", "sharded"])
def test_the_record_is_the_folder_and_its_identity_and_survives_json(model_folders, kind):
    path = str(model_folders[kind])
    record = read_model_record(path)
    assert record.identity == model_identity(read_model_folder(path))
    assert record.folder == read_model_folder(path)
    assert (record.typed, record.path, record.needs_remote_code) == (path, str(model_folders[kind].resolve()), False)
    assert record.weights_bytes == sum(p.stat().st_size for p in model_folders[kind].glob("*.safetensors"))
    assert record_from_dict(json.loads(json.dumps(record.to_dict()))) == record
    refused = r"model record: unknown field\(s\) \['shape'\], missing field\(s\) \['config'\]"
    with pytest.raises(ValueError, match=refused):
        record_from_dict({**{k: v for k, v in record.to_dict().items() if k != "config"}, "shape": 1})


def test_remote_code_is_the_configs_auto_map(model_folders, tmp_path):
    folder = shutil.copytree(model_folders["single"], tmp_path / "remote")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "m.M"}}))
    assert read_model_record(str(folder)).needs_remote_code


def test_a_local_trial_reads_and_fingerprints_its_folder_once_per_attempt(model_folders, tmp_path, monkeypatch):
    folder = shutil.copytree(model_folders["single"], tmp_path / "model")
    trial_dir = tmp_path / "trial"
    # The first attempt is stopped after its first step, as a time limit's signal stops it, and saves.
    monkeypatch.setattr(stop, "stop_file_hooks", lambda path, request: [
        lambda trainer, step: os.kill(os.getpid(), signal.SIGUSR2) if step == 1 else None])
    with opens_in(folder) as opened:
        first = runner.run_trial_on_this_node(small_trial(folder), trial_dir, env={})
    assert (first.kind, first.step) == ("stopped", 1), first
    # One fingerprint (the safetensors header, then its data samples: two opens; transformers maps the
    # weights natively, unseen) and two config.json reads: the record's and from_pretrained's (the memory
    # plan's shape and mapped weights come from the record). Before the record: 2 fingerprints and 5 reads
    # in a first attempt, 3 and 6 in a resumed one.
    reads = (2, 2)
    assert (opened["model.safetensors"], opened["config.json"]) == reads, opened

    record = read_model_record(str(folder))
    attempt = read_attempt(trial_dir / "attempt" / "node0.json")
    assert record_from_dict(attempt.model_record) == record
    assert json.loads((trial_dir / "environment.json").read_text())["model"] == record.identity
    (checkpoint,) = (trial_dir / "checkpoints").glob("step*.pt")
    state = torch.load(checkpoint / "trainer.pt" if checkpoint.is_dir() else checkpoint, weights_only=True)
    assert state["base_model"] == record.identity

    # The resumed attempt: its resume guard compares the attempt's record, read once again.
    monkeypatch.undo()
    with opens_in(folder) as opened:
        second = runner.run_trial_on_this_node(small_trial(folder), trial_dir, env={})
    assert second.kind == "completed" and second.metrics["step"] == 2, second
    assert (opened["model.safetensors"], opened["config.json"]) == reads, opened


def test_a_folder_changed_after_training_is_refused_by_the_attempts_record(model_folders, tmp_path):
    folder = shutil.copytree(model_folders["single"], tmp_path / "model")
    trial_dir = tmp_path / "trial"
    assert runner.run_trial_on_this_node(small_trial(folder), trial_dir, env={}).kind == "completed"
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "initializer_range": 0.5}))
    attempt = build_attempt(small_trial(folder), trial_dir, {})
    assert attempt.model.config["initializer_range"] == 0.5
    with pytest.raises(ConfigMismatch, match=r"changed since the trial trained from it: config.json "
                                             r"initializer_range=0.02 \(now 0.5\)"):
        runner.run_trial_on_this_node(small_trial(folder), trial_dir, env={})


def test_the_export_takes_the_bases_config_from_the_checkpoints_record_not_the_folder(model_folders, tmp_path):
    from hpcsweep.export.writer import base_folder

    folder = shutil.copytree(model_folders["single"], tmp_path / "model")
    identity = {**read_model_record(str(folder)).identity, "config": {"model_type": "deepseek_v3", "dtype": "bfloat16"}}
    # What config.json says now is not what the trial trained from: the record is.
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "float16"}))
    base = base_folder(identity, str(folder), trust_remote_code=False)
    assert (base.path, base.main_dtype, base.remote_code) == (folder.resolve(), "bfloat16", False)
