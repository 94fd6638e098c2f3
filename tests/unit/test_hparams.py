"""HParams: swept parameters from overrides and config, visible through TensorBoard's own loader."""

from __future__ import annotations

from tensorboard.backend.event_processing import event_multiplexer
from tensorboard.plugins.hparams import api_pb2, metadata

from hpcsweep.hparams import (
    METRIC_TAGS,
    flatten_config,
    split_override,
    trial_hparams,
    write_trial_hparams,
)

from .sweep_fixtures import make_sweep


def test_split_override():
    assert split_override("model.lr=1e-4") == ("model.lr", "1e-4")
    assert split_override("++trainer.seed=3") == ("trainer.seed", "3")
    assert split_override("x=a=b") == ("x", "a=b")
    assert split_override("~model.dropout") is None


def test_flatten_config():
    assert flatten_config({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}) == {"a.b": 1, "a.c.d": [1, 2], "e": None}


def test_trial_hparams_are_override_keys_valued_from_the_config():
    config = {"model": {"lr": 0.0001, "arch": "llama"}, "trainer": {"grad_checkpointing": True, "betas": [0.9, 0.95]},
              "data": {"path": None}}
    overrides = ["model.lr=1e-4", "model=llama_small", "trainer.grad_checkpointing=true", "+trainer.betas=[0.9,0.95]",
                 "data.path=null", "hydra.launcher.cpus_per_task=1", "~model.dropout"]
    assert trial_hparams(overrides, config) == {
        "model.lr": 0.0001,
        "model": "llama_small",
        "trainer.grad_checkpointing": True,
        "trainer.betas": "[0.9, 0.95]",
        "data.path": "null",
    }


def test_every_trial_has_hparams_tensorboard_can_read(tmp_path):
    lrs = ["1e-4", "3e-4", "1e-3"]
    make_sweep(tmp_path, [([f"model.lr={lr}", "data.batch_size=4"], None) for lr in lrs])
    for num in range(3):
        (tmp_path / str(num) / "config.yaml").write_text(f"model:\n  lr: {float(lrs[num])}\ndata:\n  batch_size: 4\n")
        assert write_trial_hparams(tmp_path / str(num)) is True
        assert write_trial_hparams(tmp_path / str(num)) is False  # a resumed trial keeps its first record

    multiplexer = event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    assert sorted(multiplexer.Runs()) == ["0/tb", "1/tb", "2/tb"]
    for num, lr in enumerate(lrs):
        content = multiplexer.GetAccumulator(f"{num}/tb").PluginTagToContent(metadata.PLUGIN_NAME)
        start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
        assert start.hparams["model.lr"].number_value == float(lr)
        assert start.hparams["data.batch_size"].number_value == 4
        experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
        assert [(h.name, h.type) for h in experiment.hparam_infos] == [
            ("model.lr", api_pb2.DATA_TYPE_FLOAT64), ("data.batch_size", api_pb2.DATA_TYPE_FLOAT64)]
        assert [m.name.tag for m in experiment.metric_infos] == list(METRIC_TAGS)


def test_no_overrides_recorded_writes_nothing(tmp_path):
    assert write_trial_hparams(tmp_path) is False
    assert not (tmp_path / "tb").exists()
