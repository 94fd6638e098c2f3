"""``gpu_check``'s packing check: packed rows kept apart on the device's own attention kernels.

A Llama at its config class's defaults (``use_cache: true``, as published), sizes shrunk, runs a batch of
8 packed rows as the trainer runs it (``hpcsweep.train.data.sample_attention.forward_kwargs``); each sample's
logits must equal the same sample run alone, on every kernel the device has: eager and SDPA everywhere,
and on CUDA flash-attention 2 when ``flash_attn`` is installed (bf16, where the samples alone run the
same kernel). The largest difference of each kernel is printed against its tolerance.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hpcsweep.train.data import sample_attention
from hpcsweep.train.gpu_choices import flash_attention_available
from hpcsweep.train.data.packing import SampleRows

ROWS, SEQ_LEN, VOCAB = 8, 256, 512
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}
"""The largest |packed - alone| allowed: fp32 sums in another order; bf16 rounds each of its matmuls."""


def _samples(seed: int = 0) -> SampleRows:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 120, size=64)
    tokens = rng.integers(1, VOCAB, size=int(lengths.sum())).astype(np.uint16)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return SampleRows(tokens, None, starts, lengths.astype(np.int64), seq_len=SEQ_LEN, packing=True, seed=0,
                      split=0, pad_id=0)


def _model(kernel: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ_LEN)
    config._attn_implementation = kernel
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def packing_kernel_check(kernel: str, device: torch.device) -> dict[str, Any]:
    """The largest difference between a packed sample's logits and its own alone, for one kernel."""
    dtype = torch.bfloat16 if kernel.startswith("flash") else torch.float32
    model = _model(kernel, dtype, device)
    rows = _samples()
    batch = rows.batch(0, ROWS)
    position_ids = torch.from_numpy(batch.position_ids)
    kwargs = sample_attention.forward_kwargs(position_ids, kernel, own_code=False, dtype=dtype, device=device)
    worst = 0.0
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(batch.inputs).to(device), position_ids=position_ids.to(device),
                       **kwargs).logits.float()
        for r in range(ROWS):
            at = 0
            for sample in rows.row_samples(r).tolist():
                start, n = int(rows.starts[sample]), int(rows.lengths[sample])
                ids = torch.from_numpy(np.asarray(rows.tokens[start : start + n - 1], dtype=np.int64))[None]
                alone = model(input_ids=ids.to(device), use_cache=False).logits.float()[0]
                worst = max(worst, (logits[r, at : at + n - 1] - alone).abs().max().item())
                at += n - 1
    return {"kernel": kernel, "dtype": str(dtype).removeprefix("torch."), "max_abs_diff": worst,
            "tolerance": TOLERANCE[dtype], "failed": worst > TOLERANCE[dtype]}


def packing_check(device: torch.device) -> dict[str, Any]:
    """Every kernel of ``device``'s, checked; ``skipped`` says which could not run here, and why."""
    kernels = ["eager", "sdpa"]
    skipped = {}
    if device.type == "cuda" and flash_attention_available():
        kernels.append("flash_attention_2")
    else:
        skipped["flash_attention_2"] = "needs CUDA" if device.type != "cuda" else "flash_attn is not installed"
    results = [packing_kernel_check(kernel, device) for kernel in kernels]
    return {"kernels": results, "skipped": skipped, "failed": any(r["failed"] for r in results)}


def packing_lines(check: dict[str, Any]) -> list[str]:
    lines = [f"packing {r['kernel']} ({r['dtype']}): packed vs alone max |diff| {r['max_abs_diff']:.2e} "
             f"(tolerance {r['tolerance']:.0e}){'  FAIL' if r['failed'] else ''}" for r in check["kernels"]]
    return lines + [f"packing {kernel}: skipped ({why})" for kernel, why in check["skipped"].items()]
