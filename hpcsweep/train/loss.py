"""The training loss: token cross-entropy in chunks, so the fp32 logits of the whole vocabulary never exist.

``F.cross_entropy(logits.float(), targets)`` holds, for B x T tokens of a V-word vocabulary, the
logits in the compute dtype, their fp32 copy, the fp32 log-softmax (saved for backward) and in
backward its fp32 gradient beside them: at DeepSeek's 129k vocabulary and 8 x 4096 tokens, 17 GB of
fp32 per tensor. :func:`chunked_cross_entropy` computes the same loss ``chunk_tokens`` rows at a time:
each chunk is upcast to fp32, log-softmax'd, reduced to its summed loss and freed. Backward recomputes
each chunk's cross-entropy from the saved logits with PyTorch's own kernels and writes the chunk's gradient (cast to the logits' dtype,
as autograd's cast back would) into the gradient of the logits. With ``overwrite_logits`` that
gradient is written over the logits themselves, chunk by chunk (each chunk read before it is
written), as Liger's cross-entropy does, so the loss adds no tensor of the logits' size at all.

What the loss holds, for the memory plan (``hpcsweep.memory_plan``): with ``overwrite_logits`` (the
trainer), ``e`` bytes per token per vocabulary entry (the logits in the compute dtype, ``e`` = 2 under
bf16/fp16 autocast, 4 in fp32; their gradient takes their place), plus, while a chunk is worked on,
about ``3 x 4 x chunk_tokens x V`` bytes of fp32 work (the upcast chunk, its log-softmax and its
gradient; in fp32 the upcast is the chunk itself, so two ``4 x chunk_tokens x V``). Without it, backward adds
one more ``e x V`` per token for the gradient. Outside the loss: DDP with ``find_unused_parameters``
(a model with one module per expert) clones every output at the end of its forward, so a second
``e x V`` per token lives for a moment there. The trainer uses this loss only where the LM head cannot
take it (``hpcsweep.train.head_loss``), in training and in evaluation. Measured: benchmarks/README.md, "loss".

Targets equal to ``IGNORE_INDEX`` (``hpcsweep.model.ignore_index``) take no loss: the loss is the mean over
the tokens that do, as ``F.cross_entropy``'s ``ignore_index`` has it (NaN when none does, as there).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hpcsweep.memory_plan.loss_chunk import loss_chunk_tokens
from hpcsweep.model.ignore_index import IGNORE_INDEX


def chunk_bounds(tokens: int, chunk_tokens: int) -> list[tuple[int, int]]:
    """``[start, end)`` rows of each chunk of ``tokens`` rows; ``chunk_tokens`` 0 (or >= ``tokens``): one."""
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens={chunk_tokens}: allowed are 0 (one chunk) or a number of tokens >= 1")
    step = chunk_tokens if 0 < chunk_tokens < tokens else max(tokens, 1)
    return [(start, min(start + step, tokens)) for start in range(0, tokens, step)]


def chunked_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, chunk_tokens: int | None, *, overwrite_logits: bool = False
) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` (``[..., V]``, any float dtype) against ``targets`` (``[...]``),
    in fp32, over the tokens whose target is not :data:`IGNORE_INDEX`, ``chunk_tokens`` tokens at a time
    (``trainer.loss_chunk_tokens``; None: auto, for the logits' device and vocabulary, as
    ``hpcsweep.memory_plan.loss_chunk.loss_chunk_tokens`` resolves it for logits that already exist).

    Equal to ``F.cross_entropy(logits.float().flatten(0, -2), targets.flatten())`` (to fp32 rounding),
    gradients included. ``overwrite_logits``: backward writes the gradient over ``logits``, so the
    caller must not read them after ``backward`` (a second backward through them raises).
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} differ before the vocabulary")
    chunk_tokens = loss_chunk_tokens(chunk_tokens, logits.device.type, logits.shape[-1], None, targets.numel())
    return _ChunkedCrossEntropy.apply(
        logits.flatten(0, -2), targets.flatten(), chunk_tokens, overwrite_logits
    )


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Forward sums each chunk's loss; backward recomputes each chunk's cross-entropy (nothing fp32 is saved)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, chunk_tokens: int, overwrite: bool) -> torch.Tensor:
        bounds = chunk_bounds(logits.shape[0], chunk_tokens)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start, end in bounds:
            total += F.cross_entropy(logits[start:end].float(), targets[start:end], reduction="sum",
                                     ignore_index=IGNORE_INDEX)
        count = (targets != IGNORE_INDEX).sum()
        ctx.save_for_backward(logits, targets, count)
        ctx.bounds, ctx.overwrite = bounds, overwrite
        return total / count

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        logits, targets, count = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        grad = logits if ctx.overwrite else torch.empty_like(logits)
        per_token = grad_loss.float() / count
        for start, end in ctx.bounds:
            chunk_targets = targets[start:end]
            # The chunk's own cross-entropy backward, recomputed: PyTorch's kernels, so the gradients are
            # F.cross_entropy's bit for bit (a hand-written softmax - one_hot differed in the last bits,
            # enough for an FSDP and a DDP trial of the same config to end with other weights).
            with torch.enable_grad():
                chunk = logits[start:end].detach().requires_grad_()
                summed = F.cross_entropy(chunk.float(), chunk_targets, reduction="sum", ignore_index=IGNORE_INDEX)
                (work,) = torch.autograd.grad(summed, chunk, grad_outputs=per_token)
            grad[start:end] = work
            del work  # before the next chunk's: one chunk of fp32 work at a time
        return grad, None, None, None
