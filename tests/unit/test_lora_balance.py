"""Under LoRA, a router with DeepSeek-V3's bias (whose update is then off) is balanced by the aux loss by
default (issue 38: nothing balanced it, and a LoRA trial of an 8-expert V3 folder collapsed)."""

from __future__ import annotations

import pytest
import torch

from hpcsweep.config import LoraConfig, ModelConfig, MoeConfig
from hpcsweep.train import lora
from hpcsweep.train.moe import load_balance

LORA_DEFAULT = load_balance.LORA_BIAS_ROUTER_AUX_LOSS_COEF


def tiny_v3(**overrides) -> torch.nn.Module:
    """A DeepSeek-V3 of transformers' class at its defaults but sizes (8 experts, top-2, one group)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    return DeepseekV3ForCausalLM(DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=8, q_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8, max_position_embeddings=64, first_k_dense_replace=1,
        n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, **overrides))


@pytest.mark.parametrize("peft, moe, folder_alpha, coef, rate", [
    ("none", MoeConfig(), None, 0.0, 0.001),  # full fine-tuning: the bias update balances
    ("lora", MoeConfig(), None, LORA_DEFAULT, 0.0),  # LoRA: the aux loss stands in for it
    ("lora", MoeConfig(), 0.001, LORA_DEFAULT, 0.0),  # a folder's own small alpha assumes the bias update
    ("lora", MoeConfig(), 1.0, 1.0, 0.0),  # a larger one of the folder's is kept
    ("lora", MoeConfig(aux_loss_coef=0.0), None, 0.0, 0.0),  # 0 still switches it off
    ("lora", MoeConfig(aux_loss_coef=0.02), None, 0.02, 0.0),
    ("none", MoeConfig(), 0.001, 0.001, 0.001),
])
def test_lora_turns_the_aux_loss_on_for_a_bias_router_by_default(peft, moe, folder_alpha, coef, rate):
    cfg = ModelConfig(peft=peft, moe=moe, lora=LoraConfig(r=4))
    net = tiny_v3(**({} if folder_alpha is None else {"aux_loss_alpha": folder_alpha}))
    if peft == "lora":
        net = lora.apply_lora(net, cfg, seed=0)
    balance = load_balance.attach(net, cfg)
    assert (balance.aux_loss_coef, balance.bias_update_rate) == (coef, rate)


def test_a_router_without_a_bias_keeps_its_folders_coefficient_under_lora():
    from transformers import MixtralConfig

    config = MixtralConfig(router_aux_loss_coef=0.001)
    cfg = ModelConfig(peft="lora")
    assert load_balance.effective_aux_loss_coef(cfg, config, bias_router=False) == 0.001
