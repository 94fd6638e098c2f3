"""A trial as one Weights & Biases run (``logging.backends`` names ``wandb``).

Compute nodes often reach no internet, so on a Slurm node the run is offline by default
(``logging.wandb.mode=auto``): wandb writes it under the trial dir (``TRIAL_DIR/wandb/offline-run-*``)
and ``python -m hpcsweep.status``/``report`` print the one ``wandb sync`` command that uploads the
whole sweep from a login node. Runs of a sweep share a W&B group (the sweep dir). The run id is kept
in the trial dir, so a requeued trial continues its run (``resume="allow"``). ``wandb.init`` runs on the
trial's thread; ``log`` and ``finish`` on the tracker's own (``hpcsweep.train.trackers.thread``): a
``finish`` that waits on an unreachable online server (90 s and more) costs the trial
``trackers.FINISH_WAIT_S`` at most.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcsweep.config import WandbConfig
from hpcsweep.train.trackers.metrics import Logger
from hpcsweep.train.trackers.tracked_run import RunChoice, RunIdentity

def wandb_mode(cfg: WandbConfig, env: Mapping[str, str]) -> str:
    """``offline`` or ``online``: ``auto`` is offline inside a Slurm job."""
    if cfg.mode != "auto":
        return cfg.mode
    return "offline" if "SLURM_JOB_ID" in env else "online"


class WandbLogger(Logger):
    """Scalars, config and the final status of one trial's W&B run."""

    def __init__(self, cfg: WandbConfig, trial_dir: Path, identity: RunIdentity, choice: RunChoice,
                 env: Mapping[str, str]) -> None:
        import wandb

        config = {**identity.params, **{key: value for key, value in identity.tags.items()}}
        if choice.retry_of:
            config["hpcsweep.retry_of"] = choice.retry_of
        self.run = wandb.init(
            project=cfg.project, entity=cfg.entity, group=identity.group, name=identity.name, id=choice.run_id,
            resume="allow" if choice.run_id else None, dir=str(trial_dir), config=config, mode=wandb_mode(cfg, env),
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        self.mode, self.run_id = wandb_mode(cfg, env), self.run.id

    def log(self, metrics: Mapping[str, float | None], step: int) -> None:
        values = {tag: value for tag, value in metrics.items() if value is not None}
        if values:
            self.run.log(values, step=step)

    def finish(self, status: str, summary: Mapping[str, Any]) -> None:
        self.run.summary.update({"status": "stopped" if status == "running" else status,
                                 **{k: v for k, v in summary.items() if isinstance(v, (int, float, str))}})
        self.run.finish(exit_code=1 if status == "failed" else 0)

    def report_fields(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "mode": self.mode}
