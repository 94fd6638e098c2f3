"""Which tokens of a forward route a MoE balance: a sample's, never padding; and whose sample each one is."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcsweep.train.data.batch import Batch


@dataclass(frozen=True)
class RoutedTokens:
    """Which tokens of a forward are a sample's, and whose: only these route a balance (padding never does)."""

    real: torch.Tensor | None
    """``rows x seq_len`` booleans, False on padding; None: every token is a sample's."""
    sample: torch.Tensor
    """Each token's sample, flattened (``rows x seq_len``; numbered 0 .. ``samples - 1`` over the batch)."""
    samples: int


def routed_tokens(batch: Batch, device: torch.device) -> RoutedTokens:
    """The tokens of ``batch`` (on the CPU, where the count of samples is read without a device sync) that
    route, on ``device``: each packed sample is a sequence of its own (its position ids start at 0),
    each row of windows one sequence; a row's padding (``Batch.real`` False) routes nothing."""
    rows, length = batch.inputs.shape
    if batch.position_ids is None:
        sample, samples = torch.arange(rows).repeat_interleave(length), rows
    else:
        starts = (batch.position_ids == 0).flatten()
        sample, samples = starts.cumsum(0) - 1, int(starts.sum())
    real = None if batch.real is None else batch.real.to(device)
    return RoutedTokens(real, sample.to(device), samples)
