"""What a trial reports: TensorBoard scalars in its run dir (``hpcsweep.files.tb_runs``) and ``metrics.json``.

Loggers follow torchtitan: a no-op base, a small TensorBoard logger, and ``build_logger`` that picks
one by a pure "which rank logs" rule. Tags are fixed (``TAGS``) so sweeps compare across trials;
``perf/mfu`` is logged only where the GPU's peak is known (:func:`peak_flops`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpcsweep.model.ignore_index import IGNORE_INDEX

TAGS = ("train/loss", "val/loss", "val/accuracy", "train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/mfu")
# The step-time breakdown's (hpcsweep.train.observe.step_timer).
TAGS += ("time/data_pct", "time/compute_pct", "time/optimizer_pct", "time/checkpoint_pct", "time/logging_pct", "mem/peak_gb")


@dataclass(frozen=True)
class GpuPeak:
    """Dense peak FLOP/s of one GPU per math mode, from NVIDIA's datasheets.

    The datasheets print tensor-core figures "with sparsity" (2:4 structured sparsity); dense
    training gets half of those, which is what is stored here.
    """

    fp32: float
    """Plain FP32 on the CUDA cores."""
    tf32: float
    """FP32 matmuls on the tensor cores in TF32 (when ``torch.backends.cuda.matmul.allow_tf32``)."""
    half: float
    """bf16 and fp16 on the tensor cores."""


# A100 SXM4 and PCIe, 40 and 80 GB: FP32 19.5 TF; TF32 312 TF and BF16/FP16 624 TF with sparsity.
# Source: NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/a100/
_A100 = GpuPeak(fp32=19.5e12, tf32=156e12, half=312e12)
# H100 PCIe: FP32 51 TF; TF32 756 TF and BF16/FP16 1,513 TF with sparsity.
# Source: NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/
_H100_PCIE = GpuPeak(fp32=51e12, tf32=378e12, half=756e12)
# H100 SXM5 and H200 SXM (the same GH100 compute at the same clocks; the H200 adds memory):
# FP32 67 TF; TF32 989 TF and BF16/FP16 1,979 TF with sparsity.
# Sources: the H100 datasheet above; NVIDIA H200 Tensor Core GPU datasheet,
# https://www.nvidia.com/en-us/data-center/h200/
_HOPPER_SXM = GpuPeak(fp32=67e12, tf32=494.5e12, half=989e12)
GPU_PEAKS: tuple[tuple[re.Pattern[str], GpuPeak], ...] = (
    (re.compile(r"\bA100\b"), _A100),
    (re.compile(r"\bH100\b.*\bPCIe\b", re.IGNORECASE), _H100_PCIE),
    # "NVIDIA H100 80GB HBM3" is the SXM part; NVL parts have lower clocks and are not listed.
    (re.compile(r"\bH100\b(?!.*\b(PCIe|NVL)\b)", re.IGNORECASE), _HOPPER_SXM),
    # "NVIDIA H200" is the SXM part; "NVIDIA H200 NVL" (lower clocks) and GH200 are not listed.
    (re.compile(r"\bH200\b(?!.*\bNVL\b)"), _HOPPER_SXM),
)
"""``torch.cuda.get_device_name()`` pattern -> peaks; the first match wins. Keyed by name, not
compute capability: H100 PCIe, H100 SXM, H100 NVL and H200 all report 9.0 at different peaks."""


def peak_flops(device_name: str | None, precision: str, tf32: bool = False) -> float | None:
    """Per-worker peak FLOP/s used for MFU, or None where there is no honest reference.

    ``device_name`` is ``torch.cuda.get_device_name()`` (None off CUDA: a CPU has no peak worth
    dividing by), ``precision`` the resolved precision (``fp32``, ``bf16``, ``fp16``; see
    ``hpcsweep.train.gpu_choices``), ``tf32`` whether fp32 matmuls run in TF32. An unknown GPU
    gives None rather than a guess. Under bf16/fp16 autocast the matmuls, which hold nearly all
    the FLOPs, run at the half-precision peak.
    """
    if device_name is None:
        return None
    peak = next((peak for pattern, peak in GPU_PEAKS if pattern.search(device_name)), None)
    if peak is None:
        return None
    if precision == "fp32":
        return peak.tf32 if tf32 else peak.fp32
    return peak.half


def logging_rank(world_size: int) -> int:
    """The one rank that writes TensorBoard events and metrics.json."""
    del world_size  # always rank 0: it holds the reduced loss and writes the checkpoints too
    return 0


def mfu(tokens_per_s: float, flops_per_token: float, world_size: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the peak of all workers (None without a peak)."""
    if peak is None:
        return None
    return tokens_per_s * flops_per_token / (peak * world_size)


class Logger:
    """Logs nothing; the logger of every rank but the logging rank."""

    def log(self, metrics: Mapping[str, float | None], step: int) -> None:
        """Record scalars ``{tag: value}`` at ``step``; a None value (not measured here) is left out."""

    def finish(self, status: str, summary: Mapping[str, Any]) -> None:
        """The trial's run ends with metrics.json's ``status`` and fields (``running``: it stopped
        to be requeued or resumed, and will go on)."""

    def report_fields(self) -> dict[str, Any]:
        """What metrics.json says of this logger (a tracker's run id, whether it failed)."""
        return {}

    def close(self) -> None:
        """Flush and release resources."""


class TensorBoardLogger(Logger):
    """Scalars as TensorBoard events under ``log_dir``."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import (
            SummaryWriter,  # imported here: slow, and rank 0 only
        )

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: Mapping[str, float | None], step: int) -> None:
        for tag, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()




def accuracy_counts(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[correct, counted]`` (float64) next-token predictions of ``logits`` against ``targets``; a
    target of ``IGNORE_INDEX`` (no loss taken there, as chat data's prompt tokens) is not counted."""
    counted = targets != IGNORE_INDEX
    correct = (logits.argmax(dim=-1) == targets) & counted
    return torch.stack([correct.sum(), counted.sum()]).to(torch.float64)


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


