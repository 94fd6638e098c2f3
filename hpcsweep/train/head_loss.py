"""The training loss taken at the LM head, a chunk of tokens at a time: no logits tensor of the whole batch.

``hpcsweep.train.loss`` never holds fp32 logits of the whole vocabulary, but it receives the head's
logits of every token in the compute dtype: at DeepSeek's 129k vocabulary and 8 x 4096 tokens, 8.5 GB
in bf16. Here the head computes the loss itself from its input, the hidden states, for
``trainer.loss_chunk_tokens`` tokens at a time (null: resolved per batch for the device, the vocabulary
and the hidden size by ``hpcsweep.memory_plan.loss_chunk``, as the memory plan resolves it): each
chunk's logits are made, upcast, reduced to their
summed cross-entropy and freed (``torch.utils.checkpoint``: backward makes them again, with the same
kernels and autocast as the forward, so the gradients are PyTorch's own per chunk). The loss holds
one chunk's work at a time; the price is the head's matmul once more in backward (a third more of the
head's FLOPs, a few per cent of a step).

On CUDA a fused linear cross-entropy from a maintained package does the same in one kernel per chunk,
without the recomputation: Liger's (``liger-kernel``) or Apple's cut-cross-entropy
(``cut-cross-entropy``), when installed (``trainer.loss_kernel``: ``auto`` takes them in that order).

The loss is taken inside the head's own forward, so DDP and FSDP2 see an ordinary forward: FSDP2's
hooks have gathered the head's weight, and DDP finds every parameter the loss used from the model's
output, which carries the loss in place of the logits (``[1, 1, 1]``). Validation takes its loss and
next-token accuracy at the head too (``scoring``), a chunk at a time and without backward, so an
evaluation never holds more than a training step: the memory plan counts the step alone. Otherwise
(neither entered) the head is the plain linear layer: task scores, generation and export get logits
as before. Architectures that change the logits after the head keep the loss on the logits
(``hpcsweep.model.head``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from hpcsweep.config import TrainerConfig
from hpcsweep.memory_plan.loss_chunk import loss_chunk_tokens
from hpcsweep.model.head import logits_are_the_heads
from hpcsweep.model.ignore_index import IGNORE_INDEX
from hpcsweep.train.loss import chunk_bounds
from hpcsweep.train.preference.answer_logps import AnswerLogps, linear_answer_logps
from hpcsweep.train.trackers.metrics import accuracy_counts

LOSS_KERNELS: tuple[str, ...] = typing.get_args(typing.get_type_hints(TrainerConfig)["loss_kernel"])
"""``trainer.loss_kernel`` values, as the config declares them: ``torch`` is this module's chunks; the
fused ones need CUDA and their package."""
KERNEL_PACKAGES = {"liger": "liger_kernel", "cut_cross_entropy": "cut_cross_entropy"}
"""The importable package each fused kernel comes from (pip: ``liger-kernel``, ``cut-cross-entropy``)."""
LOGITS = "logits"
"""The choice where the head cannot take the loss: ``hpcsweep.train.loss`` on the model's logits."""


def installed_kernels() -> frozenset[str]:
    """The fused kernels whose package is importable here."""
    return frozenset(name for name, package in KERNEL_PACKAGES.items() if importlib.util.find_spec(package))


def choose_kernel(setting: str, device_type: str, head_takes_loss: bool, installed: frozenset[str]) -> str:
    """What computes the training loss: ``liger``, ``cut_cross_entropy``, ``torch`` or ``logits``.

    ``auto``: a fused kernel on CUDA when one is installed (Liger first), else ``torch``; ``logits``
    when the model's logits are not its head's output (``head_takes_loss`` false). A fused kernel
    named outright must be usable, or ``ValueError`` names the key and what is missing.
    """
    if setting not in LOSS_KERNELS:
        raise ValueError(f"trainer.loss_kernel={setting!r} is not allowed: one of {', '.join(LOSS_KERNELS)}")
    if setting in KERNEL_PACKAGES:
        missing = [why for why, bad in (
            (f"a CUDA device (this trial runs on {device_type})", device_type != "cuda"),
            (f"the {KERNEL_PACKAGES[setting]} package (pip install {KERNEL_PACKAGES[setting].replace('_', '-')})",
             setting not in installed),
            ("a model whose logits are its LM head's output (hpcsweep.model.head)", not head_takes_loss),
        ) if bad]
        if missing:
            raise ValueError(f"trainer.loss_kernel={setting} is not allowed here: it needs {' and '.join(missing)}; "
                             "trainer.loss_kernel=auto picks what this trial can run")
        return setting
    if not head_takes_loss:
        return LOGITS
    if setting == "auto" and device_type == "cuda":
        for name in KERNEL_PACKAGES:
            if name in installed:
                return name
    return "torch"


def _token_rows(hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``hidden`` as one row per token and ``targets`` flat; ``ValueError`` when their token shapes differ."""
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden states {tuple(hidden.shape)} and targets {tuple(targets.shape)} differ before the "
                         "hidden size")
    return hidden.flatten(0, -2), targets.flatten()


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    targets: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)
    return F.cross_entropy(logits.float(), targets, reduction="sum", ignore_index=IGNORE_INDEX)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    """Mean cross-entropy of ``F.linear(hidden, weight, bias)`` (in fp32) against ``targets``, over the
    targets that are not :data:`IGNORE_INDEX`, ``chunk_tokens`` tokens at a time (0: one chunk).

    Equal to ``F.cross_entropy(F.linear(hidden, weight, bias).float().flatten(0, -2), targets.flatten())``
    to fp32 rounding, gradients included; only one chunk's logits exist at a time, in forward and backward."""
    hidden, targets = _token_rows(hidden, targets)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start, end in chunk_bounds(hidden.shape[0], chunk_tokens):
        total = total + checkpoint(_chunk_loss_sum, hidden[start:end], weight, bias, targets[start:end],
                                   use_reentrant=False)
    return total / (targets != IGNORE_INDEX).sum()


@torch.no_grad()
def linear_loss_and_accuracy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                             targets: torch.Tensor, chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Without gradients: the mean cross-entropy of ``F.linear(hidden, weight, bias)`` (in fp32) against
    ``targets``, and its next-token ``[correct, counted]`` (``accuracy_counts``), ``chunk_tokens``
    tokens at a time (0: one chunk). What the logits of the whole batch would give, with one chunk's
    logits at a time."""
    hidden, targets = _token_rows(hidden, targets)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    counts = torch.zeros(2, dtype=torch.float64, device=hidden.device)
    for start, end in chunk_bounds(hidden.shape[0], chunk_tokens):
        logits, chunk_targets = F.linear(hidden[start:end], weight, bias), targets[start:end]
        total += F.cross_entropy(logits.float(), chunk_targets, reduction="sum", ignore_index=IGNORE_INDEX)
        counts += accuracy_counts(logits, chunk_targets)
        del logits
    return total / (targets != IGNORE_INDEX).sum(), counts


def fused_cross_entropy(kernel: str, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        targets: torch.Tensor) -> torch.Tensor:
    """The same mean loss by a fused CUDA kernel (``liger`` or ``cut_cross_entropy``).

    Both take the hidden states and the weight in one dtype: under autocast, the autocast dtype, as
    the head's own matmul would run; they upcast the logits to fp32 inside, chunk by chunk."""
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else weight.dtype
    with torch.autocast("cuda", enabled=False):
        hidden2d = hidden.flatten(0, -2).to(dtype)
        weight = weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
        if kernel == "liger":
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="mean")(
                weight, hidden2d, targets.flatten(), bias)
        from cut_cross_entropy import linear_cross_entropy as cce

        # filter_eps=None: every gradient entry computed (its default skips those under a threshold).
        return cce(hidden2d, weight, targets.flatten(), ignore_index=IGNORE_INDEX, reduction="mean", shift=False,
                   filter_eps=None).float()


@dataclass
class _Pending:
    targets: torch.Tensor
    scoring: bool = False
    loss: torch.Tensor | None = None
    accuracy_counts: torch.Tensor | None = None
    """``[correct, counted]`` next-token predictions; scoring only."""
    answers: tuple[torch.Tensor, int] | None = None
    """Preference rows: each target's answer (``Batch.answers``) and how many answers there are; the head then
    gives each answer's log-probability (``logps``) instead of a loss."""
    logps: AnswerLogps | None = None


class HeadLoss:
    """The head of one model, made to take the loss while ``taking`` is entered.

    ``chunk_tokens``: ``trainer.loss_chunk_tokens`` (None: auto, resolved for each batch's tokens on
    ``device_type`` by ``hpcsweep.memory_plan.loss_chunk.loss_chunk_tokens``)."""

    def __init__(self, head: torch.nn.Linear, kernel: str, chunk_tokens: int | None, device_type: str = "cpu") -> None:
        self.head, self.kernel, self.chunk_tokens, self.device_type = head, kernel, chunk_tokens, device_type
        self._pending: _Pending | None = None
        plain_forward = head.forward
        outer = self

        def forward(module: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
            pending = outer._pending
            if pending is None or pending.loss is not None:
                return plain_forward(hidden)
            if pending.answers is not None:
                answer_ids, count = pending.answers
                pending.logps = linear_answer_logps(
                    hidden, module.weight, module.bias, pending.targets, answer_ids >= 0, answer_ids,
                    chunk_tokens=outer.chunk_for(pending.targets.numel()), answers=count)
                pending.loss = pending.logps.logps.sum()
            elif pending.scoring:
                pending.loss, pending.accuracy_counts = linear_loss_and_accuracy(
                    hidden, module.weight, module.bias, pending.targets, outer.chunk_for(pending.targets.numel()))
            else:
                pending.loss = outer._loss(hidden, module.weight, module.bias, pending.targets)
            # Stands in for the logits: DDP finds the parameters the loss used from the model's output.
            return pending.loss.reshape(1, 1, 1)

        # The instance's forward, so the module (and its name in the state dict) stays the model's own.
        head.forward = types.MethodType(forward, head)

    def chunk_for(self, tokens: int) -> int:
        """The tokens a chunk takes for a batch of ``tokens`` (0: one chunk): the setting, or its auto
        for this device and the head's sizes (as the memory plan counts it)."""
        return loss_chunk_tokens(self.chunk_tokens, self.device_type, self.head.out_features, self.head.in_features,
                                 tokens)

    def _loss(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              targets: torch.Tensor) -> torch.Tensor:
        if self.kernel == "torch":
            return linear_cross_entropy(hidden, weight, bias, targets, self.chunk_for(targets.numel()))
        return fused_cross_entropy(self.kernel, hidden, weight, bias, targets)

    @contextlib.contextmanager
    def taking(self, targets: torch.Tensor) -> Iterator[_Pending]:
        """Within: the head's next forward returns the training loss against ``targets`` (read
        ``.loss`` after)."""
        with self._pending_as(_Pending(targets)) as pending:
            yield pending

    @contextlib.contextmanager
    def scoring(self, targets: torch.Tensor) -> Iterator[_Pending]:
        """Within: the head's next forward takes the validation loss against ``targets`` and its
        next-token accuracy, without gradients and always by this module's chunks (read ``.loss`` and
        ``.accuracy_counts`` after)."""
        with self._pending_as(_Pending(targets, scoring=True)) as pending:
            yield pending

    @contextlib.contextmanager
    def answer_logps(self, targets: torch.Tensor, answers: torch.Tensor, count: int) -> Iterator[_Pending]:
        """Within: the head's next forward gives the summed log-probability of each of ``count`` answers
        (``hpcsweep.train.preference.answer_logps``; ``answers``: ``Batch.answers``), with gradients where they
        are enabled, always by this module's chunks (read ``.logps`` after)."""
        with self._pending_as(_Pending(targets, answers=(answers, count))) as pending:
            yield pending

    @contextlib.contextmanager
    def _pending_as(self, pending: _Pending) -> Iterator[_Pending]:
        self._pending = pending
        try:
            yield pending
        finally:
            self._pending = None


def attach(model: torch.nn.Module, setting: str, chunk_tokens: int | None, device_type: str,
           installed: frozenset[str] | None = None) -> HeadLoss | None:
    """The model's head made to take the training loss, or None when the loss must take the logits
    (``choose_kernel``): call before DDP or FSDP wraps the model. ``chunk_tokens``:
    ``trainer.loss_chunk_tokens``, None for auto (``HeadLoss``)."""
    head = model.get_output_embeddings()
    config: Mapping[str, Any] = model.config.to_dict()
    plain = type(head) is torch.nn.Linear and logits_are_the_heads(config.get("model_type", ""), config)
    kernel = choose_kernel(setting, device_type, plain, installed_kernels() if installed is None else installed)
    if kernel == LOGITS:
        return None
    if kernel == "cut_cross_entropy" and head.bias is not None:  # its kernel takes no bias
        kernel = "torch"
    return HeadLoss(head, kernel, chunk_tokens, device_type)
