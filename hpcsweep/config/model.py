"""The ``model`` group: the built-in architecture or a pretrained folder, and what of it trains."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Literal

from .lora import LoraConfig
from .moe import MoeConfig
from .validation import _require


@dataclass(kw_only=True)
class ModelConfig:
    """A causal LM built from a transformers config (never downloaded from a hub)."""

    arch: Literal["deepseek_v3", "llama"] = "deepseek_v3"
    """Which transformers architecture to build."""
    lr: float = 3e-3
    """Peak learning rate. The key users sweep first."""
    vocab_size: int = 256
    """Vocabulary size; must cover the data's token ids."""
    hidden_size: int = 128
    """Width of the residual stream."""
    intermediate_size: int = 256
    """Width of the dense MLP."""
    num_layers: int = 2
    """Number of decoder layers."""
    num_heads: int = 4
    """Number of attention heads."""
    num_kv_heads: int = 4
    """Key/value heads (grouped-query attention when below ``num_heads``)."""
    max_position_embeddings: int = 512
    """Longest sequence the rotary embedding is set up for."""
    dropout: float = 0.0
    """Attention dropout probability."""
    n_routed_experts: int = 4
    """DeepSeek MoE: routed experts per MoE layer."""
    num_experts_per_tok: int = 2
    """DeepSeek MoE: experts each token is routed to."""
    n_shared_experts: int = 1
    """DeepSeek MoE: always-active shared experts."""
    moe_intermediate_size: int = 64
    """DeepSeek MoE: width of each expert's MLP."""
    first_k_dense_replace: int = 1
    """DeepSeek MoE: the first k layers use a dense MLP instead of MoE."""
    q_lora_rank: int | None = None
    """DeepSeek MLA: rank of the query low-rank projection (null: full-rank queries)."""
    kv_lora_rank: int = 32
    """DeepSeek MLA: rank of the compressed key/value latent."""
    qk_rope_head_dim: int = 16
    """DeepSeek MLA: per-head dims that carry rotary position."""
    qk_nope_head_dim: int = 16
    """DeepSeek MLA: per-head dims without position."""
    v_head_dim: int = 32
    """DeepSeek MLA: per-head value dims."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "auto"] = "auto"
    """The attention kernel. ``auto``: ``eager`` on CPU (the math every bit-exact CPU result was
    proved with); on CUDA ``sdpa`` (fused, never the full score matrix), or ``flash_attention_2``
    where the ``flash_attn`` package is installed, precision is bf16/fp16 and the trial is not
    deterministic (see ``hpcsweep.train.gpu_choices``)."""
    # ----- a pretrained model from a local folder (hpcsweep.model.folder) -----
    path: str | None = None
    """A Hugging Face model folder on the shared file system (``config.json``, safetensors weights,
    tokenizer), loaded with ``from_pretrained(local_files_only=True)``; null: the built-in model
    above. With a path the architecture is the folder's: every key of ``FOLDER_ARCHITECTURE_KEYS``
    must keep its default (a changed one is refused, naming it). ``model=pretrained`` sets it."""
    trust_remote_code: bool = False
    """Run the model code a folder ships (a ``config.json`` with an ``auto_map``, as DeepSeek-MoE-16B
    has). Without it such a folder is refused before submit: that code runs on every compute node."""
    random_init: bool = False
    """With ``model.path``: build the folder's architecture from its ``config.json`` at a random init
    (seeded by ``trainer.seed``) and ignore any weights, i.e. pretraining at the folder's size. A
    config-only folder (no weight files) needs it; without it that folder is refused."""
    peft: Literal["none", "lora"] = "none"
    """What trains: ``none``, every parameter; ``lora``, LoRA adapters (``model.lora``) over a frozen base."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """The LoRA adapters' settings (used with ``model.peft=lora``)."""
    moe: MoeConfig = field(default_factory=MoeConfig)
    """Router balance of a MoE model (``model.moe.aux_loss_coef``, ``model.moe.bias_update_rate``)."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, "model.lr", self.lr, "a learning rate > 0, e.g. 3e-4")
        if self.path is not None:
            self._check_folder_keys()
            return
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads"):
            value = getattr(self, name)
            _require(value >= 1, f"model.{name}", value, "an integer >= 1")
        _require(
            self.hidden_size % self.num_heads == 0,
            "model.num_heads",
            self.num_heads,
            f"a divisor of model.hidden_size={self.hidden_size}",
        )
        _require(
            1 <= self.num_kv_heads <= self.num_heads and self.num_heads % self.num_kv_heads == 0,
            "model.num_kv_heads",
            self.num_kv_heads,
            f"a divisor of model.num_heads={self.num_heads}",
        )
        _require(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "0 <= dropout < 1")
        _require(
            1 <= self.num_experts_per_tok <= self.n_routed_experts,
            "model.num_experts_per_tok",
            self.num_experts_per_tok,
            f"1..model.n_routed_experts={self.n_routed_experts}",
        )

    def _check_folder_keys(self) -> None:
        _require(
            bool(self.path), "model.path", self.path,
            "a Hugging Face model folder (model=pretrained model.path=/shared/models/NAME), or null for the built-in model",
        )
        defaults = _model_defaults()
        for name in FOLDER_ARCHITECTURE_KEYS:
            value = getattr(self, name)
            _require(
                value == defaults[name],
                f"model.{name}",
                value,
                f"its default ({defaults[name]!r}) with model.path={self.path}: the architecture comes from "
                "the folder's config.json (model=pretrained leaves every such key at its default)",
            )


FOLDER_ARCHITECTURE_KEYS: tuple[str, ...] = (
    "arch", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
    "max_position_embeddings", "dropout", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
    "moe_intermediate_size", "first_k_dense_replace", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "v_head_dim",
)
"""The ``model.*`` keys of the built-in architecture: with ``model.path`` the folder's ``config.json``
sets them, so each must keep its default."""


@functools.cache
def _model_defaults() -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(ModelConfig)}
