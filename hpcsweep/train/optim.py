"""Optimizer, learning-rate schedule, mixed precision and early stopping.

The schedule is a pure function ``lr_at(step)``; the LambdaLR that applies it keeps its position in
its state dict, so it resumes with the checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from hpcsweep.config import ModelConfig, TrainerConfig


def lr_at(step: int, peak_lr: float, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Linear warmup to ``peak_lr``, then cosine decay to ``peak_lr * min_lr_ratio`` at ``max_steps``."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)


def build_optimizer(model: torch.nn.Module, model_cfg: ModelConfig, cfg: TrainerConfig) -> torch.optim.Optimizer:
    """AdamW, Adam or SGD over all trainable parameters.

    Norms and other 1-d parameters are not decayed: decaying a norm gain towards 0 only hurts.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # foreach kernels: one fused launch over all tensors; bitwise deterministic on CPU.
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=model_cfg.lr, betas=tuple(cfg.betas), foreach=True)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(groups, lr=model_cfg.lr, betas=tuple(cfg.betas), foreach=True)
    return torch.optim.SGD(groups, lr=model_cfg.lr, momentum=cfg.momentum, foreach=True)


def build_scheduler(
    optimizer: torch.optim.Optimizer, model_cfg: ModelConfig, cfg: TrainerConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """The warmup + cosine schedule as a LambdaLR (a factor of ``model.lr``)."""

    def factor(step: int) -> float:
        return lr_at(step, 1.0, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast for ``bf16``/``fp16``; nothing for ``fp32``."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def build_grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that is active only for ``fp16`` (bf16 has fp32's exponent range)."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


@dataclass
class EarlyStopping:
    """Stop after ``patience`` evaluations without an improvement of at least ``min_delta``.

    ``mode="min"``: lower is better (a loss); ``"max"``: higher is better (an accuracy, a task
    score). ``patience=0`` never stops. The state is plain numbers, saved in every checkpoint.
    """

    patience: int
    min_delta: float
    mode: str = "min"
    best: float | None = None
    bad_evals: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(f"trainer.early_stop_mode={self.mode!r} is not allowed: one of 'min', 'max'")
        if self.best is None:
            self.best = math.inf if self.mode == "min" else -math.inf

    def improves(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by at least ``min_delta``."""
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, value: float) -> bool:
        """Record one evaluation of the watched metric; True when training should stop."""
        if self.improves(value):
            self.best, self.bad_evals = value, 0
        else:
            self.bad_evals += 1
            self.best = min(self.best, value) if self.mode == "min" else max(self.best, value)
        return self.patience > 0 and self.bad_evals >= self.patience

    def state_dict(self) -> dict[str, float | int]:
        return {"best": self.best, "bad_evals": self.bad_evals}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.best, self.bad_evals = float(state["best"]), int(state["bad_evals"])
