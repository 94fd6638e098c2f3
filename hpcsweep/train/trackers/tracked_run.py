"""What a trial's tracker run is: its name, tags, params and id, decided from the trial dir alone.

Each trial is one run of each tracker (MLflow, W&B), grouped by sweep. The run ids live in the
trial dir (``trackers.json``), so a requeued or resumed trial continues its own run; a trial that
failed and is tried again starts a new run, tagged as the retry of the old one. Pure decisions and
one small file: the trackers' own clients are in ``mlflow_logger`` and ``wandb_logger``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hpcsweep.files.atomic import atomic_write_json
from hpcsweep.files.trial_files import CONFIG_FILE
from hpcsweep.results.hparams import OVERRIDES_FILE
from hpcsweep.results.overrides import flatten_config, override_values

RUNS_FILE = "trackers.json"
"""``TRIAL_DIR/trackers.json``: ``{backend: {"run_id": ..., "status": ...}}``, written by rank 0."""
FINAL_STATUSES = ("completed", "stopped_early", "pruned", "failed", "skipped_budget", "cancelled")
"""metrics.json statuses after which a trial's run is over (``running`` means requeued or resumed)."""


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """Who a trial's run is, for every tracker."""

    name: str
    """The trial's overrides (``model.lr=1e-4,trainer.seed=1``), or ``trial N`` when it has none."""
    group: str
    """The sweep: the sweep dir's path, as the trial dir's parent."""
    tags: dict[str, str]
    params: dict[str, Any]
    """The resolved config, flattened (``model.lr``)."""


def sweep_dir_of(trial_dir: Path) -> Path:
    """The sweep dir a trial dir belongs to (Hydra's ``SWEEP_DIR/N`` layout)."""
    return trial_dir.resolve().parent


def run_identity(trial_dir: Path, env: Mapping[str, str], nodes: list[str]) -> RunIdentity:
    """The run's name, group, tags and params, from the trial dir's Hydra record and ``config.yaml``."""
    overrides_path = trial_dir / OVERRIDES_FILE
    overrides = yaml.safe_load(overrides_path.read_text()) if overrides_path.exists() else []
    # Where the metrics go is not what trained: logging.* overrides are left out of the name.
    values = {k: v for k, v in override_values(overrides or []).items() if not k.startswith("logging.")}
    name = ",".join(f"{k}={v}" for k, v in values.items()) or f"trial {trial_dir.name}"
    config = yaml.safe_load((trial_dir / CONFIG_FILE).read_text()) or {}
    params = flatten_config(config)
    job = env.get("SLURM_ARRAY_JOB_ID")
    job_id = f"{job}_{env['SLURM_ARRAY_TASK_ID']}" if job and "SLURM_ARRAY_TASK_ID" in env else env.get("SLURM_JOB_ID", "")
    tags = {
        "hpcsweep.sweep_dir": str(sweep_dir_of(trial_dir)),
        "hpcsweep.trial": trial_dir.name,
        "hpcsweep.slurm_job": job_id or "local",
        "hpcsweep.nodes": ",".join(nodes),
    }
    return RunIdentity(name=name, group=str(sweep_dir_of(trial_dir)), tags=tags, params=params)


def param_text(value: Any) -> str:
    """A config value as a tracker's text param: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def read_runs(trial_dir: Path) -> dict[str, dict[str, Any]]:
    """The trial's tracker runs so far (empty for a new trial)."""
    path = trial_dir / RUNS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def write_runs(trial_dir: Path, runs: Mapping[str, Mapping[str, Any]]) -> None:
    atomic_write_json(trial_dir / RUNS_FILE, dict(runs))


@dataclasses.dataclass(frozen=True)
class RunChoice:
    """Continue an existing run (``run_id``) or start a new one (``run_id`` None, maybe a retry)."""

    run_id: str | None
    retry_of: str | None = None


def choose_run(previous: Mapping[str, Any] | None, previous_status: str | None) -> RunChoice:
    """A trial's run for this attempt: the same run while the trial has not ended (requeued,
    resumed after a stop), a new one tagged as the retry after a failure, a new one otherwise."""
    if not previous or not previous.get("run_id"):
        return RunChoice(run_id=None)
    if previous_status == "failed":
        return RunChoice(run_id=None, retry_of=previous["run_id"])
    return RunChoice(run_id=previous["run_id"])
