"""Published models' shapes, and their LoRA-wrapped forms built on the meta device: what the memory
plan's adapter count is checked against (``tests/unit/test_memory_plan.py``)."""

from __future__ import annotations

from typing import Any

import torch

from hpcsweep.model.lora_targets import EXPERT_PARAMETERS, target_modules

# DeepSeek-V2-Lite's config.json (https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite): 15.7B
# parameters, 2.4B activated per token (its model card).
V2_LITE = dict(
    model_type="deepseek_v2", vocab_size=102400, hidden_size=2048, intermediate_size=10944,
    moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
    n_shared_experts=2, n_routed_experts=64, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
    v_head_dim=128, qk_nope_head_dim=128, num_experts_per_tok=6, first_k_dense_replace=1, moe_layer_freq=1,
    tie_word_embeddings=False,
)
# DeepSeek-V3's config.json (https://huggingface.co/deepseek-ai/DeepSeek-V3): 671B parameters.
V3 = dict(
    model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
    n_shared_experts=1, n_routed_experts=256, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
    v_head_dim=128, qk_nope_head_dim=128, num_experts_per_tok=8, first_k_dense_replace=3, tie_word_embeddings=False,
)
# DeepSeek-MoE-16B's config.json (https://huggingface.co/deepseek-ai/deepseek-moe-16b-base), a
# remote-code model (modeling_deepseek.py): GQA attention, 16.4B parameters.
MOE_16B = dict(
    model_type="deepseek", vocab_size=102400, hidden_size=2048, intermediate_size=10944,
    moe_intermediate_size=1408, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=16,
    n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=6, first_k_dense_replace=1, moe_layer_freq=1,
    tie_word_embeddings=False,
)
# Llama-2-7B's config.json (https://huggingface.co/meta-llama/Llama-2-7b-hf): 6.74B parameters.
LLAMA_7B = dict(
    model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False,
)
# Mixtral-8x7B's config.json (https://huggingface.co/mistralai/Mixtral-8x7B-v0.1): 46.7B parameters.
MIXTRAL = dict(
    model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
    tie_word_embeddings=False,
)
# Qwen1.5-MoE-A2.7B's config.json (https://huggingface.co/Qwen/Qwen1.5-MoE-A2.7B): 14.3B parameters.
QWEN_MOE = dict(
    model_type="qwen2_moe", vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
    shared_expert_intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
    num_experts=60, num_experts_per_tok=4, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
)


def moe_16b_as_qwen2_moe() -> dict[str, Any]:
    """DeepSeek-MoE-16B's sizes in the transformers architecture that builds the same modules.

    transformers has no class for the remote-code ``deepseek`` model type; Qwen2-MoE has its layout:
    GQA attention, a dense first layer (``mlp_only_layers=[0]``), fused routed experts, one shared
    expert of the two shared experts' width. Its q/k/v biases are switched off (DeepSeek has none);
    it adds a 1-wide sigmoid gate per MoE layer (``shared_expert_gate``, h parameters, no LoRA target).
    """
    m = MOE_16B
    return dict(
        model_type="qwen2_moe", vocab_size=m["vocab_size"], hidden_size=m["hidden_size"],
        intermediate_size=m["intermediate_size"], moe_intermediate_size=m["moe_intermediate_size"],
        shared_expert_intermediate_size=m["n_shared_experts"] * m["moe_intermediate_size"],
        num_hidden_layers=m["num_hidden_layers"], num_attention_heads=m["num_attention_heads"],
        num_key_value_heads=m["num_key_value_heads"], num_experts=m["n_routed_experts"],
        num_experts_per_tok=m["num_experts_per_tok"], decoder_sparse_step=1, mlp_only_layers=[0],
        qkv_bias=False, tie_word_embeddings=False,
    )


def meta_model(config_json: dict[str, Any]) -> torch.nn.Module:
    """The transformers model of ``config_json`` on the meta device (no memory, no weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {k: v for k, v in config_json.items() if k != "model_type"}
    config = AutoConfig.for_model(config_json["model_type"], **values)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def wrapped_trainable_parameters(net: torch.nn.Module, rank: int, *, experts: bool = True) -> int:
    """The trainable parameters of ``net`` wrapped with peft LoRA at ``rank`` on the targets the trainer
    uses (``hpcsweep.model.lora_targets``): every linear of attention and of the dense and shared MLPs,
    and with ``experts`` the fused routed-expert tensors through peft's ``ParamWrapper``, whose
    parameter shapes the trainer's expert LoRA has (``lora_A`` h -> r·E, ``lora_B`` r·E -> out).

    peft's conversion of transformers-4 MoE target names is switched off while wrapping: it would move
    the MLP names onto the fused experts (at rank 2r) and leave the dense and shared MLPs unadapted,
    which is not what the trainer builds.
    """
    import peft
    import peft.utils.transformers_weight_conversion as conversion

    has_experts = any(name.endswith(EXPERT_PARAMETERS) for name, _ in net.named_parameters())
    config = peft.LoraConfig(
        r=rank, target_modules=target_modules(net.config.model_type, None),
        target_parameters=list(EXPERT_PARAMETERS) if experts and has_experts else None,
    )
    saved = conversion.convert_peft_config_for_transformers
    conversion.convert_peft_config_for_transformers = lambda *args, **kwargs: None
    try:
        wrapped = peft.get_peft_model(net, config)
    finally:
        conversion.convert_peft_config_for_transformers = saved
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
