"""One attempt of a trial on one node, built once: its config, its files, its Slurm job, its rendezvous, its
caps and this node's role.

Every phase of the runner (``hpcsweep.trial.runner``) takes the attempt instead of re-reading the
environment: the Slurm job is parsed from it once (``slurm_job_env``), the caps come from the launcher's
config (``Caps.from_launcher``), and what the workers need is written to the node's attempt file
(``hpcsweep.files.attempt_file``). Which node records, requeues and writes the trial's files is decided
here only: ``records_for_the_trial``. The model folder ``model.path`` names is read here too, once per
attempt (``hpcsweep.model.record``): the resume guard, the environment record and the workers read
that record, never the folder again.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcsweep.config import TrialConfig
from hpcsweep.files.attempt_file import WorkerAttempt
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.model.record import ModelRecord, read_model_record
from hpcsweep.slurm.env import SlurmJobEnv, slurm_job_env
from hpcsweep.trial.rendezvous import Rendezvous, rendezvous_from_env

DEFAULT_MAX_RETRIES = 2
"""``hydra.launcher.max_retries`` when the launcher does not say (a single run, the local launcher)."""


def _whole(params: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = params.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"hydra.launcher.{key}={value!r} is not allowed: a whole number >= 0")
    return value


@dataclasses.dataclass(frozen=True)
class Caps:
    """The launcher's limits on one trial: requeues after a stop (``max_num_timeout``, None: no cap),
    retries after an infrastructure failure (``max_retries``), and the lead of the time-limit signal
    (``signal_delay_s``, None outside Slurm)."""

    max_requeues: int | None = None
    max_retries: int = DEFAULT_MAX_RETRIES
    signal_delay_s: int | None = None

    @classmethod
    def from_launcher(cls, params: Mapping[str, Any]) -> Caps:
        """The caps in ``hydra.launcher``'s settings; a key the launcher lacks takes its default."""
        retries = _whole(params, "max_retries", DEFAULT_MAX_RETRIES)
        return cls(
            max_requeues=_whole(params, "max_num_timeout", None),
            max_retries=DEFAULT_MAX_RETRIES if retries is None else retries,
            signal_delay_s=_whole(params, "signal_delay_s", None),
        )


def free_port() -> int:
    """A TCP port free on this host right now (for local trials, where no job id exists)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclasses.dataclass(frozen=True)
class TrialAttempt:
    """This node's attempt of one trial.

    ``env`` is the environment the attempt started with (its workers start from it, plus the trial's own
    variables); ``search_trial`` the study trial's file of a search trial.
    """

    trial: TrialConfig
    files: TrialFiles
    job: SlurmJobEnv | None
    rdzv: Rendezvous
    caps: Caps
    env: Mapping[str, str]
    force_resume: bool = False
    search_trial: Path | None = None
    model: ModelRecord | None = None
    """The folder ``model.path`` names, as this node read it when the attempt began; None for the built-in model."""
    container: Mapping[str, Any] | None = None
    """The container the task was submitted to run in, with its image's identity at submission
    (``hpcsweep.container.record.submitted_record``); None outside one."""

    @property
    def records_for_the_trial(self) -> bool:
        """Node 0 alone writes the trial's files (config aside, environment, stop and failure records)
        and requeues its job; the other nodes leave that to it."""
        return self.rdzv.node_rank == 0

    @property
    def under_slurm(self) -> bool:
        return self.job is not None

    @property
    def requeues(self) -> int:
        """How often Slurm has requeued the job so far (``SLURM_RESTART_COUNT``; 0 outside Slurm)."""
        return self.job.restart_count if self.job else 0

    @property
    def label(self) -> str:
        """This attempt's name among the trial's runs: ``JOB.RESTARTS``, or ``local.PID`` outside Slurm."""
        return f"{self.job.job_label}.{self.job.restart_count}" if self.job else f"local.{os.getpid()}"

    @property
    def node(self) -> str:
        """This node's name, as failures and hang reports name it."""
        return self.job.node_name if self.job and self.job.node_name else socket.gethostname()

    @property
    def stop_file(self) -> Path:
        return self.files.stop_file(self.rdzv.node_rank)

    @property
    def worker_dir(self) -> Path:
        return self.files.worker_dir(self.rdzv.node_rank)

    @property
    def attempt_file(self) -> Path:
        return self.files.attempt_file(self.rdzv.node_rank)

    def for_workers(self) -> WorkerAttempt:
        """What this node's workers read from the attempt file."""
        return WorkerAttempt(
            node_rank=self.rdzv.node_rank,
            stop_file=self.stop_file,
            worker_dir=self.worker_dir,
            signal_delay_s=self.caps.signal_delay_s if self.under_slurm else None,
            search_trial=self.search_trial,
            model_record=None if self.model is None else self.model.to_dict(),
        )


def build_attempt(
    trial: TrialConfig,
    trial_dir: Path,
    env: Mapping[str, str],
    *,
    caps: Caps = Caps(),
    force_resume: bool = False,
    search_trial: Path | None = None,
    container: Mapping[str, Any] | None = None,
) -> TrialAttempt:
    """The attempt of ``trial`` in ``trial_dir`` on this node, from the environment it started with.

    Outside Slurm a free port is picked for the rendezvous unless ``MASTER_PORT`` is set. The model
    folder is read and its weights fingerprinted here, once (``ValueError`` naming ``model.path`` when
    it cannot be read).
    """
    env = dict(env)
    job = slurm_job_env(env)
    if job is None and not env.get("MASTER_PORT"):
        env["MASTER_PORT"] = str(free_port())
    rdzv = rendezvous_from_env(env, trial.trainer.nproc_per_node)
    model = None if trial.model.path is None else read_model_record(trial.model.path)
    return TrialAttempt(trial, TrialFiles(trial_dir), job, rdzv, caps, env, force_resume, search_trial, model,
                        container)
