"""A decoder's sizes, and its parameters counted from them: pure arithmetic, no torch, no model.

``ModelShape`` comes from a ``ModelConfig`` (``shape_from_model_config``) or from a Hugging Face
``config.json`` (``shape_from_hf_config``): Llama-style dense models, DeepSeek-V2/V3 (MLA attention,
MoE layers), Mixtral and Qwen2-MoE, and DeepSeek-MoE's remote-code ``deepseek`` (GQA attention,
DeepSeek MoE layers). ``parameter_groups`` lists every weight those models build, by module name
and size, so the login node can count total, active and LoRA parameters of a model far too big to
build; ``tests/unit/test_memory_plan.py`` checks the counts against the real models, and the LoRA
count against the real wrapped models, built on the meta device (``tests/unit/test_remote_code_moe.py``
the remote-code layout, one module per routed expert).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpcsweep.model.expert_count import routed_expert_count
from hpcsweep.model.lora_targets import EXPERT_PARAMETERS, adapts_module

DENSE_MODEL_TYPES = ("llama", "mistral", "qwen2")
"""``config.json`` ``model_type`` values laid out as Llama: GQA attention and a gated MLP."""
MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
"""``model_type`` values with MLA attention and DeepSeek MoE layers."""
GQA_MOE_MODEL_TYPES = ("deepseek", "mixtral", "qwen2_moe")
"""``model_type`` values with GQA attention and MoE layers: DeepSeek-MoE (its remote code's keys:
``n_routed_experts``, ``n_shared_experts``, ``moe_intermediate_size``, ``first_k_dense_replace``,
``moe_layer_freq``), Mixtral (every layer routed, no shared expert) and Qwen2-MoE (one gated shared expert)."""
PLANNED_MODEL_TYPES = (*DENSE_MODEL_TYPES, *MLA_MODEL_TYPES, *GQA_MOE_MODEL_TYPES)


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The sizes that decide a decoder's parameters and activations."""

    arch: str
    """``llama`` (GQA attention), ``deepseek_v3`` (MLA attention); either with MoE layers where
    ``sparse_layers`` names them."""
    model_type: str = ""
    """``config.json``'s ``model_type`` (what picks the LoRA targets); the ``arch`` when built from a ``ModelConfig``."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    """q, k and v carry biases (Qwen2-MoE's ``qkv_bias``)."""
    n_routed_experts: int = 0
    """0: no MoE layer."""
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    """Width of the shared experts' MLP (DeepSeek: ``n_shared_experts x moe_intermediate_size``); 0: none."""
    shared_expert_gate: bool = False
    """A sigmoid gate (``h -> 1``) in front of the shared expert (Qwen2-MoE)."""
    sparse_layers: tuple[int, ...] = ()
    """The decoder layers whose MLP is a MoE layer."""
    fused_experts: bool = True
    """transformers 5's layout: a MoE layer's routed experts are two fused 3-D tensors. False: the
    folder's own code builds the model (``auto_map``; always for DeepSeek-MoE's ``deepseek``, which
    transformers has no class for), and DeepSeek's code keeps each routed expert as three ``nn.Linear``
    of its own (``mlp.experts.N.gate_proj``, ``up_proj``, ``down_proj``)."""
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
        return self.n_routed_experts > 0 and index in self.sparse_layers

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))


def deepseek_sparse_layers(layers: int, first_k_dense: int, every: int = 1) -> tuple[int, ...]:
    """DeepSeek's MoE layers: from ``first_k_dense_replace`` on, every ``moe_layer_freq``-th."""
    return tuple(i for i in range(layers) if i >= first_k_dense and i % every == 0)


def shape_from_model_config(model: Any) -> ModelShape:
    """The shape of a ``hpcsweep.config.ModelConfig`` (as ``hpcsweep.train.model.hf_config`` builds it)."""
    common = dict(
        model_type=model.arch, vocab_size=model.vocab_size, hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size, num_layers=model.num_layers, num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads, head_dim=model.hidden_size // model.num_heads, tie_word_embeddings=False,
    )
    if model.arch == "llama":
        return ModelShape(arch="llama", **common)
    return ModelShape(
        arch="deepseek_v3", **common,
        n_routed_experts=model.n_routed_experts, num_experts_per_tok=model.num_experts_per_tok,
        moe_intermediate_size=model.moe_intermediate_size,
        shared_intermediate_size=model.moe_intermediate_size * model.n_shared_experts,
        sparse_layers=deepseek_sparse_layers(model.num_layers, model.first_k_dense_replace),
        q_lora_rank=model.q_lora_rank, kv_lora_rank=model.kv_lora_rank, qk_rope_head_dim=model.qk_rope_head_dim,
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
    if model_type not in PLANNED_MODEL_TYPES:
        raise ValueError(f"config.json model_type={model_type!r} has no memory plan: one of {', '.join(PLANNED_MODEL_TYPES)}")
    hidden, heads, layers = config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]
    common = dict(
        model_type=model_type, vocab_size=config["vocab_size"], hidden_size=hidden,
        intermediate_size=config["intermediate_size"], num_layers=layers, num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )
    if model_type in DENSE_MODEL_TYPES:
        return ModelShape(arch="llama", **common)
    if model_type == "mixtral":
        return ModelShape(
            arch="llama", **common, n_routed_experts=routed_expert_count(config),
            num_experts_per_tok=config["num_experts_per_tok"], moe_intermediate_size=config["intermediate_size"],
            sparse_layers=tuple(range(layers)),
        )
    if model_type == "qwen2_moe":
        dense = set(config.get("mlp_only_layers") or ())
        step = config.get("decoder_sparse_step") or 1
        return ModelShape(
            arch="llama", **common, attention_bias=bool(config.get("qkv_bias", True)),
            n_routed_experts=routed_expert_count(config), num_experts_per_tok=config["num_experts_per_tok"],
            moe_intermediate_size=config["moe_intermediate_size"],
            shared_intermediate_size=config["shared_expert_intermediate_size"], shared_expert_gate=True,
            sparse_layers=tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0),
        )
    experts = dict(
        n_routed_experts=routed_expert_count(config),
        num_experts_per_tok=config.get("num_experts_per_tok") or 0,
        moe_intermediate_size=config.get("moe_intermediate_size") or 0,
        shared_intermediate_size=(config.get("moe_intermediate_size") or 0) * (config.get("n_shared_experts") or 0),
        # transformers' DeepSeek-V2/V3 classes put experts in every layer after the first k; the remote
        # code (model_type deepseek) also honours moe_layer_freq.
        sparse_layers=deepseek_sparse_layers(
            layers, config.get("first_k_dense_replace") or 0,
            (config.get("moe_layer_freq") or 1) if model_type == "deepseek" else 1,
        ),
    )
    # What runs is the folder's code when it has one (transformers prefers trusted remote code to its
    # own class): DeepSeek's modeling_deepseek.py, for DeepSeek-MoE and DeepSeek-V2/V3 alike, holds
    # each routed expert as an MLP module of its own.
    experts["fused_experts"] = model_type != "deepseek" and not config.get("auto_map")
    if model_type == "deepseek":
        return ModelShape(arch="llama", **common, **experts)
    return ModelShape(
        arch="deepseek_v3", **common, **experts,
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
        biases = [("q_proj.bias", 0, n * shape.head_dim), ("k_proj.bias", 0, kv), ("v_proj.bias", 0, kv)]
        return [("q_proj", h, n * shape.head_dim), ("k_proj", h, kv), ("v_proj", h, kv),
                ("o_proj", n * shape.head_dim, h), *(biases if shape.attention_bias else [])]
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


def _layer_norms(shape: ModelShape) -> list[tuple[str, int, int]]:
    return [("input_layernorm", 0, shape.hidden_size), ("post_attention_layernorm", 0, shape.hidden_size)]


def _dense_mlp(shape: ModelShape) -> list[tuple[str, int, int]]:
    return [(f"mlp.{name}", i, o) for name, i, o in _mlp("", shape.hidden_size, shape.intermediate_size)]


def _moe_mlp(shape: ModelShape) -> list[tuple[str, int, int, float]]:
    """A MoE layer's weights, each with the share of tokens that uses it."""
    h, experts, width = shape.hidden_size, shape.n_routed_experts, shape.moe_intermediate_size
    share = shape.num_experts_per_tok / experts
    # The router is a weight of its own in transformers 5 and in DeepSeek's code (no nn.Linear, so
    # never a LoRA target).
    weights = [("mlp.gate", 0, experts * h, 1.0)]
    if shape.fused_experts:
        # [E, 2I, h] and [E, h, I]
        gate_up, down = EXPERT_PARAMETERS
        weights += [(gate_up, 0, experts * 2 * width * h, share), (down, 0, experts * width * h, share)]
    else:
        weights += [(name, i, o, share) for e in range(experts)
                    for name, i, o in _mlp(f"mlp.experts.{e}.", h, width)]
    if shape.shared_intermediate_size:
        prefix = "shared_expert." if shape.shared_expert_gate else "shared_experts."
        weights += [(f"mlp.{name}", i, o, 1.0) for name, i, o in _mlp(prefix, h, shape.shared_intermediate_size)]
    if shape.shared_expert_gate:
        weights.append(("mlp.shared_expert_gate", h, 1, 1.0))
    return weights


def parameter_groups(shape: ModelShape) -> list[ParamGroup]:
    """Every weight of the model, grouped by module name across layers (biases only where named:
    none of these classes has any by default but Qwen2-MoE's q, k, v)."""
    h, layers, moe = shape.hidden_size, shape.num_layers, shape.moe_layers
    dense = layers - moe
    groups = [ParamGroup("embed_tokens", 0, shape.vocab_size * h)]
    groups += [ParamGroup(f"self_attn.{name}", i, o, layers) for name, i, o in _attention(shape)]
    groups += [ParamGroup(name, i, o, layers) for name, i, o in _layer_norms(shape)]
    if dense:
        groups += [ParamGroup(name, i, o, dense) for name, i, o in _dense_mlp(shape)]
    if moe:
        groups += [ParamGroup(name, i, o, moe, share) for name, i, o, share in _moe_mlp(shape)]
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


def _numel(weights: list) -> int:
    return sum(i * o if i else o for _, i, o, *_ in weights)


def layer_parameters(shape: ModelShape, index: int) -> int:
    """Parameters of decoder layer ``index``: attention, its two norms, and its dense or MoE MLP."""
    mlp = _moe_mlp(shape) if shape.is_moe_layer(index) else _dense_mlp(shape)
    return _numel(_attention(shape)) + _numel(_layer_norms(shape)) + _numel(mlp)


def largest_layer_parameters(shape: ModelShape) -> int:
    """Parameters of the biggest decoder layer: what FSDP gathers at once."""
    kinds = {shape.is_moe_layer(i) for i in range(shape.num_layers)}
    return max(layer_parameters(shape, next(i for i in range(shape.num_layers) if shape.is_moe_layer(i) == moe))
               for moe in kinds)


def root_parameters(shape: ModelShape) -> int:
    """Parameters outside the decoder layers: embeddings, the final norm, the LM head."""
    return sum(g.numel for g in parameter_groups(shape) if g.name in ("embed_tokens", "norm", "lm_head"))


def expert_lora_parameters(shape: ModelShape, rank: int) -> int:
    """Adapter parameters of an expert LoRA at ``rank`` on both fused expert tensors of every MoE layer:
    each expert its own ``A`` (r x in) and ``B`` (out x r), as peft's ``ParamWrapper`` shapes them
    (``lora_A`` in -> r·E, ``lora_B`` r·E -> out): ``r·E·(h + 2I)`` for ``gate_up_proj`` and
    ``r·E·(I + h)`` for ``down_proj``. 0 where the experts are modules (``fused_experts`` false):
    their adapters are linear layers' (``lora_parameters``), ``r·E·3(h + I)``, gate and up apart."""
    if not shape.fused_experts:
        return 0
    h, width = shape.hidden_size, shape.moe_intermediate_size
    return shape.moe_layers * rank * shape.n_routed_experts * ((h + 2 * width) + (width + h))


def lora_parameters(shape: ModelShape, rank: int, targets: tuple[str, ...] | str, experts: bool = False) -> int:
    """Adapter parameters of LoRA at ``rank``: ``rank x (in + out)`` (peft's ``lora_A`` and ``lora_B``)
    on every linear layer that ``hpcsweep.model.lora_targets.adapts_module`` adapts for ``targets``
    (``all-linear``: every linear layer but the LM head), a routed expert's own only with ``experts``;
    plus with ``experts`` the fused routed experts' (``expert_lora_parameters``)."""
    linear = sum(g.count * rank * (g.in_features + g.out_features) for g in parameter_groups(shape)
                 if g.is_linear and adapts_module(g.name, targets, experts=experts))
    return linear + (expert_lora_parameters(shape, rank) if experts else 0)
