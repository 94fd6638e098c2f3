"""Tiny MoE models built with transformers' own config classes, for the router balance tests.

``tiny_moe("v2")`` is DeepSeek-V2-shaped (softmax router, ``aux_loss_alpha`` and ``seq_aux`` in its
config as DeepSeek-V2-Lite's config.json has them), ``tiny_moe("v3")`` DeepSeek-V3-shaped (sigmoid
router with ``e_score_correction_bias``), ``tiny_moe("mixtral")`` a Mixtral and ``tiny_moe("qwen2_moe")`` a Qwen2-MoE. Each has one dense layer
then one MoE layer (layer 1). ``skew_router`` biases layer 1's router toward expert 0.
"""

from __future__ import annotations

import torch

DEEPSEEK = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=2, n_routed_experts=16, num_experts_per_tok=2, n_shared_experts=1,
    moe_intermediate_size=16, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=8, qk_rope_head_dim=4,
    qk_nope_head_dim=4, v_head_dim=8, n_group=1, topk_group=1, max_position_embeddings=64,
)
"""Sizes only: every other key keeps the config class's default (``use_cache`` true, as published)."""


def tiny_moe(kind: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny causal LM of ``kind`` (``v2``, ``v3``, ``mixtral``) at a seeded random init."""
    from transformers import (
        DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM, MixtralConfig,
        MixtralForCausalLM,
    )

    torch.manual_seed(seed)
    if kind == "v2":
        return DeepseekV2ForCausalLM(DeepseekV2Config(**{**DEEPSEEK, "aux_loss_alpha": 0.001, "seq_aux": True,
                                                         **overrides}))
    if kind == "v3":
        return DeepseekV3ForCausalLM(DeepseekV3Config(**{**DEEPSEEK, **overrides}))
    if kind == "qwen2_moe":
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

        return Qwen2MoeForCausalLM(Qwen2MoeConfig(**{
            "vocab_size": 64, "hidden_size": 32, "intermediate_size": 32, "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
            "max_position_embeddings": 64, **overrides}))
    return MixtralForCausalLM(MixtralConfig(**{
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
        "max_position_embeddings": 64, **overrides}))


def skew_router(model: torch.nn.Module, kind: str) -> None:
    """Bias layer 1's router toward expert 0: V3 through its ``e_score_correction_bias``; V2 (no bias)
    through a constant direction added to every embedding, which the router's row 0 reads."""
    router = model.model.layers[1].mlp.gate
    with torch.no_grad():
        if kind == "v3":
            router.e_score_correction_bias[0] = 0.05
        else:
            model.model.embed_tokens.weight[:, 0] += 1.0
            router.weight[0, 0] = 1.0


def make_collapsed_moe_folder(folder, favoured: int = 2, **overrides):
    """``tests.model_folders.make_model_folder``'s DeepseekV3, every MoE layer's router pinned to its first
    ``favoured`` experts: their ``e_score_correction_bias`` raised by 1 (sigmoid scores lie in 0..1), so
    with top-``favoured`` routing every other expert is idle. Returns ``folder``."""
    from safetensors.torch import load_file, save_file

    from tests.model_folders import make_model_folder

    make_model_folder(folder, **overrides)
    path = folder / "model.safetensors"
    tensors = load_file(path)
    biases = [name for name in tensors if name.endswith("e_score_correction_bias")]
    assert biases, "a DeepseekV3 folder has a router bias per MoE layer"
    for name in biases:
        tensors[name][:favoured] += 1.0
    save_file(tensors, path, metadata={"format": "pt"})
    return folder
