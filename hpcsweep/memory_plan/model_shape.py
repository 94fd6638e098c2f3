"""A decoder's sizes, and its parameters counted from them: pure arithmetic, no torch, no model.

``ModelShape`` comes from a ``ModelConfig`` (``shape_from_model_config``) or from a Hugging Face
``config.json`` (``shape_from_hf_config``: Llama-style dense models, DeepSeek-V2/V3 with MLA
attention and MoE layers). ``parameter_groups`` lists every weight the transformers classes
build (``LlamaForCausalLM``, ``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``) by module
name and size, so the login node can count total, active and LoRA parameters of a model far
too big to build; ``tests/unit/test_memory_plan.py`` checks the counts against the real
models built on the meta device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DENSE_MODEL_TYPES = ("llama", "mistral", "qwen2")
"""``config.json`` ``model_type`` values laid out as Llama: GQA attention and a gated MLP."""
MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
"""``model_type`` values with MLA attention and DeepSeek MoE layers."""


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The sizes that decide a decoder's parameters and activations."""

    arch: str
    """``llama`` (dense, GQA) or ``deepseek_v3`` (MLA attention, MoE after ``first_k_dense_replace`` layers)."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    n_routed_experts: int = 0
    """0: no MoE layer."""
    num_experts_per_tok: int = 0
    n_shared_experts: int = 0
    moe_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def is_mla(self) -> bool:
        return self.arch == "deepseek_v3"

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` has MoE experts instead of a dense MLP."""
        return (
            self.n_routed_experts > 0 and index >= self.first_k_dense_replace and index % self.moe_layer_freq == 0
        )

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))


def shape_from_model_config(model: Any) -> ModelShape:
    """The shape of a ``hpcsweep.config.ModelConfig`` (as ``hpcsweep.train.model.hf_config`` builds it)."""
    common = dict(
        vocab_size=model.vocab_size, hidden_size=model.hidden_size, intermediate_size=model.intermediate_size,
        num_layers=model.num_layers, num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
        head_dim=model.hidden_size // model.num_heads, tie_word_embeddings=False,
    )
    if model.arch == "llama":
        return ModelShape(arch="llama", **common)
    return ModelShape(
        arch="deepseek_v3", **common,
        n_routed_experts=model.n_routed_experts, num_experts_per_tok=model.num_experts_per_tok,
        n_shared_experts=model.n_shared_experts, moe_intermediate_size=model.moe_intermediate_size,
        first_k_dense_replace=model.first_k_dense_replace, q_lora_rank=model.q_lora_rank,
        kv_lora_rank=model.kv_lora_rank, qk_rope_head_dim=model.qk_rope_head_dim,
        qk_nope_head_dim=model.qk_nope_head_dim, v_head_dim=model.v_head_dim,
    )


def shape_from_hf_config(config: Mapping[str, Any]) -> ModelShape:
    """The shape of a Hugging Face ``config.json`` (as a dict); ``ValueError`` for another ``model_type``
    or a missing size."""
    try:
        return _shape_from_hf_config(config)
    except KeyError as err:
        raise ValueError(f"config.json has no {err.args[0]}, which the memory plan needs") from None


def _shape_from_hf_config(config: Mapping[str, Any]) -> ModelShape:
    model_type = config.get("model_type")
    if model_type not in (*DENSE_MODEL_TYPES, *MLA_MODEL_TYPES):
        allowed = ", ".join((*DENSE_MODEL_TYPES, *MLA_MODEL_TYPES))
        raise ValueError(f"config.json model_type={model_type!r} has no memory plan: one of {allowed}")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    common = dict(
        vocab_size=config["vocab_size"], hidden_size=hidden, intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"], num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )
    if model_type in DENSE_MODEL_TYPES:
        return ModelShape(arch="llama", **common)
    return ModelShape(
        arch="deepseek_v3", **common,
        n_routed_experts=config.get("n_routed_experts") or 0,
        num_experts_per_tok=config.get("num_experts_per_tok") or 0,
        n_shared_experts=config.get("n_shared_experts") or 0,
        moe_intermediate_size=config.get("moe_intermediate_size") or 0,
        first_k_dense_replace=config.get("first_k_dense_replace") or 0,
        # DeepSeek-V3's transformers class puts experts in every layer after the first k.
        moe_layer_freq=(config.get("moe_layer_freq") or 1) if model_type == "deepseek_v2" else 1,
        q_lora_rank=config.get("q_lora_rank"), kv_lora_rank=config["kv_lora_rank"],
        qk_rope_head_dim=config["qk_rope_head_dim"], qk_nope_head_dim=config["qk_nope_head_dim"],
        v_head_dim=config["v_head_dim"],
    )


@dataclass(frozen=True)
class ParamGroup:
    """``count`` copies of one weight: a linear layer ``name`` (``in_features`` -> ``out_features``)
    or, with ``in_features == 0``, a tensor of ``out_features`` elements (norms, embeddings, experts).

    ``share`` is the fraction of tokens that use it (``k/E`` for routed experts): what is active.
    """

    name: str
    in_features: int
    out_features: int
    count: int = 1
    share: float = 1.0

    @property
    def numel(self) -> int:
        return self.count * (self.in_features * self.out_features if self.in_features else self.out_features)

    @property
    def is_linear(self) -> bool:
        return self.in_features > 0


def _attention(shape: ModelShape) -> list[tuple[str, int, int]]:
    h, n = shape.hidden_size, shape.num_heads
    if not shape.is_mla:
        kv = shape.num_kv_heads * shape.head_dim
        return [("q_proj", h, n * shape.head_dim), ("k_proj", h, kv), ("v_proj", h, kv),
                ("o_proj", n * shape.head_dim, h)]
    qk = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    query = (
        [("q_proj", h, n * qk)]
        if shape.q_lora_rank is None
        else [("q_a_proj", h, shape.q_lora_rank), ("q_a_layernorm", 0, shape.q_lora_rank),
              ("q_b_proj", shape.q_lora_rank, n * qk)]
    )
    return [
        *query,
        ("kv_a_proj_with_mqa", h, shape.kv_lora_rank + shape.qk_rope_head_dim),
        ("kv_a_layernorm", 0, shape.kv_lora_rank),
        ("kv_b_proj", shape.kv_lora_rank, n * (shape.qk_nope_head_dim + shape.v_head_dim)),
        ("o_proj", n * shape.v_head_dim, h),
    ]


def _mlp(prefix: str, hidden: int, width: int) -> list[tuple[str, int, int]]:
    return [(f"{prefix}gate_proj", hidden, width), (f"{prefix}up_proj", hidden, width),
            (f"{prefix}down_proj", width, hidden)]


def parameter_groups(shape: ModelShape) -> list[ParamGroup]:
    """Every weight of the model, grouped by module name across layers (no biases: none of these
    classes has any by default)."""
    h, layers, moe = shape.hidden_size, shape.num_layers, shape.moe_layers
    dense = layers - moe
    groups = [ParamGroup("embed_tokens", 0, shape.vocab_size * h)]
    groups += [ParamGroup(f"self_attn.{name}", i, o, layers) for name, i, o in _attention(shape)]
    groups += [ParamGroup(norm, 0, h, layers) for norm in ("input_layernorm", "post_attention_layernorm")]
    if dense:
        groups += [ParamGroup(f"mlp.{name}", i, o, dense) for name, i, o in _mlp("", h, shape.intermediate_size)]
    if moe:
        experts, width = shape.n_routed_experts, shape.moe_intermediate_size
        share = shape.num_experts_per_tok / experts
        groups += [
            ParamGroup("mlp.gate", h, experts, moe),
            # Routed experts are 3D tensors in transformers (no nn.Linear, so no LoRA target).
            ParamGroup("mlp.experts.gate_up_proj", 0, experts * 2 * width * h, moe, share),
            ParamGroup("mlp.experts.down_proj", 0, experts * width * h, moe, share),
        ]
        if shape.n_shared_experts:
            groups += [ParamGroup(f"mlp.{name}", i, o, moe)
                       for name, i, o in _mlp("shared_experts.", h, width * shape.n_shared_experts)]
    groups.append(ParamGroup("norm", 0, h))
    if not shape.tie_word_embeddings:
        groups.append(ParamGroup("lm_head", h, shape.vocab_size))
    return groups


def total_parameters(shape: ModelShape) -> int:
    """Every parameter of the model."""
    return sum(g.numel for g in parameter_groups(shape))


def active_parameters(shape: ModelShape) -> int:
    """Parameters one token uses: routed experts count ``num_experts_per_tok`` of ``n_routed_experts``."""
    return round(sum(g.numel * g.share for g in parameter_groups(shape)))


def largest_layer_parameters(shape: ModelShape) -> int:
    """Parameters of the biggest decoder layer (an MoE one where there is one): what FSDP gathers at once."""
    groups = [g for g in parameter_groups(shape) if g.count > 1 or g.name.startswith(("self_attn.", "mlp."))]
    per_layer_attention = sum(g.numel // g.count for g in groups if not g.name.startswith("mlp."))
    mlp_sizes: dict[bool, int] = {True: 0, False: 0}
    for g in groups:
        if g.name.startswith("mlp."):
            moe_group = g.name.startswith(("mlp.gate", "mlp.experts", "mlp.shared_experts"))
            mlp_sizes[moe_group] += g.numel // g.count
    return per_layer_attention + max(mlp_sizes.values())


def root_parameters(shape: ModelShape) -> int:
    """Parameters outside the decoder layers: embeddings, the final norm, the LM head."""
    return sum(g.numel for g in parameter_groups(shape) if g.name in ("embed_tokens", "norm", "lm_head"))


def lora_parameters(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters of LoRA at ``rank`` on every linear layer whose last name is in ``targets``:
    ``rank x (in + out)`` each (peft's ``lora_A`` and ``lora_B``)."""
    return sum(
        g.count * rank * (g.in_features + g.out_features)
        for g in parameter_groups(shape)
        if g.is_linear and g.name.rsplit(".", 1)[-1] in targets
    )
