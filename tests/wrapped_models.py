"""Published models' shapes, and their LoRA-wrapped forms built on the meta device: what the memory
plan's adapter count is checked against (``tests/unit/test_memory_plan.py``); and DeepSeek-MoE-16B as a
remote-code folder, its model built from the folder's own code (``tests/unit/test_remote_code_moe.py``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
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
# The rest of that config.json: the routing and the classes its auto_map names.
MOE_16B_REST = dict(
    architectures=["DeepseekForCausalLM"],
    auto_map={"AutoConfig": "configuration_deepseek.DeepseekConfig", "AutoModel": "modeling_deepseek.DeepseekModel",
              "AutoModelForCausalLM": "modeling_deepseek.DeepseekForCausalLM"},
    aux_loss_alpha=0.001, seq_aux=True, norm_topk_prob=False, scoring_func="softmax", hidden_act="silu",
    attention_bias=False, attention_dropout=0.0, max_position_embeddings=4096, rms_norm_eps=1e-6,
    rope_theta=10000, rope_scaling=None, pretraining_tp=1, initializer_range=0.02, bos_token_id=100000,
    eos_token_id=100001, use_cache=True,
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


DEEPSEEK_MOE_CODE_ENV = "HPCSWEEP_DEEPSEEK_MOE_CODE"
"""A folder holding DeepSeek-MoE's own ``modeling_deepseek.py`` and ``configuration_deepseek.py`` (a
download of deepseek-ai/deepseek-moe-16b-base has them): set, the remote-code tests run on that code
too. Its code is not kept here: code fetched from elsewhere stays out of this repository."""

DEEPSEEK_MOE_CONFIGURATION = '''"""The DeepSeek-MoE stand-in's config (tests/wrapped_models.py): DeepSeek-MoE's keys."""
from transformers import PretrainedConfig


class DeepseekConfig(PretrainedConfig):
    model_type = "deepseek"

    def __init__(self, vocab_size=102400, hidden_size=4096, intermediate_size=11008, moe_intermediate_size=1407,
                 num_hidden_layers=30, num_attention_heads=32, num_key_value_heads=32, n_shared_experts=None,
                 n_routed_experts=None, num_experts_per_tok=None, moe_layer_freq=1, first_k_dense_replace=0,
                 norm_topk_prob=False, rms_norm_eps=1e-6, attention_bias=False, initializer_range=0.02,
                 tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None, use_cache=True, **kwargs):
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.moe_intermediate_size, self.num_hidden_layers = moe_intermediate_size, num_hidden_layers
        self.num_attention_heads, self.num_key_value_heads = num_attention_heads, num_key_value_heads
        self.n_shared_experts, self.n_routed_experts = n_shared_experts, n_routed_experts
        self.num_experts_per_tok, self.moe_layer_freq = num_experts_per_tok, moe_layer_freq
        self.first_k_dense_replace, self.norm_topk_prob = first_k_dense_replace, norm_topk_prob
        self.rms_norm_eps, self.attention_bias, self.initializer_range = rms_norm_eps, attention_bias, initializer_range
        self.rope_theta, self.rope_scaling, self.use_cache = rope_theta, rope_scaling, use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
'''
DEEPSEEK_MOE_MODELING = '''"""A stand-in for DeepSeek-MoE's remote code (its modeling_deepseek.py, not kept
here): the same module tree, names and shapes: one MLP module per routed expert (``mlp.experts.N.gate_proj``,
``up_proj``, ``down_proj``), shared experts, a router weight ``mlp.gate.weight``, dense MLPs in the first layers.
Routing: softmax top-k, each expert run on its tokens, as that code trains. A plain rotary embedding,
no balance loss: what it is for is the layout LoRA meets. It keeps the five habits of that code which
transformers 5 breaks (hpcsweep.train.remote_code): it imports is_torch_fx_available, it reads a
non-None rope_scaling as a scaling with a ["type"], with use_cache it wraps the past in
DynamicCache.from_legacy_cache, it declares its tied weights as a list, and it computes its rotary
inv_freq, a non-persistent buffer, in __init__ (not in _init_weights). Like that code's eager path, it
takes attention_mask (2D, or 4D of 1 and 0) through _prepare_4d_causal_attention_mask, and rotates by
position_ids: what hpcsweep's packed rows reach it through (hpcsweep.train.data.sample_attention)."""
import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask
from transformers.modeling_outputs import CausalLMOutput
from transformers.utils.import_utils import is_torch_fx_available

if is_torch_fx_available():
    import torch.fx

from .configuration_deepseek import DeepseekConfig


class DeepseekRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(hidden_size)), eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class DeepseekMLP(nn.Module):
    def __init__(self, config, intermediate_size=None):
        super().__init__()
        width = intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoEGate(nn.Module):
    """DeepSeek's gate's signature: batch x time x hidden in; (topk_idx, topk_weight, aux_loss) out, the
    aux loss (alpha x sum_i f_i P_i over the batch) reported in training, not trained on here."""

    def __init__(self, config):
        super().__init__()
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, config.norm_topk_prob
        self.n_routed_experts, self.alpha = config.n_routed_experts, getattr(config, "aux_loss_alpha", 0.0)
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))

    def forward(self, hidden):
        scores = F.linear(hidden.reshape(-1, hidden.shape[-1]), self.weight).softmax(dim=-1)
        weights, chosen = scores.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        aux_loss = None
        if self.training and self.alpha > 0:
            share = torch.bincount(chosen.flatten(), minlength=self.n_routed_experts).float()
            share = share / (chosen.numel() / self.n_routed_experts)
            aux_loss = (share * scores.mean(0)).sum() * self.alpha
        return chosen, weights, aux_loss


class DeepseekMoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.experts = nn.ModuleList(DeepseekMLP(config, config.moe_intermediate_size)
                                     for _ in range(config.n_routed_experts))
        self.gate = MoEGate(config)
        if config.n_shared_experts:
            self.shared_experts = DeepseekMLP(config, config.moe_intermediate_size * config.n_shared_experts)

    def forward(self, hidden):
        x = hidden.reshape(-1, hidden.shape[-1])
        chosen, weights, _ = self.gate(hidden)
        y = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            token, slot = (chosen == index).nonzero(as_tuple=True)
            if len(token):
                y = y.index_add(0, token, expert(x[token]) * weights[token, slot, None])
        y = y.view(hidden.shape)
        return y + self.shared_experts(hidden) if hasattr(self, "shared_experts") else y


class DeepseekAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.hidden_size // self.heads
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)
        if config.rope_scaling is not None:  # as DeepSeek's _init_rope reads it
            self.scaling = (config.rope_scaling["type"], config.rope_scaling["factor"])
        # Computed here, as DeepSeek's rotary embedding computes its inv_freq, and kept out of the weights.
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rotate(self, x, position_ids):
        angles = position_ids[:, None, :, None].float() * self.inv_freq
        cos, sin = angles.cos().repeat(1, 1, 1, 2).to(x.dtype), angles.sin().repeat(1, 1, 1, 2).to(x.dtype)
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def forward(self, x, attention_mask, position_ids):
        b, t, _ = x.shape
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = self.rotate(q, position_ids), self.rotate(k, position_ids)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask.to(q.dtype),
                                             enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = DeepseekAttention(config)
        routed = (config.n_routed_experts and layer_idx >= config.first_k_dense_replace
                  and layer_idx % config.moe_layer_freq == 0)
        self.mlp = DeepseekMoE(config) if routed else DeepseekMLP(config)
        self.input_layernorm = DeepseekRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = DeepseekRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, attention_mask, position_ids):
        x = x + self.self_attn(self.input_layernorm(x), attention_mask, position_ids)
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepseekPreTrainedModel(PreTrainedModel):
    config_class = DeepseekConfig
    base_model_prefix = "model"

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding, MoEGate)):
            module.weight.normal_(0.0, self.config.initializer_range)


class DeepseekModel(DeepseekPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DeepseekDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = DeepseekRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        if (use_cache if use_cache is not None else self.config.use_cache):
            from transformers.cache_utils import DynamicCache

            DynamicCache.from_legacy_cache(None)  # as DeepSeek's own forward does with a cache
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device)[None].expand(b, t)
        x = self.embed_tokens(input_ids)
        attention_mask = _prepare_4d_causal_attention_mask(attention_mask, (b, t), x, 0)
        for layer in self.layers:
            x = layer(x, attention_mask, position_ids)
        return self.norm(x)


class DeepseekForCausalLM(DeepseekPreTrainedModel):
    _tied_weights_keys = ["lm_head.weight"]  # transformers 4's form, as DeepSeek's code declares it

    def __init__(self, config):
        super().__init__(config)
        self.model = DeepseekModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, attention_mask=None, position_ids=None, labels=None, use_cache=None):
        logits = self.lm_head(self.model(input_ids, attention_mask, position_ids, use_cache=use_cache)).float()
        loss = None if labels is None else F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return CausalLMOutput(loss=loss, logits=logits)
'''


def deepseek_moe_code_dirs() -> dict[str, Path | None]:
    """The model code a DeepSeek-MoE folder can be made with: ``stand-in`` (ours, always), ``real``
    (DeepSeek's own, from ``$HPCSWEEP_DEEPSEEK_MOE_CODE``; None when that is unset)."""
    real = os.environ.get(DEEPSEEK_MOE_CODE_ENV)
    return {"stand-in": None, "real": Path(real) if real else None}


def make_deepseek_moe_folder(folder: Path, config_json: dict[str, Any], code: Path | None = None) -> Path:
    """A remote-code DeepSeek-MoE folder as ``save_pretrained`` leaves one, less its weights: ``config.json``
    (``config_json``, with DeepSeek-MoE-16B's ``auto_map`` and routing keys) and the two ``.py`` files its
    ``auto_map`` names, the stand-in's or, with ``code``, those of that folder."""
    folder.mkdir(parents=True, exist_ok=True)
    if code is None:
        (folder / "configuration_deepseek.py").write_text(DEEPSEEK_MOE_CONFIGURATION)
        (folder / "modeling_deepseek.py").write_text(DEEPSEEK_MOE_MODELING)
    else:
        for name in ("configuration_deepseek.py", "modeling_deepseek.py"):
            shutil.copyfile(code / name, folder / name)
    (folder / "config.json").write_text(json.dumps({**MOE_16B_REST, **config_json}, indent=2))
    return folder


def remote_code_model(folder: Path, *, meta: bool = True, **config_overrides) -> torch.nn.Module:
    """The model of a remote-code ``folder``, built from its config by its own code (``from_config``,
    ``trust_remote_code``), on the meta device unless not ``meta``.

    DeepSeek-MoE's own code predates transformers 5, and so does the stand-in's: the config goes through
    what the trainer does for such code (``hpcsweep.train.remote_code``).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from hpcsweep.train import remote_code

    remote_code.provide_removed_names()
    config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=True, **config_overrides)
    remote_code.prepare_remote_config(config)
    with torch.device("meta" if meta else "cpu"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=True, attn_implementation="eager")


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
