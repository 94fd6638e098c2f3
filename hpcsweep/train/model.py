"""Causal LMs built from a transformers config, never downloaded from a hub.

``model.arch=deepseek_v3`` builds ``DeepseekV3ForCausalLM`` (MLA attention, MoE layers after the
first ``first_k_dense_replace``); ``model.arch=llama`` builds a dense ``LlamaForCausalLM``.
Weights are initialised locally from ``trainer.seed``.
"""

from __future__ import annotations

import torch
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)

from hpcsweep.config import ModelConfig


def hf_config(cfg: ModelConfig) -> PretrainedConfig:
    """The transformers config for ``cfg`` (a pure mapping of fields)."""
    common = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        attention_dropout=cfg.dropout,
        tie_word_embeddings=False,
        use_cache=False,
    )
    if cfg.arch == "llama":
        return LlamaConfig(**common)
    return DeepseekV3Config(
        **common,
        n_routed_experts=cfg.n_routed_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        n_shared_experts=cfg.n_shared_experts,
        moe_intermediate_size=cfg.moe_intermediate_size,
        first_k_dense_replace=cfg.first_k_dense_replace,
        q_lora_rank=cfg.q_lora_rank,
        kv_lora_rank=cfg.kv_lora_rank,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        qk_nope_head_dim=cfg.qk_nope_head_dim,
        v_head_dim=cfg.v_head_dim,
        # Group-limited routing is for hundreds of experts; with a handful it must be one group.
        n_group=1,
        topk_group=1,
    )


def build_model(cfg: ModelConfig, seed: int, attn_implementation: str = "eager") -> PreTrainedModel:
    """A freshly initialised model; the same ``seed`` gives the same weights bit for bit.

    ``attn_implementation`` is the resolved kernel (``eager``, ``sdpa``, ``flash_attention_2``;
    see ``hpcsweep.train.gpu_choices.resolve_attention``), never ``auto``. It changes no weight.
    """
    config = hf_config(cfg)
    torch.manual_seed(seed)
    model_cls = LlamaForCausalLM if cfg.arch == "llama" else DeepseekV3ForCausalLM
    config._attn_implementation = attn_implementation
    return model_cls(config)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 x active parameters plus the attention score term.

    Active parameters count only ``num_experts_per_tok`` of the routed experts and leave out the
    input embedding (a lookup, not a matmul). The attention term is PaLM's ``12·L·H·Q·T``,
    generalised to separate query/key and value head widths: ``6·L·H·(d_qk + d_v)·T``.
    """
    with torch.device("meta"):
        model = build_model(cfg, seed=0)
    active = 0.0
    for name, param in model.named_parameters():
        if "embed_tokens" in name:
            continue
        share = cfg.num_experts_per_tok / cfg.n_routed_experts if ".mlp.experts." in name else 1.0
        active += param.numel() * share
    if cfg.arch == "llama":
        d_qk = d_v = cfg.hidden_size // cfg.num_heads
    else:
        d_qk, d_v = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim
    attention = 6 * cfg.num_layers * cfg.num_heads * (d_qk + d_v) * seq_len
    return 6 * active + attention
