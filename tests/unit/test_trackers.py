"""Trackers: each trial one MLflow or W&B run, grouped by sweep, continued on resume, never failing a trial."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcsweep.config import LoggingConfig, MlflowConfig, trial_config_from_dict
from hpcsweep.sweep import tracker_check
from hpcsweep.train import tracker_run
from hpcsweep.train.trackers import build_loggers

SMALL = ["trainer.max_steps=6", "trainer.eval_every=3", "trainer.log_every=1", "data.batch_size=4", "data.seq_len=32"]


@pytest.mark.parametrize(
    ("logging", "message"),
    [
        ({"backends": ["tensorboard", "neptune"]}, "logging.backends=['tensorboard', 'neptune'] is not allowed: a list of "
                                                    "distinct names among tensorboard, mlflow, wandb"),
        ({"backends": ["mlflow", "mlflow"]}, "logging.backends=['mlflow', 'mlflow'] is not allowed"),
        ({"mlflow": {"tracking_uri": "localhost:5000"}}, "logging.mlflow.tracking_uri='localhost:5000' is not allowed: "
                                                          "one of the schemes MLflow stores runs in: http://HOST:PORT"),
        ({"mlflow": {"tracking_uri": "http:/x"}}, "logging.mlflow.tracking_uri='http:/x' is not allowed: http(s)://HOST[:PORT]"),
        ({"wandb": {"mode": "sometimes"}}, "logging.wandb.mode='sometimes' is not allowed"),
    ],
)
def test_bad_logging_keys_are_refused_naming_the_key(logging, message):
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
                       .replace("]", r"\]").replace("'", "'").replace("?", r"\?")):
        trial_config_from_dict({"logging": logging})


def test_good_uris_parse_and_the_default_is_tensorboard_alone():
    assert trial_config_from_dict({}).logging.backends == ["tensorboard"]
    for uri in ("http://127.0.0.1:5000", "https://mlflow.example.org", "sqlite:////tmp/x.db", "file:///tmp/runs",
                "postgresql://u@db/mlflow", "mysql+pymysql://u@db/mlflow"):
        assert MlflowConfig(tracking_uri=uri).tracking_uri == uri


def test_a_backend_whose_package_is_missing_is_named_with_its_install_line(monkeypatch):
    real = tracker_check.importlib.util.find_spec
    monkeypatch.setattr(tracker_check.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    with pytest.raises(ValueError, match=r"^logging.backends names wandb, but the wandb package is not installed: "
                                         r"pip install -e .\[wandb\]$"):
        tracker_check.check_trackers(LoggingConfig(backends=["tensorboard", "mlflow", "wandb"]))
    tracker_check.check_trackers(LoggingConfig(backends=["tensorboard", "mlflow"]))


def test_a_run_goes_on_after_a_stop_and_a_failed_trial_starts_a_retry_run():
    assert tracker_run.choose_run(None, None) == tracker_run.RunChoice(run_id=None)
    assert tracker_run.choose_run({"run_id": "r1"}, "running") == tracker_run.RunChoice(run_id="r1")
    assert tracker_run.choose_run({"run_id": "r1"}, "failed") == tracker_run.RunChoice(run_id=None, retry_of="r1")
    assert tracker_run.choose_run({"status": "failed", "error": "x"}, "running") == tracker_run.RunChoice(run_id=None)


def make_trial_dir(root: Path, num: int, overrides: list[str]) -> Path:
    trial_dir = root / "sweep" / str(num)
    (trial_dir / ".hydra").mkdir(parents=True)
    (trial_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = {"model": {"lr": 0.001, "lora": {"r": 8}}, "trainer": {"max_steps": 4}}
    (trial_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return trial_dir


def attempt(trial_dir: Path, cfg: LoggingConfig, steps: range, status: str, env=None):
    """One attempt of a trial as the trainer drives its loggers: scalars at each step, then its end."""
    loggers = build_loggers(cfg, rank=0, world_size=1, tb_dir=trial_dir / "tb", trial_dir=trial_dir,
                            nodes=["node1"], env=env or {"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "0"})
    for step in steps:
        loggers.log({"train/loss": 1.0 / step, "perf/mfu": None}, step)
    loggers.finish(status, {"status": status, "step": steps[-1], "best_val_loss": 0.5, "error": None})
    fields = loggers.report_fields()
    loggers.close()
    (trial_dir / "metrics.json").write_text(json.dumps({"status": status}))
    return fields


def test_an_mlflow_run_per_trial_continues_after_a_stop_and_a_retry_is_a_new_tagged_run(tmp_path):
    from mlflow import MlflowClient

    cfg = LoggingConfig(backends=["mlflow"])
    trial_dir = make_trial_dir(tmp_path, 0, ["model.lr=1e-3", "logging.backends=[mlflow]", "hydra.verbose=true"])
    tracker_check.create_default_mlflow_stores([(cfg, trial_dir)])
    first = attempt(trial_dir, cfg, range(1, 3), "running")
    second = attempt(trial_dir, cfg, range(3, 5), "completed")
    run_id = first["trackers"]["mlflow"]["run_id"]
    assert second["trackers"]["mlflow"] == first["trackers"]["mlflow"] == {
        "run_id": run_id, "status": "ok", "tracking_uri": f"sqlite:///{tmp_path.resolve()}/sweep/mlflow.db"}

    client = MlflowClient(tracking_uri=first["trackers"]["mlflow"]["tracking_uri"])
    experiment = client.get_experiment_by_name(str((tmp_path / "sweep").resolve()))
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert run.info.run_name == "model.lr=1e-3"
    assert run.data.params["model.lr"] == "0.001" and run.data.params["model.lora.r"] == "8"
    assert run.data.tags["hpcsweep.slurm_job"] == "77_0" and run.data.tags["hpcsweep.nodes"] == "node1"
    assert run.data.tags["hpcsweep.status"] == "completed"
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [1, 2, 3, 4]
    assert "perf/mfu" not in run.data.metrics and run.data.metrics["summary/best_val_loss"] == 0.5

    attempt(trial_dir, cfg, range(1, 2), "failed")
    retried = attempt(trial_dir, cfg, range(1, 2), "completed")
    retry = client.get_run(retried["trackers"]["mlflow"]["run_id"])
    assert retry.info.run_id != run_id and retry.data.tags["hpcsweep.retry_of"] == run_id
    assert client.get_run(run_id).info.status == "FAILED"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_wandb_run(run_file: str) -> tuple[dict, list[dict], dict]:
    """An offline W&B run read back with wandb's own record reader: (config, history rows, run record)."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    store = datastore.DataStore()
    store.open_for_scan(run_file)
    def key(item) -> str:  # a key with a "/" is stored as its parts
        return item.key or "/".join(item.nested_key)

    config, history, run = {}, [], {}
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = {"id": record.run.run_id, "group": record.run.run_group, "name": record.run.display_name}
            config.update({key(item): json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({key(item): json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            history.append({key(item): json.loads(item.value_json) for item in record.history.item})
    return config, history, run


def test_a_local_sweep_with_no_network_writes_offline_wandb_runs_and_survives_a_dead_mlflow_server(tmp_path):
    """The whole sweep runs in a network namespace of its own (``unshare -n``: not even a loopback):
    W&B offline needs no network, and the MLflow server it names cannot be reached."""
    unshare = shutil.which("unshare")
    assert unshare, "util-linux's unshare runs this sweep without any network"
    env = {**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf", "WANDB_SILENT": "true"}
    dead = f"http://127.0.0.1:{closed_port()}"
    args = ["-m", "model.lr=1e-3,3e-3", *SMALL, "logging.backends=[tensorboard,wandb,mlflow]",
            "logging.wandb.mode=offline", f"logging.mlflow.tracking_uri={dead}"]
    result = subprocess.run([unshare, "-n", sys.executable, "-m", "hpcsweep", *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sweep_dir,) = [p.parent for p in tmp_path.glob("multirun/*/*/sweep.json")]
    for num, lr in ((0, 0.001), (1, 0.003)):
        trial_dir = sweep_dir / str(num)
        metrics = json.loads((trial_dir / "metrics.json").read_text())
        assert metrics["status"] == "completed", metrics.get("error")
        assert metrics["trackers"]["mlflow"]["status"] == "failed", metrics["trackers"]
        assert metrics["trackers"]["wandb"]["status"] == "ok" and metrics["trackers"]["wandb"]["mode"] == "offline"
        (run_file,) = glob.glob(str(trial_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
        config, history, run = read_wandb_run(run_file)
        assert run["id"] == metrics["trackers"]["wandb"]["run_id"]
        assert run["group"] == str(sweep_dir.resolve()) and run["name"] == ",".join([f"model.lr={lr:g}", *SMALL])
        assert config["model.lr"] == lr and config["hpcsweep.trial"] == str(num)
        losses = [row for row in history if "train/loss" in row]
        assert [row["_step"] for row in losses] == [1, 2, 3, 4, 5, 6]
        assert [row["val/loss"] for row in history if "val/loss" in row][-1] == pytest.approx(metrics["val_loss"])
    assert "tracker mlflow failed, training goes on without it" in result.stderr + result.stdout

    report = subprocess.run([sys.executable, "-m", "hpcsweep.report", str(sweep_dir)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert (f"W&B runs offline: upload them from a login node with: wandb sync --include-offline "
            f"{sweep_dir}/*/wandb/offline-run-*") in report.stderr
