"""Each answer's summed log-probability from the logits of rows that may pack several samples.

DPO compares answers by the summed log-probability of their tokens. A row may pack several samples (a prompt with
its chosen answer, the prompt with its rejected one, the next pair's, ...), kept apart by the attention; here each
answer token says which answer it belongs to (``segment_ids``), and the log-probabilities of an answer's tokens
are summed into its entry, wherever in the batch they lie. Tokens outside an answer (prompts, padding) take
nothing and get no gradient.

Only the answer tokens' rows of the logits are read, ``chunk_tokens`` at a time: each chunk is upcast to fp32 (or
kept in fp64), its log-softmax taken by ``F.cross_entropy`` and reduced to one number a token, then freed; nothing
fp32 of the vocabulary's size is saved for backward. Backward recomputes each chunk's cross-entropy from the saved
logits with PyTorch's own kernels and writes its gradient into the logits' gradient (zero outside the answers).
What it holds, as ``hpcsweep.train.loss`` holds for the next-token loss: the logits and their gradient in their
own dtype, plus, while a chunk is worked on, its rows copied (``e x chunk_tokens x V`` bytes) and about
``3 x 4 x chunk_tokens x V`` bytes of fp32 work (the upcast, its log-softmax and its gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class AnswerLogps:
    """Per answer: the summed log-probability of its tokens (fp32, or fp64 from fp64 logits) and their count."""

    logps: torch.Tensor
    tokens: torch.Tensor


def answer_logps(logits: torch.Tensor, targets: torch.Tensor, answer_mask: torch.Tensor, segment_ids: torch.Tensor,
                 *, chunk_tokens: int, answers: int | None = None) -> AnswerLogps:
    """The summed log-probability of each answer's tokens, and their count.

    ``logits`` is ``[..., V]``, the logits at each position for the token ``targets`` (``[...]``) holds there
    (shifted already: position ``t``'s logits predict ``targets[t]``). ``answer_mask`` (``[...]``, bool) is true
    where that target is an answer's token, and ``segment_ids`` (``[...]``, integers) says there which answer,
    from 0 to ``answers - 1`` (elsewhere its value is not read). ``answers``: how many there are; None: one
    more than the largest id (read from the device). ``chunk_tokens``: the answer tokens whose fp32 work
    exists at once (0: all of them; the trainer passes ``trainer.loss_chunk_tokens`` as resolved for it).
    """
    if not (logits.shape[:-1] == targets.shape == answer_mask.shape == segment_ids.shape):
        raise ValueError(f"logits {tuple(logits.shape)}, targets {tuple(targets.shape)}, answer_mask "
                         f"{tuple(answer_mask.shape)} and segment_ids {tuple(segment_ids.shape)} differ before the "
                         "vocabulary")
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens={chunk_tokens}: allowed are 0 (one chunk) or a number of tokens >= 1")
    rows = answer_mask.flatten().nonzero().squeeze(1)
    token_logps = _AnswerTokenLogps.apply(logits.flatten(0, -2), targets.flatten(), rows, chunk_tokens)
    return _summed(token_logps, segment_ids.flatten()[rows].long(), answers)


def linear_answer_logps(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        targets: torch.Tensor, answer_mask: torch.Tensor, segment_ids: torch.Tensor, *,
                        chunk_tokens: int, answers: int | None = None) -> AnswerLogps:
    """``answer_logps`` of the logits ``F.linear(hidden, weight, bias)`` (``hidden`` ``[..., H]``), taken at the LM
    head from its input as ``hpcsweep.train.head_loss`` takes the next-token loss: only the answer tokens' hidden
    states are read, and each chunk's logits (``chunk_tokens`` answer tokens) are made, reduced to one number a
    token and freed; with gradients, ``torch.utils.checkpoint`` makes them again in backward. Equal to
    ``answer_logps(F.linear(hidden, weight, bias), ...)``, gradients included, with no logits of the batch."""
    if hidden.shape[:-1] != targets.shape or not (targets.shape == answer_mask.shape == segment_ids.shape):
        raise ValueError(f"hidden {tuple(hidden.shape)}, targets {tuple(targets.shape)}, answer_mask "
                         f"{tuple(answer_mask.shape)} and segment_ids {tuple(segment_ids.shape)} differ before the "
                         "hidden size")
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens={chunk_tokens}: allowed are 0 (one chunk) or a number of tokens >= 1")
    rows = answer_mask.flatten().nonzero().squeeze(1)
    picked, picked_targets = hidden.flatten(0, -2).index_select(0, rows), targets.flatten()[rows]
    parts = []
    for start, end in _bounds(len(rows), chunk_tokens):
        args = (picked[start:end], weight, bias, picked_targets[start:end])
        parts.append(checkpoint(_chunk_token_logps, *args, use_reentrant=False) if torch.is_grad_enabled()
                     else _chunk_token_logps(*args))
    token_logps = torch.cat(parts) if parts else picked.new_zeros(0, dtype=torch.float32)
    return _summed(token_logps, segment_ids.flatten()[rows].long(), answers)


def _chunk_token_logps(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       targets: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)
    return -F.cross_entropy(logits.to(_work_dtype(logits)), targets, reduction="none")


def _summed(token_logps: torch.Tensor, segments: torch.Tensor, answers: int | None) -> AnswerLogps:
    """Each answer's sum of ``token_logps`` (the answer of each is ``segments``'), and its count of tokens."""
    count = (int(segments.max()) + 1 if len(segments) else 0) if answers is None else answers
    summed = torch.zeros(count, dtype=token_logps.dtype, device=token_logps.device).index_add(0, segments, token_logps)
    tokens = torch.zeros(count, dtype=torch.long, device=token_logps.device).index_add(
        0, segments, torch.ones_like(segments))
    return AnswerLogps(summed, tokens)


def _bounds(tokens: int, chunk_tokens: int) -> list[tuple[int, int]]:
    step = chunk_tokens if 0 < chunk_tokens < tokens else max(tokens, 1)
    return [(start, min(start + step, tokens)) for start in range(0, tokens, step)]


def _work_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)


class _AnswerTokenLogps(torch.autograd.Function):
    """The log-probability of the target at each of ``rows`` of ``logits`` (``[N, V]``), a chunk at a time;
    backward recomputes each chunk (nothing of the vocabulary's size in fp32 is saved)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor,
                chunk_tokens: int) -> torch.Tensor:
        dtype = _work_dtype(logits)
        out = torch.empty(len(rows), dtype=dtype, device=logits.device)
        bounds = _bounds(len(rows), chunk_tokens)
        for start, end in bounds:
            picked = rows[start:end]
            out[start:end] = -F.cross_entropy(logits.index_select(0, picked).to(dtype), targets[picked],
                                              reduction="none")
        ctx.save_for_backward(logits, targets, rows)
        ctx.bounds = bounds
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        logits, targets, rows = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        grad = torch.zeros_like(logits)
        dtype = _work_dtype(logits)
        for start, end in ctx.bounds:
            picked = rows[start:end]
            # The chunk's own cross-entropy backward, recomputed with PyTorch's kernels (as hpcsweep.train.loss
            # does): the log-probability is minus the cross-entropy, so its gradient is minus grad_out.
            with torch.enable_grad():
                chunk = logits.index_select(0, picked).detach().requires_grad_()
                nll = F.cross_entropy(chunk.to(dtype), targets[picked], reduction="none")
                (work,) = torch.autograd.grad(nll, chunk, grad_outputs=-grad_out[start:end].to(nll.dtype))
            grad.index_copy_(0, picked, work)
            del work, chunk  # before the next chunk's: one chunk of fp32 work at a time
        return grad, None, None, None
