"""The CPU peak memory of one training step under each loss, for the loss's test and its benchmark.

A step's peak is the process's resident-set high-water mark (``VmHWM``) during the step, over its
resident set just before: Linux resets the mark on ``echo 5 > /proc/self/clear_refs``, so contenders
alternate in one process, each step measured on its own. While they run, glibc maps every allocation
of 1 MiB or more on its own and unmaps it when freed (``mallopt``), so the mark follows the live
tensors: by default freed blocks under 32 MiB stay in the heap and the next step reuses them unseen.
The errors left only lower a reading (a peak missed, retained memory reused), so each contender's
peak is the largest over its rounds.

    peaks = alternate_step_peaks(tiny_lm(vocab_size=32_000), batch=1, seq_len=512, rounds=2)
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from hpcsweep.train.head_loss import HeadLoss
from hpcsweep.train.loss import chunked_cross_entropy

LossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, str], torch.Tensor]
"""A contender: the loss of ``model`` on ``inputs`` against ``targets``, under ``precision``."""


def _logits(model: torch.nn.Module, inputs: torch.Tensor, precision: str) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        return model(input_ids=inputs).logits


def fp32_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss as the trainer computed it before the chunked one: fp32 logits of every token at once."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def unchunked_loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, precision: str) -> torch.Tensor:
    """The contender of ``fp32_cross_entropy`` on the model's logits."""
    return fp32_cross_entropy(_logits(model, inputs, precision), targets)


def chunked_loss(chunk_tokens: int) -> LossFn:
    """The loss on the model's logits in chunks (``hpcsweep.train.loss``, the gradient written over the logits)."""
    return lambda model, inputs, targets, precision: chunked_cross_entropy(
        _logits(model, inputs, precision), targets, chunk_tokens, overwrite_logits=True)


def head_loss(chunk_tokens: int) -> LossFn:
    """The trainer's loss: taken at the head, a chunk of logits at a time (``hpcsweep.train.head_loss``)."""
    heads: dict[int, HeadLoss] = {}

    def loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, precision: str) -> torch.Tensor:
        head = heads.setdefault(id(model), HeadLoss(model.lm_head, "torch", chunk_tokens))
        with head.taking(targets) as taken:
            _logits(model, inputs, precision)
        return taken.loss

    return loss


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's ``mallopt`` parameters (malloc.h)."""


@contextlib.contextmanager
def large_allocations_mapped() -> Iterator[None]:
    """Within: every allocation of 1 MiB or more is its own mapping, returned to the system when freed.

    After: glibc's thresholds as its dynamic mode ends up after a large free (32 MiB mapped, 64 MiB
    trimmed); setting them once switches the dynamic mode off for good."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 20)
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 64 << 20)


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    assert match, f"/proc/self/status has no {field}"
    return int(match.group(1))


def step_peak_bytes(step: Callable[[], None]) -> int:
    """How far the resident set rose above its level before ``step`` while ``step`` ran."""
    gc.collect()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    step()
    return (_status_kib("VmHWM") - before) * 1024


def tiny_lm(vocab_size: int, hidden_size: int = 32, layers: int = 1, seed: int = 0) -> torch.nn.Module:
    """A Llama of ``vocab_size`` words and almost nothing else: the logits dominate its step."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=False)
    return LlamaForCausalLM(config).train()


def training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                  targets: torch.Tensor, loss_fn: LossFn, precision: str = "fp32") -> float:
    """One optimizer step as the trainer takes it (``bf16``: under CPU autocast, bf16 logits); returns the loss."""
    loss = loss_fn(model, inputs, targets, precision)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def alternate_step_peaks(model: torch.nn.Module, *, batch: int, seq_len: int, rounds: int,
                         chunk_tokens: int = 1024, precision: str = "fp32") -> dict[str, dict[str, list[float]]]:
    """Per contender (``unchunked``, ``chunked`` logits, ``head``): each round's step peak (bytes), CPU
    seconds and loss.

    The contenders take turns on one model and optimizer; a first step of each, unmeasured, makes
    the optimizer's state and warms the allocator.
    """
    contenders = {"unchunked": unchunked_loss, "chunked": chunked_loss(chunk_tokens), "head": head_loss(chunk_tokens)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq_len + 1), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    results: dict[str, dict[str, list[float]]] = {name: {"peak_bytes": [], "cpu_s": [], "loss": []} for name in contenders}
    with large_allocations_mapped():
        for name, loss_fn in contenders.items():
            training_step(model, optimizer, inputs, targets, loss_fn, precision)
        for _ in range(rounds):
            for name, loss_fn in contenders.items():
                record = results[name]
                losses: list[float] = []
                start = time.process_time()
                record["peak_bytes"].append(step_peak_bytes(
                    lambda: losses.append(training_step(model, optimizer, inputs, targets, loss_fn, precision))))
                record["cpu_s"].append(time.process_time() - start)
                record["loss"].append(losses[0])
    return results
