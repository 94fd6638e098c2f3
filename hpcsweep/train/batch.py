"""What one micro-batch hands the model and the loss, whatever the data kind."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcsweep.train.packing import IGNORE


@dataclass(frozen=True)
class Batch:
    """One micro-batch: inputs, next-token targets (``IGNORE``: no loss), and the position ids of packed
    rows (None: ``0 .. seq_len - 1`` in every row)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    position_ids: torch.Tensor | None
    loss_tokens: int
    """Targets that take the loss."""

    def to(self, device: torch.device) -> Batch:
        """The same batch on ``device``."""
        positions = None if self.position_ids is None else self.position_ids.to(device)
        return Batch(self.inputs.to(device), self.targets.to(device), positions, self.loss_tokens)
