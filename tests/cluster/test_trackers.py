"""MLflow on the real local cluster: a 2-trial sweep logs to a real ``mlflow server``, one trial is
stopped with USR2 and requeued, and each trial is one run whose steps match metrics.json and
TensorBoard, with no gap and no repeat across the requeue."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request

import pytest
import yaml

from hpcsweep.files.tb_runs import run_event_files
from hpcsweep.results.event_reader import read_runs

from .conftest import STOPPABLE_TRIAL, only_sweep_dir, read_json, run_hpcsweep, usr2_at_step, wait_for
from .test_preemption import wait_until_final


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` with a SQLite store on a loopback port; its URI."""
    port = free_port()
    log = (tmp_path / "mlflow-server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert server.poll() is None, (tmp_path / "mlflow-server.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, timeout=240, what="mlflow server to answer /health", interval=1)
        yield uri
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def test_a_requeued_trial_stays_one_mlflow_run_with_every_step_once(tmp_path, slurm_env, mlflow_server):
    from mlflow import MlflowClient

    result = run_hpcsweep(["-m", *STOPPABLE_TRIAL, "model.lr=1e-3,3e-3", "logging.backends=[tensorboard,mlflow]",
                           f"logging.mlflow.tracking_uri={mlflow_server}"], tmp_path, slurm_env, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = only_sweep_dir(tmp_path)
    trials = read_json(sweep_dir / "sweep.json")["trials"]
    stopped = trials[0]
    trial_dirs = {t["num"]: tmp_path / t["trial_dir"] for t in trials}
    usr2_at_step(slurm_env, stopped["job_id"], trial_dirs[0], 3)
    finals = {t["num"]: wait_until_final(slurm_env, t["job_id"], trial_dirs[t["num"]]) for t in trials}

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name(str(sweep_dir.resolve()))
    runs = {run.data.tags["hpcsweep.trial"]: run for run in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == ["0", "1"]
    assert finals[0]["restarts"] >= 1 and finals[0]["last_stop_reason"] == "time_limit", finals[0]
    for num, metrics in finals.items():
        run = runs[str(num)]
        assert metrics["status"] == "completed", metrics.get("error")
        assert metrics["trackers"]["mlflow"] == {"run_id": run.info.run_id, "status": "ok", "tracking_uri": mlflow_server}
        assert run.info.status == "FINISHED" and run.data.tags["hpcsweep.status"] == "completed"
        config = yaml.safe_load((trial_dirs[num] / "config.yaml").read_text())
        assert run.data.params["model.lr"] == json.dumps(config["model"]["lr"])
        assert run.data.tags["hpcsweep.slurm_job"] == trials[num]["job_id"]
        val = client.get_metric_history(run.info.run_id, "val/loss")
        (scalars,) = read_runs([run_event_files(trial_dirs[num])])
        tb_steps = sorted(set(scalars["val/loss"].steps))
        assert sorted(m.step for m in val) == tb_steps == [10, 20]
        assert max(val, key=lambda m: m.step).value == pytest.approx(metrics["val_loss"])
        train_steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert sorted(train_steps) == list(range(1, metrics["max_steps"] + 1)), "every step once, across the requeue"
