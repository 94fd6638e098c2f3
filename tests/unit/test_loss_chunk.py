"""``trainer.loss_chunk_tokens`` resolved for the device and the model's sizes, at the sizes users bring."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcsweep.memory_plan.loss_chunk import (
    CPU_CHUNK_TOKENS,
    CUDA_CHUNK_LOGITS_BUDGET_BYTES,
    CUDA_MIN_CHUNK_TOKENS,
    loss_chunk_tokens,
)

# (vocabulary, hidden size) of each model's config.json.
LLAMA_3 = (128_256, 4096)
DEEPSEEK_V3 = (129_280, 7168)
QWEN3 = (151_936, 4096)
DEEPSEEK_MOE_16B = (102_400, 2048)
MODELS = {"Llama 3 8B": LLAMA_3, "DeepSeek-V3": DEEPSEEK_V3, "Qwen3 8B": QWEN3, "DeepSeek-MoE-16B": DEEPSEEK_MOE_16B}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_chunk_set_in_the_config_is_taken_as_it_is(device):
    vocab, hidden = DEEPSEEK_V3
    assert loss_chunk_tokens(0, device, vocab, hidden, 32_768) == 0  # one chunk
    assert loss_chunk_tokens(96, device, vocab, hidden, 32_768) == 96
    assert loss_chunk_tokens(100_000, device, vocab, None, 32_768) == 100_000


@pytest.mark.parametrize("bad", [-1, 2.5, "256", True])
def test_anything_else_is_refused_naming_the_key_and_what_is_allowed(bad):
    with pytest.raises(ValueError, match=r"^trainer\.loss_chunk_tokens=.* is not allowed: null \(auto: chosen for the "
                                         r"device and the model's sizes\) or an integer >= 0"):
        loss_chunk_tokens(bad, "cpu", *LLAMA_3, 4096)


@pytest.mark.parametrize("model", MODELS)
def test_auto_on_cpu_is_the_measured_default(model):
    for tokens in (512, 4096, 32_768):
        assert loss_chunk_tokens(None, "cpu", *MODELS[model], tokens) == CPU_CHUNK_TOKENS == 256
    assert loss_chunk_tokens(None, "cpu", MODELS[model][0], None, 4096) == 256  # on the logits too


@pytest.mark.parametrize(("model", "tokens", "chunk"), [
    # 8 x 4096 tokens a GPU: Liger's rows, next_power_of_two(ceil(tokens / ceil(V / H))) ...
    ("Llama 3 8B", 32_768, 1024),  # ceil(128256 / 4096) = 32: 1024 rows; the budget allows 1024
    ("DeepSeek-MoE-16B", 32_768, 1024),  # 50: 656 -> 1024; the budget allows 1024
    # ... bounded by one chunk's fp32 logits within 512 MiB:
    ("DeepSeek-V3", 32_768, 1024),  # 19: 1725 -> 2048 rows, 1.06 GB of fp32 logits; 1024 fit
    ("Qwen3 8B", 32_768, 512),  # 38: 863 -> 1024 rows, 622 MB; 512 fit
    # 1 x 4096 tokens: Liger's rows (128-256) would make matmuls bound by reading the head's weight.
    ("Llama 3 8B", 4096, 512),
    ("DeepSeek-V3", 4096, 512),
    ("Qwen3 8B", 4096, 512),
    ("DeepSeek-MoE-16B", 4096, 512),
    # 16 x 8192: Liger's 4096 rows (2.1 GB of fp32 logits) capped.
    ("Llama 3 8B", 131_072, 1024),
])
def test_auto_on_cuda_follows_liger_within_a_floor_and_the_logits_budget(model, tokens, chunk):
    vocab, hidden = MODELS[model]
    assert loss_chunk_tokens(None, "cuda", vocab, hidden, tokens) == chunk
    assert 4 * chunk * vocab <= CUDA_CHUNK_LOGITS_BUDGET_BYTES


def test_the_cuda_rule_is_ligers_where_neither_bound_binds():
    # Liger's own example (fused_linear_cross_entropy.py): BT = 4 x 4096, V = 32000, H = 4096: 2048 rows.
    assert loss_chunk_tokens(None, "cuda", 32_000, 4096, 4 * 4096) == 2048
    assert loss_chunk_tokens(None, "cuda", 32_000, 4096, 8 * 4096) == 4096
    assert loss_chunk_tokens(None, "cuda", 32_000, 4096, 1000) == CUDA_MIN_CHUNK_TOKENS  # Liger's 128, raised


def test_the_budget_wins_over_the_floor_at_the_largest_vocabularies():
    assert loss_chunk_tokens(None, "cuda", 262_144, 2048, 4096) == 512  # 4 x 512 x 262144 B: the budget exactly
    assert loss_chunk_tokens(None, "cuda", 1_000_000, 4096, 4096) == 128  # 4 x 128 x 1e6 B = 512 MB


def test_on_logits_that_exist_the_budget_alone_bounds_the_cuda_chunk():
    assert loss_chunk_tokens(None, "cuda", QWEN3[0], None, 32_768) == 512
    assert loss_chunk_tokens(None, "cuda", 32_000, None, 32_768) == 4096


def test_the_rule_needs_no_torch():
    imported = subprocess.run(
        [sys.executable, "-c", "import sys, hpcsweep.memory_plan.loss_chunk; print('torch' in sys.modules)"],
        capture_output=True, text=True, check=True, timeout=120)
    assert imported.stdout.strip() == "False"
