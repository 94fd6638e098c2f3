"""``gpu_check``'s loss check: the loss taken at the LM head against the whole batch's logits.

On the device a trial trains on, in the precision it trains in (bf16 autocast on CUDA, fp32 on CPU):
the same loss and gradients (``trainer.loss_kernel=torch``, and each fused kernel that is installed),
and, on CUDA, the peak memory of one forward and backward of each (``torch.cuda.max_memory_allocated``
over the level before): the head's must stay below the whole logits' by at least one logits tensor in
the compute dtype. Also prints what ``trainer.loss_kernel=auto`` picks there. ``chunk_tokens=None``:
the chunk ``trainer.loss_chunk_tokens=null`` resolves to on the device (``hpcsweep.memory_plan.loss_chunk``:
on CUDA, Liger's rule within its floor and logits budget); on CUDA the torch chunks also run at 256
tokens (the CPU default) beside it, and every contender gets its median time of three runs after the first.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

from hpcsweep.memory_plan.loss_chunk import CPU_CHUNK_TOKENS, loss_chunk_tokens
from hpcsweep.train.head_loss import KERNEL_PACKAGES, choose_kernel, fused_cross_entropy, installed_kernels, \
    linear_cross_entropy


def _measured(device: torch.device, compute: Any) -> tuple[list[torch.Tensor], int | None]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    results = compute()
    if device.type != "cuda":
        return results, None
    torch.cuda.synchronize(device)
    return results, torch.cuda.max_memory_allocated(device) - before


def _median_seconds(device: torch.device, compute: Any, runs: int = 3) -> float:
    seconds = []
    for _ in range(runs):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        compute()
        torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def loss_check(device: torch.device, *, tokens: int, hidden: int, vocab: int,
               chunk_tokens: int | None) -> dict[str, Any]:
    """Each contender's loss, largest gradient difference from the whole logits', and peak bytes (and, on
    CUDA, median seconds of a forward and backward). ``chunk_tokens`` None: ``trainer.loss_chunk_tokens=null``'s."""
    auto_chunk = chunk_tokens is None
    chunk_tokens = loss_chunk_tokens(chunk_tokens, device.type, vocab, hidden, tokens)
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=generator).to(device).requires_grad_()
    weight = (torch.randn(vocab, hidden, generator=generator) / hidden**0.5).to(device).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=generator).to(device)
    bf16 = device.type == "cuda"

    def run(loss_fn: Any) -> list[torch.Tensor]:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn()
        return [loss.detach(), *torch.autograd.grad(loss, (h, weight))]

    contenders = {"logits": lambda: F.cross_entropy(F.linear(h, weight).float(), targets),
                  "torch": lambda: linear_cross_entropy(h, weight, None, targets, chunk_tokens)}
    if device.type == "cuda":
        if chunk_tokens != CPU_CHUNK_TOKENS:
            contenders[f"torch@{CPU_CHUNK_TOKENS}"] = lambda: linear_cross_entropy(h, weight, None, targets,
                                                                                   CPU_CHUNK_TOKENS)
        contenders.update({name: (lambda name=name: fused_cross_entropy(name, h, weight, None, targets))
                           for name in sorted(installed_kernels())})
    rows: dict[str, Any] = {}
    reference: list[torch.Tensor] | None = None
    for name, loss_fn in contenders.items():
        results, peak = _measured(device, lambda loss_fn=loss_fn: run(loss_fn))
        reference = reference or results
        rows[name] = {"loss": results[0].item(), "peak_bytes": peak,
                      "grad_diff": max(((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()
                                       for a, b in zip(results[1:], reference[1:]))}
        del results
        if device.type == "cuda":
            rows[name]["seconds"] = _median_seconds(device, lambda loss_fn=loss_fn: run(loss_fn))
    tolerance = 2e-2 if bf16 else 1e-5  # relative to the largest gradient entry: bf16 rounding of the products
    failed = [name for name, row in rows.items()
              if abs(row["loss"] - rows["logits"]["loss"]) > tolerance * abs(rows["logits"]["loss"])
              or row["grad_diff"] > tolerance]
    logits_bytes = tokens * vocab * (2 if bf16 else 4)
    if device.type == "cuda" and rows["torch"]["peak_bytes"] > rows["logits"]["peak_bytes"] - logits_bytes:
        failed.append("torch (peak memory)")
    return {"device": device.type, "tokens": tokens, "vocab": vocab, "chunk_tokens": chunk_tokens,
            "auto_chunk": auto_chunk, "auto": choose_kernel("auto", device.type, True, installed_kernels()),
            "not_installed": sorted(set(KERNEL_PACKAGES) - installed_kernels()), "rows": rows, "failed": failed}


def loss_line(check: dict[str, Any]) -> str:
    """One line: each contender's loss, gradient difference and peak, and what ``auto`` picks."""
    parts = []
    for name, row in check["rows"].items():
        peak = "" if row["peak_bytes"] is None else f", peak {row['peak_bytes'] / 1e9:.2f} GB"
        peak += f", {row['seconds'] * 1e3:.1f} ms" if "seconds" in row else ""
        parts.append(f"{name} {row['loss']:.4f} (grad diff {row['grad_diff']:.1e}{peak})")
    verdict = f"FAIL: {', '.join(check['failed'])}" if check["failed"] else "OK"
    missing = f"; not installed: {', '.join(check['not_installed'])}" if check["not_installed"] else ""
    auto = " (trainer.loss_chunk_tokens=null)" if check.get("auto_chunk") else ""
    return (f"loss at the head ({check['device']}, {check['tokens']} tokens, vocabulary {check['vocab']}, chunk "
            f"{check['chunk_tokens']}{auto}; trainer.loss_kernel=auto picks {check['auto']}{missing}): "
            + "; ".join(parts) + f" {verdict}")
