"""How many tokens the loss takes at a time: ``trainer.loss_chunk_tokens``, resolved once for the plan and the trainer.

The loss (``hpcsweep.train.head_loss`` at the LM head, ``hpcsweep.train.loss`` on the logits) makes the
fp32 logits of ``chunk`` tokens at a time. A setting of ``trainer.loss_chunk_tokens`` is taken as it is
(0: one chunk). Its default, null (auto), resolves here, from the device and the sizes alone, so the
memory plan counts the chunk that will run:

- **CPU**: :data:`CPU_CHUNK_TOKENS` (256). Measured (``benchmarks/loss_chunk.py``, benchmarks/README.md
  "loss chunk"): the head's forward and backward on one thread, 128 to the whole batch at 32k, 102k and
  152k vocabularies: 128 slower everywhere, 256 the fastest at 32k, larger chunks 3-13 % faster at
  102k-152k; no chunk beat 256 at every shape, so the default stayed.
- **CUDA**: Liger's fused linear cross-entropy rule: a chunk's logits about as large as the hidden
  states they come from, ``next_power_of_two(ceil(tokens / ceil(vocab / hidden)))`` rows; at least
  :data:`CUDA_MIN_CHUNK_TOKENS` rows, since every chunk reads the head's whole weight and a matmul of
  fewer rows is bound by that read, not by the tensor cores; and at most what keeps one chunk's fp32
  logits within :data:`CUDA_CHUNK_LOGITS_BUDGET_BYTES` (a power of two; this bound wins over the floor).
  Not measured on a GPU yet: ``benchmarks/gpu_check.py`` runs the chunk this rule gives.

Without the hidden size (the loss on logits that already exist, where no matmul is chunked) the budget
alone bounds the CUDA chunk. Pure: no torch, so the login node plans with it.
"""

from __future__ import annotations

CPU_CHUNK_TOKENS = 256
"""``trainer.loss_chunk_tokens=null`` on CPU (see the module docstring for the measurement)."""
CUDA_MIN_CHUNK_TOKENS = 512
"""The fewest rows a CUDA chunk gets from the rule: each chunk's matmuls read the head's whole weight
(V x H in bf16) for ``2 x rows x V x H`` FLOPs, ``rows`` FLOPs a byte, and an H100's bf16 tensor cores
(989 TFLOP/s) over its memory (3.35 TB/s) need about 300 to be busy."""
CUDA_CHUNK_LOGITS_BUDGET_BYTES = 512 * 2**20
"""The most one CUDA chunk's fp32 logits may take (4 x rows x V bytes): the loss then holds about four
times that (``hpcsweep.memory_plan.plan.loss_bytes``: 16 B a vocabulary entry a token in bf16), 2 GiB."""
KEY = "trainer.loss_chunk_tokens"


def _next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _power_of_two_at_most(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def cuda_chunk_tokens(vocab_size: int, hidden_size: int | None, tokens: int) -> int:
    """The CUDA rule of the module docstring: Liger's rows, at least :data:`CUDA_MIN_CHUNK_TOKENS`, at most
    the power of two that keeps one chunk's fp32 logits within :data:`CUDA_CHUNK_LOGITS_BUDGET_BYTES`."""
    ceiling = _power_of_two_at_most(CUDA_CHUNK_LOGITS_BUDGET_BYTES // (4 * vocab_size))
    if hidden_size is None:
        return ceiling
    growth = -(-vocab_size // hidden_size)  # how many times larger than its hidden states a token's logits are
    liger = _next_power_of_two(-(-tokens // growth))
    return min(max(liger, CUDA_MIN_CHUNK_TOKENS), ceiling)


def loss_chunk_tokens(setting: int | None, device_type: str, vocab_size: int, hidden_size: int | None,
                      tokens: int) -> int:
    """The tokens a chunk of the loss takes (0: one chunk), for ``tokens`` tokens of a ``vocab_size``
    vocabulary coming from ``hidden_size`` hidden states (None: the logits already exist) on
    ``device_type`` (``cuda``; anything else is planned as the CPU).

    ``setting`` is ``trainer.loss_chunk_tokens``: an integer >= 0 is taken as it is, None (auto) resolves
    by the module docstring's rule. ``ValueError`` names the key for anything else."""
    if setting is not None:
        if isinstance(setting, bool) or not isinstance(setting, int) or setting < 0:
            raise ValueError(f"{KEY}={setting!r} is not allowed: null (auto: chosen for the device and the model's "
                             "sizes) or an integer >= 0 (tokens per chunk of the loss; 0: one chunk)")
        return setting
    if device_type == "cuda":
        return cuda_chunk_tokens(vocab_size, hidden_size, tokens)
    return CPU_CHUNK_TOKENS
