"""What one micro-batch hands the model and the loss, whatever the data kind."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcsweep.model.ignore_index import IGNORE_INDEX


@dataclass(frozen=True)
class Batch:
    """One micro-batch: inputs, next-token targets (``IGNORE_INDEX``: no loss), and the position ids of packed
    rows (None: ``0 .. seq_len - 1`` in every row)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    position_ids: torch.Tensor | None
    loss_tokens: int
    """Targets that take the loss."""
    real: torch.Tensor | None = None
    """True where a position holds a sample's token, False on padding (None: every position does)."""
    answers: torch.Tensor | None = None
    """Preference rows (``hpcsweep.train.data.pairs``): which answer each target belongs to, pair ``p``'s chosen
    ``2p`` and rejected ``2p + 1`` (``p`` counted within the micro-batch), -1 outside the answers; None: not pairs."""
    pairs: int = 0
    reference: torch.Tensor | None = None
    """Preference rows of a full fine-tuning trial: each answer's reference log-probability, computed once by the
    preparation job (``hpcsweep.prepare.reference_logps``), in ``answers``' numbering; None: none precomputed."""
    """Preference rows: the pairs whose answers they hold (``loss_tokens`` counts them too: DPO's loss is a mean
    over pairs)."""

    def to(self, device: torch.device) -> Batch:
        """The same batch on ``device``."""
        def moved(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device)

        return Batch(self.inputs.to(device), self.targets.to(device), moved(self.position_ids), self.loss_tokens,
                     moved(self.real), moved(self.answers), self.pairs, moved(self.reference))
