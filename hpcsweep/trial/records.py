"""What an attempt writes into its trial dir before training: the resolved config and the environment record."""

from __future__ import annotations

import logging
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hpcsweep.config import TrialConfig, trial_config_to_dict
from hpcsweep.container.record import parse_os_release, read_os_release
from hpcsweep.files import metrics_file
from hpcsweep.files.atomic import atomic_write_text
from hpcsweep.files.code_snapshot import read_snapshot_record, snapshot_dir_of
from hpcsweep.files.sweep_record import now_iso
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.model.record import ModelRecord
from hpcsweep.slurm.env import SlurmJobEnv
from hpcsweep.trial.identity import MODEL_RECORD_KEY, check_resume, differences_text
from hpcsweep.trial.install import INSTALL_RECORD_KEY, recorded_install
from hpcsweep.trial.rendezvous import Rendezvous

log = logging.getLogger(__name__)


def git_state(source_dir: Path) -> dict[str, Any]:
    """The commit and dirty flag of the checkout ``source_dir`` is in (nulls outside git)."""
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(source_dir), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def environment_record(
    rdzv: Rendezvous,
    nccl_preset: str,
    nccl_vars: Mapping[str, str],
    job: SlurmJobEnv | None,
    model: Mapping[str, Any] | None = None,
    container: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What a trial ran under: code version, rendezvous, NCCL preset (``auto`` resolved) and variables,
    Slurm job and restarts, the model folder it trains from, its container, and what it ran on.

    ``code_snapshot`` names the sweep's code snapshot this code was imported from (its path,
    commit and diff hash), or is null when the trial runs the installed code; ``hpcsweep`` its version
    and the commit of its install (``hpcsweep.trial.install``), from any folder. ``model`` is the
    identity of the ``model.path`` folder (``hpcsweep.trial.identity.trial_model_identity``), null for
    the built-in model; a resume compares the folder with it. ``container``: the runtime, image and image
    identity the task was submitted with (``hpcsweep.container.record.submitted_record``), null outside one.
    ``os_release``, ``python``, ``python_executable`` and ``torch`` are this process's: inside the container
    when there is one, so that the record says where the trial really ran.
    """
    import torch

    code_dir = snapshot_dir_of(__file__)
    return {
        **git_state(Path(__file__).resolve().parent),
        "code_snapshot": None if code_dir is None else read_snapshot_record(code_dir),
        INSTALL_RECORD_KEY: recorded_install(code_dir),
        "recorded_at": now_iso(),
        "hostname": socket.gethostname(),
        "os_release": parse_os_release(read_os_release() or ""),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "torch": torch.__version__,
        "container": None if container is None else dict(container),
        "rendezvous": rdzv.as_env(),
        "nccl_preset": nccl_preset,
        "nccl": dict(nccl_vars),
        "slurm": None
        if job is None
        else {
            "job_id": job.job_id,
            "job_label": job.job_label,
            "array_job_id": job.array_job_id,
            "array_task_id": job.array_task_id,
            "nodelist": job.nodelist,
            "node_name": job.node_name,
            "restart_count": job.restart_count,
        },
        MODEL_RECORD_KEY: None if model is None else dict(model),
    }


def write_trial_config(trial: TrialConfig, files: TrialFiles) -> None:
    """Write the resolved ``config.yaml`` the workers read."""
    text = yaml.safe_dump(trial_config_to_dict(trial), sort_keys=False)
    atomic_write_text(files.config, text)


def check_trial_config(
    trial: TrialConfig, files: TrialFiles, force: bool, keeps_records: bool, model: ModelRecord | None = None
) -> None:
    """Refuse (``ConfigMismatch``) to resume the trial dir under another training config, or from a
    model folder that changed (``model``: the attempt's record of ``model.path``'s folder).

    With ``force``, log the differences and keep the old ``config.yaml`` aside (the node that
    ``keeps_records``), so the trial dir still records every config it was trained with.
    """
    differences = check_resume(files.root, trial, force, lambda _: None if model is None else model.identity)
    if not differences:
        return
    log.warning("resume.force=true: resuming %s with a different config: %s", files.root,
                differences_text(differences))
    if keeps_records:
        stamp = now_iso().replace(":", "").replace("+0000", "Z")
        aside = files.config_aside(stamp)
        atomic_write_text(aside, files.config.read_text())
        log.warning("the config it was trained with is kept as %s", aside.name)


def read_metrics(files: TrialFiles) -> dict[str, Any]:
    """The trial's ``metrics.json``; ``{}`` before the first write, or if it cannot be read (the
    exit codes alone then say how the trial ended)."""
    return metrics_file.read_metrics(files.metrics) or {}
