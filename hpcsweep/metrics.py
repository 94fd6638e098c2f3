"""What a trial reports: TensorBoard scalars under ``tb/`` and ``metrics.json``.

Loggers follow torchtitan: a no-op base, a small TensorBoard logger, and ``build_logger`` that picks
one by a pure "which rank logs" rule. Tags are fixed (``TAGS``) so sweeps compare across trials.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hpcsweep.fileio import atomic_write_json
from hpcsweep.sweep_record import now_iso

TAGS = ("train/loss", "val/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/mfu")
A100_BF16_PEAK_FLOPS = 312e12
"""Dense bf16 tensor-core peak of one A100, the MFU reference on CUDA."""
CPU_NOMINAL_PEAK_FLOPS = 1e11
"""A nominal 100 GFLOP/s per CPU worker: makes CPU MFU a comparable number, not a hardware fact."""
STATUSES = ("running", "completed", "failed", "stopped_early", "stopped")


def logging_rank(world_size: int) -> int:
    """The one rank that writes TensorBoard events and metrics.json."""
    del world_size  # always rank 0: it holds the reduced loss and writes the checkpoints too
    return 0


def peak_flops(device_type: str) -> float:
    """Per-worker peak FLOP/s used for MFU."""
    return A100_BF16_PEAK_FLOPS if device_type == "cuda" else CPU_NOMINAL_PEAK_FLOPS


def mfu(tokens_per_s: float, flops_per_token: float, world_size: int, peak: float) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s over the peak of all workers."""
    return tokens_per_s * flops_per_token / (peak * world_size)


class Logger:
    """Logs nothing; the logger of every rank but the logging rank."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record scalars ``{tag: value}`` at ``step``."""

    def close(self) -> None:
        """Flush and release resources."""


class TensorBoardLogger(Logger):
    """Scalars as TensorBoard events under ``log_dir``."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import (
            SummaryWriter,  # imported here: slow, and rank 0 only
        )

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()


def build_logger(rank: int, world_size: int, tb_dir: Path) -> Logger:
    """A TensorBoard logger on the logging rank, a no-op logger elsewhere."""
    return TensorBoardLogger(tb_dir) if rank == logging_rank(world_size) else Logger()


def weights_sha256(state_dict: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over the tensors of a state dict in sorted key order (contiguous CPU bytes).

    Key names and dtypes are hashed too, so a renamed or recast tensor changes the digest.
    """
    digest = hashlib.sha256()
    for key in sorted(state_dict):
        tensor = state_dict[key].detach().cpu().contiguous()
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def read_metrics(path: Path) -> dict[str, Any] | None:
    """The metrics.json of a trial, or None when there is none (or it is unreadable)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def new_report(*, max_steps: int, world_size: int, restarts: int, env: Mapping[str, str]) -> dict[str, Any]:
    """The metrics.json fields of a trial that has not reported anything yet."""
    return {
        "status": "running",
        "step": 0,
        "max_steps": max_steps,
        "train_loss": None,
        "val_loss": None,
        "best_val_loss": None,
        "lr": None,
        "grad_norm": None,
        "tokens_per_s": None,
        "mfu": None,
        "restarts": restarts,
        "slurm_restart_count": int(env.get("SLURM_RESTART_COUNT", "0")),
        "world_size": world_size,
        "nodes": [],
        "ranks": [],
        "started_at": now_iso(),
        "weights_sha256": None,
        "error": None,
    }


def write_metrics(path: Path, metrics: Mapping[str, Any]) -> None:
    """Rewrite metrics.json with ``metrics`` and a fresh ``updated_at``."""
    if metrics["status"] not in STATUSES:
        raise ValueError(f"status={metrics['status']!r} is not one of {STATUSES}")
    atomic_write_json(path, {**metrics, "updated_at": now_iso()})
