"""What the model is told so that the samples of a packed row never attend to each other, on every kernel.

A packed row's position ids restart at 0 at each sample (``hpcsweep.train.data.packing``; the row's padding
is one more run from 0), so ``segments`` numbers each position's sample. From them hpcsweep itself
tells the attention where the samples end, never leaving it to transformers' guess from the position
ids (``masking_utils.find_packed_sequence_indices``), which it makes only when no KV cache is in play:
every published DeepSeek, Qwen and Llama folder says ``use_cache: true``, and under it the samples of
a row attended to each other (a packed sample's logits 0.22 off its own, eager; 0.26, sdpa). The memory
plan counts each mask (``hpcsweep.memory_plan.plan.mask_entry_bytes``).

- ``flash_attention_2`` (and 3): the cumulative lengths of every sample of the whole batch, its rows
  laid end to end, as TRL's padding-free collator gives them (``cu_seq_lens_q``/``_k``,
  ``max_length_q``/``_k``). transformers then runs the variable-length kernel at any batch size; from
  position ids alone it does so only for a batch of one row (``_is_packed_sequence``).
- ``sdpa``: a boolean ``B x 1 x T x T`` mask, causal within each sample (True: attend). An explicit
  mask rules out SDPA's flash backend; the memory-efficient one takes it.
- ``eager``: the same mask as an additive float one (0, or the dtype's minimum), as transformers'
  ``eager_mask`` builds it, in the model's dtype.
- A model whose own code builds its mask (a folder's ``auto_map``: DeepSeek-MoE's
  ``_prepare_4d_causal_attention_mask``): the mask as 1 and 0 in the model's dtype, which that code
  inverts into its additive form. Its own flash path reads only a padding mask, so packing runs it
  eager (``hpcsweep.train.gpu_choices.resolve_attention``).

Every forward of training and evaluation also says ``use_cache=False``: a cache would be built and
thrown away, and under transformers' own masking it is what turned the isolation off.
"""

from __future__ import annotations

from typing import Any

import torch

FLASH_KERNELS = ("flash_attention_2", "flash_attention_3")
"""Kernels that take variable-length sequences instead of a mask."""


def segments(position_ids: torch.Tensor) -> torch.Tensor:
    """Each position's sample within its row, ``B x T`` (0, 1, ...): a new one wherever a position id is 0."""
    return (position_ids == 0).cumsum(dim=-1)


def sample_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """``B x 1 x T x T`` booleans: query ``i`` may read key ``j`` when both hold the same sample and ``j <= i``."""
    seg = segments(position_ids)
    length = position_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    return ((seg[:, :, None] == seg[:, None, :]) & causal)[:, None]


def cumulative_lengths(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The start of every sample of the batch with its rows laid end to end, and the batch's total
    (int32, ``samples + 1`` entries, flash-attention's ``cu_seqlens``), and the longest sample."""
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    bounds = torch.cat([starts, torch.tensor([flat.numel()], device=flat.device)])
    return bounds.to(torch.int32), int(bounds.diff().max())


def forward_kwargs(position_ids: torch.Tensor | None, kernel: str, *, own_code: bool, dtype: torch.dtype,
                   device: torch.device) -> dict[str, Any]:
    """What a training or evaluation forward passes besides ``input_ids`` and ``position_ids``, for rows
    whose ``position_ids`` (None: one sequence a row) restart at each sample; ``kernel`` is the resolved
    ``attn_implementation``, ``own_code`` whether the model's own code builds its mask, ``dtype`` its
    weights' dtype. ``position_ids`` may be on the CPU: flash's lengths are read there, with no device sync."""
    kwargs: dict[str, Any] = {"use_cache": False}
    if position_ids is None:
        return kwargs
    if kernel in FLASH_KERNELS and not own_code:
        cu_seq_lens, longest = cumulative_lengths(position_ids.cpu())
        cu_seq_lens = cu_seq_lens.to(device)
        return {**kwargs, "cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens,
                "max_length_q": longest, "max_length_k": longest}
    allowed = sample_mask(position_ids.to(device))
    if own_code:
        return {**kwargs, "attention_mask": allowed.to(dtype)}
    if kernel == "eager":
        blocked = torch.zeros(allowed.shape, dtype=dtype, device=device)
        return {**kwargs, "attention_mask": blocked.masked_fill_(~allowed, torch.finfo(dtype).min)}
    return {**kwargs, "attention_mask": allowed}

