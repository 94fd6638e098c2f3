"""A trial as one MLflow run (``logging.backends`` names ``mlflow``), through ``MlflowClient``.

The sweep is an MLflow experiment and each trial a run in it, not a child of a parent run: a parent
run needs a process that lives as long as the sweep, and a Slurm sweep has no such driver (its
trials start and end on their own, in any order, requeued at any time); MLflow's experiment view
already compares its runs side by side. The run's tags name the sweep dir, trial, Slurm job and
nodes; its params are the trial's resolved config, flattened.

MLflow reads its HTTP retry settings from the environment; a trial's defaults are set here (unless
the user set them): a dead server costs a trial a few seconds once, not minutes of backoff at every
log window.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcsweep.config import MlflowConfig
from hpcsweep.train.trackers.metrics import Logger
from hpcsweep.train.trackers.tracked_run import RunChoice, RunIdentity, param_text, sweep_dir_of

DEFAULT_DB = "mlflow.db"
"""The SQLite store in the sweep dir when ``logging.mlflow.tracking_uri`` is null."""
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
"""MLflow's HTTP client settings for a trial: about 20 s at most before a dead server is given up."""
BATCH = 100
"""Params per ``log_batch`` call: MLflow's limit (``MAX_PARAMS_TAGS_PER_BATCH``)."""
METRIC_BATCH = 1000
"""Metrics per ``log_batch`` call: MLflow's limit (``MAX_METRICS_PER_BATCH``)."""
FLUSH_EVERY_S = 15.0
"""Scalars are sent at most this often (and when the run ends or pauses): one store round trip costs
tens of ms of CPU (SQLAlchemy, HTTP), which at every log window of a small model's fast steps was a
6 % slowdown (``benchmarks/tracker_cost.py``). The sends run on the tracker's own thread
(``hpcsweep.train.trackers.thread``), so a slow server holds up no step. A trial killed outright loses at
most this much."""
PARAM_LENGTH = 6000
"""MLflow's longest param value (``MAX_PARAM_VAL_LENGTH``); longer values are cut."""
FINAL_STATUS = {"failed": "FAILED", "running": "KILLED"}
"""MLflow's run status for a trial's metrics.json status; every other ended trial is ``FINISHED``."""
SUMMARY_KEYS = ("best_val_loss", "val_loss", "train_loss", "tokens_per_s", "mfu", "step")
"""metrics.json numbers logged as ``summary/KEY`` when a run ends."""


def tracking_uri(cfg: MlflowConfig, trial_dir: Path) -> str:
    """``logging.mlflow.tracking_uri``, or the sweep dir's own SQLite store."""
    return cfg.tracking_uri or f"sqlite:///{sweep_dir_of(trial_dir) / DEFAULT_DB}"


def experiment_name(cfg: MlflowConfig, trial_dir: Path) -> str:
    """``logging.mlflow.experiment``, or the sweep dir's path (unique per sweep)."""
    return cfg.experiment or str(sweep_dir_of(trial_dir))


def experiment_id(client: Any, name: str) -> str:
    """The id of experiment ``name``, created when missing (two trials may race to create it)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


class MlflowLogger(Logger):
    """Scalars, params, tags and the final status of one trial's MLflow run."""

    def __init__(self, cfg: MlflowConfig, trial_dir: Path, identity: RunIdentity, choice: RunChoice) -> None:
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.client = MlflowClient(tracking_uri=tracking_uri(cfg, trial_dir))
        self.pending: list[Any] = []
        self.flushed_at = time.monotonic()
        if choice.run_id is not None:
            self.run_id = choice.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = {**identity.tags, **({"hpcsweep.retry_of": choice.retry_of} if choice.retry_of else {})}
        run = self.client.create_run(experiment_id(self.client, experiment_name(cfg, trial_dir)),
                                     run_name=identity.name, tags=tags)
        self.run_id = run.info.run_id
        params = [Param(key, param_text(value)[:PARAM_LENGTH]) for key, value in identity.params.items()]
        for start in range(0, len(params), BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + BATCH], synchronous=True)

    def log(self, metrics: Mapping[str, float | None], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending += [Metric(tag, float(value), now, step) for tag, value in metrics.items() if value is not None]
        if time.monotonic() - self.flushed_at >= FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        """Send the scalars logged since the last flush (on the tracker's thread: ``thread``)."""
        pending, self.pending = self.pending, []
        for start in range(0, len(pending), METRIC_BATCH):
            self.client.log_batch(self.run_id, metrics=pending[start : start + METRIC_BATCH], synchronous=True)
        # From the end of the send: behind a slow server, the scalars queued meanwhile go in one batch.
        self.flushed_at = time.monotonic()

    def finish(self, status: str, summary: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric, RunTag

        self.flush()
        now, step = int(time.time() * 1000), int(summary.get("step") or 0)
        numbers = [Metric(f"summary/{key}", float(summary[key]), now, step)
                   for key in SUMMARY_KEYS if isinstance(summary.get(key), (int, float))]
        error = summary.get("error")
        tags = [RunTag("hpcsweep.status", "stopped" if status == "running" else status)]
        if error:
            tags.append(RunTag("hpcsweep.error", str(error if isinstance(error, str) else error[-1])[:5000]))
        self.client.log_batch(self.run_id, metrics=numbers, tags=tags, synchronous=True)
        self.client.set_terminated(self.run_id, status=FINAL_STATUS.get(status, "FINISHED"))

    def report_fields(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "tracking_uri": self.client.tracking_uri}

    def close(self) -> None:
        self.flush()
