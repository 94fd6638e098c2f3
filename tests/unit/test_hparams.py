"""HParams: swept parameters from overrides and config, as TensorBoard's own loader and HParams backend see them."""

from __future__ import annotations

from pathlib import Path

from tensorboard import context
from tensorboard.backend.event_processing import (
    data_provider,
    event_multiplexer,
    plugin_event_multiplexer,
)
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import (
    api_pb2,
    backend_context,
    get_experiment,
    metadata,
)

from hpcsweep.files.tb_runs import trial_run_dir
from hpcsweep.results.hparams import (
    flatten_config,
    split_override,
    trial_hparams,
    write_trial_hparams,
)
from hpcsweep.train.trackers.metrics import TensorBoardLogger

from .sweep_fixtures import make_sweep
from .tb_fixtures import write_hydra_record


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


def tensorboard_experiment(logdir: Path) -> api_pb2.Experiment:
    """The HParams experiment as TensorBoard's dashboard requests it (GetExperiment)."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    backend = backend_context.Context(
        base_plugin.TBContext(logdir=str(logdir), multiplexer=multiplexer, data_provider=provider)
    )
    return get_experiment.Handler(context.RequestContext(), backend, "", api_pb2.GetExperimentRequest()).run()


def test_every_trial_has_hparams_tensorboard_can_read(tmp_path):
    lrs = ["1e-4", "3e-4", "1e-3"]
    make_sweep(tmp_path, [([f"model.lr={lr}", "data.batch_size=4"], None) for lr in lrs])
    for num in range(3):
        trial_dir = tmp_path / str(num)
        write_hydra_record(trial_dir, f"data.batch_size=4,model.lr={lrs[num]}")
        (trial_dir / "config.yaml").write_text(f"model:\n  lr: {float(lrs[num])}\ndata:\n  batch_size: 4\n")
        run_dir = trial_run_dir(trial_dir)
        assert write_trial_hparams(trial_dir, run_dir) is True
        assert write_trial_hparams(trial_dir, trial_run_dir(trial_dir)) is False  # a resumed trial keeps its first record
        logger = TensorBoardLogger(run_dir)
        logger.log({"val/loss": 3.0 - num, "perf/mfu": None}, step=1)
        logger.close()

    multiplexer = event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    runs = [f"{num}/tb/data.batch_size=4,model.lr={lr}" for num, lr in enumerate(lrs)]
    assert sorted(multiplexer.Runs()) == runs
    for run, lr in zip(runs, lrs):
        content = multiplexer.GetAccumulator(run).PluginTagToContent(metadata.PLUGIN_NAME)
        start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
        assert start.hparams["model.lr"].number_value == float(lr)
        assert start.hparams["data.batch_size"].number_value == 4

    experiment = tensorboard_experiment(tmp_path)
    infos = {h.name: h for h in experiment.hparam_infos}
    assert infos["model.lr"].differs and infos["model.lr"].type == api_pb2.DATA_TYPE_FLOAT64
    assert (infos["model.lr"].domain_interval.min_value, infos["model.lr"].domain_interval.max_value) == (1e-4, 1e-3)
    assert not infos["data.batch_size"].differs
    assert [h.name for h in experiment.hparam_infos][0] == "model.lr"  # keys that differ come first
    assert [m.name.tag for m in experiment.metric_infos] == ["val/loss"]  # perf/mfu=None was not logged


def test_no_overrides_recorded_writes_nothing(tmp_path):
    assert write_trial_hparams(tmp_path, tmp_path / "tb") is False
    assert not (tmp_path / "tb").exists()
