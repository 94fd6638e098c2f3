"""Which weights of an architecture get LoRA adapters: the one list the trainer (``hpcsweep.train.lora``)
and the memory plan (``hpcsweep.memory_plan``) both read.

Two kinds of target:

- **linear modules** (``DEFAULT_LORA_TARGETS``, by ``config.json``'s ``model_type``): every ``nn.Linear``
  of attention and of the dense and shared-expert MLPs, adapted by peft's ``LoraLayer``;
- **routed experts** (``EXPERT_PARAMETERS``): transformers 5 stores a MoE layer's routed experts fused,
  as two 3-D parameters per layer, not as ``nn.Linear``. With ``model.lora.experts`` (true by default)
  each expert gets a rank-r adapter of its own on both tensors.

Torch-free: the login node plans from it.
"""

from __future__ import annotations

DEFAULT_LORA_TARGETS: dict[str, tuple[str, ...]] = {
    # MLA: queries full rank (q_proj) or low rank (q_a_proj, q_b_proj); the compressed key/value latent
    # (kv_a_proj_with_mqa) and its expansion (kv_b_proj); the output. Then the MLP projections.
    "deepseek_v3": ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                    "gate_proj", "up_proj", "down_proj"),
    "deepseek_v2": ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                    "gate_proj", "up_proj", "down_proj"),
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    # GQA attention with MoE layers: the dense MLPs' and shared experts' linears carry the MLP names
    # (DeepSeek-MoE's remote code, Qwen2-MoE's shared expert; its 1-wide sigmoid gate, like the router,
    # is left alone); Mixtral has no MLP linear at all, only routed experts.
    "deepseek": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "qwen2_moe": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "mixtral": ("q_proj", "k_proj", "v_proj", "o_proj"),
}
"""Adapted linear module names by ``config.model_type``: every linear layer of attention and of the
dense and shared-expert MLPs. Names an architecture does not have (``q_a_proj`` with full-rank
queries) match nothing."""
ALL_LINEAR = "all-linear"
"""peft's name for every ``nn.Linear`` but the output head: the targets of any other architecture."""
EXPERT_PARAMETERS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
"""The fused routed-expert tensors of transformers' MoE layers (``[experts, out, in]`` each)."""


def target_modules(model_type: str, configured: list[str] | None) -> list[str] | str:
    """The linear modules to adapt: ``model.lora.target_modules`` when set, else the architecture's
    defaults, else ``all-linear``."""
    if configured is not None:
        return list(configured)
    defaults = DEFAULT_LORA_TARGETS.get(model_type)
    return list(defaults) if defaults else ALL_LINEAR
