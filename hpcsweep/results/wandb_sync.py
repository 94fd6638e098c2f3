"""The one command that uploads a sweep's offline W&B runs, for ``status`` and ``report`` to print.

A trial that logs to W&B offline (``logging.wandb.mode``; see ``hpcsweep.train.trackers.wandb_logger``)
leaves its run under its trial dir. From a login node that reaches W&B, one ``wandb sync`` uploads
them all; running it again uploads only what is new.
"""

from __future__ import annotations

import shlex
from pathlib import Path

OFFLINE_RUNS = "wandb/offline-run-*"
"""Where an offline run lies, under its trial dir."""


def sync_command(sweep_dir: Path) -> str | None:
    """``wandb sync ... SWEEP_DIR/*/wandb/offline-run-*``, or None when the sweep has no offline run."""
    if not any(Path(sweep_dir).glob(f"*/{OFFLINE_RUNS}")):
        return None
    return f"wandb sync --include-offline {shlex.quote(str(sweep_dir))}/*/{OFFLINE_RUNS}"


def sync_line(sweep_dir: Path) -> str | None:
    """What ``status`` and ``report`` print under their table, or None."""
    command = sync_command(sweep_dir)
    return None if command is None else f"W&B runs offline: upload them from a login node with: {command}"
