"""Causal LMs built from a transformers config or loaded from a local folder, never downloaded from a hub.

``model.arch=deepseek_v3`` builds ``DeepseekV3ForCausalLM`` (MLA attention, MoE layers after the
first ``first_k_dense_replace``); ``model.arch=llama`` builds a dense ``LlamaForCausalLM``.
Weights are initialised locally from ``trainer.seed``.

``model.path`` loads a Hugging Face folder instead (``from_pretrained``, ``local_files_only``): its
safetensors are memory-mapped, so the trials of one node share one copy in the page cache, and
nothing is read twice. ``model.random_init`` builds the folder's architecture from its
``config.json`` at a seeded random init.
"""

from __future__ import annotations

import copy

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)

from hpcsweep.config import ModelConfig
from hpcsweep.model.expert_count import routed_expert_count
from hpcsweep.model.folder import read_model_folder
from hpcsweep.model.record import ModelRecord
from hpcsweep.train import remote_code


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


def load_dtype(precision: str, *, frozen_base: bool, device: torch.device) -> torch.dtype:
    """The dtype a model's weights are held in, for the resolved ``precision`` (``fp32``, ``bf16``, ``fp16``).

    Weights that train are fp32 master weights whatever the precision (autocast computes in bf16 or
    fp16 from them). A frozen base (``frozen_base``: only adapters train) is held in the compute dtype
    instead, half the memory: bf16 for bf16, and fp16 for fp16 on CUDA (CPUs lack fp16 kernels).
    """
    if frozen_base and precision == "bf16":
        return torch.bfloat16
    if frozen_base and precision == "fp16" and device.type == "cuda":
        return torch.float16
    return torch.float32


def build_model(
    cfg: ModelConfig, seed: int, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32
) -> PreTrainedModel:
    """The trial's model: built fresh, or loaded from ``model.path``, with weights in ``dtype``.

    A built model (the built-in one, or a folder's with ``model.random_init``) is initialised from
    ``seed``: the same seed gives the same weights bit for bit. ``attn_implementation`` is the resolved
    kernel (``eager``, ``sdpa``, ``flash_attention_2``; see ``hpcsweep.train.gpu_choices.resolve_attention``),
    never ``auto``. It changes no weight.
    """
    if cfg.path is not None:
        return _from_folder(cfg, seed, attn_implementation, dtype)
    config = hf_config(cfg)
    torch.manual_seed(seed)
    model_cls = LlamaForCausalLM if cfg.arch == "llama" else DeepseekV3ForCausalLM
    config._attn_implementation = attn_implementation
    return model_cls(config).to(dtype)


def _from_folder(cfg: ModelConfig, seed: int, attn_implementation: str, dtype: torch.dtype) -> PreTrainedModel:
    options = dict(trust_remote_code=cfg.trust_remote_code, attn_implementation=attn_implementation, dtype=dtype)
    if cfg.trust_remote_code:
        remote_code.provide_removed_names()
    config = AutoConfig.from_pretrained(cfg.path, local_files_only=True, trust_remote_code=cfg.trust_remote_code)
    own_code = bool(getattr(config, "auto_map", None))
    remote_code.prepare_remote_config(config)
    if cfg.random_init:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, **options)
    else:
        model = AutoModelForCausalLM.from_pretrained(cfg.path, config=config, local_files_only=True, **options)
        if own_code:
            remote_code.restore_computed_buffers(model, config, dtype)
    if own_code:
        remote_code.tied_weights_as_mapping(model)
    return model


def own_code(cfg: ModelConfig, record: ModelRecord | None = None) -> bool:
    """Whether ``model.path`` ships the model's own code (``auto_map``), as ``record`` holds the folder
    (without one, read now); a built-in model never does."""
    if cfg.path is None:
        return False
    return (read_model_folder(cfg.path) if record is None else record).needs_remote_code


def routed_experts(config: PretrainedConfig) -> int | None:
    """Routed experts per MoE layer of ``config``; None for a dense model."""
    return routed_expert_count(config) or None


def flops_per_token(config: PretrainedConfig, seq_len: int) -> float:
    """Training FLOPs per token of the model ``config`` describes (a built-in one's ``hf_config``, or a
    loaded folder's): 6 x active parameters plus the attention score term.

    The parameters are counted on a model built on the meta device (no memory, no weights read).
    Active parameters count only ``num_experts_per_tok`` of the routed experts and leave out the
    input embedding (a lookup, not a matmul). The attention term is PaLM's ``12·L·H·Q·T``,
    generalised to separate query/key and value head widths: ``6·L·H·(d_qk + d_v)·T``.
    """
    config = copy.deepcopy(config)
    remote = bool(getattr(config, "auto_map", None))
    if remote:
        remote_code.provide_removed_names()
        remote_code.prepare_remote_config(config)
    with torch.device("meta"):
        # The kernel changes no parameter; eager needs no package and no device to be chosen.
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=remote, attn_implementation="eager")
    experts = routed_experts(config)
    active = 0.0
    for name, param in model.named_parameters():
        if "embed_tokens" in name:
            continue
        share = config.num_experts_per_tok / experts if experts and ".mlp.experts." in name else 1.0
        active += param.numel() * share
    heads = config.num_attention_heads
    if getattr(config, "qk_nope_head_dim", None) is not None:  # MLA: DeepSeek-V2/V3
        d_qk, d_v = config.qk_nope_head_dim + config.qk_rope_head_dim, config.v_head_dim
    else:
        d_qk = d_v = getattr(config, "head_dim", None) or config.hidden_size // heads
    attention = 6 * config.num_hidden_layers * heads * (d_qk + d_v) * seq_len
    return 6 * active + attention
