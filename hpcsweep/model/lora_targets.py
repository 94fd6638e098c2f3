"""Which weights of an architecture get LoRA adapters: the one list the trainer (``hpcsweep.train.lora``)
and the memory plan (``hpcsweep.memory_plan``) both read.

Two kinds of target:

- **linear modules** (``DEFAULT_LORA_TARGETS``, by ``config.json``'s ``model_type``): every ``nn.Linear``
  of attention and of the dense and shared-expert MLPs, adapted by peft's ``LoraLayer``;
- **routed experts**, in one of two layouts. transformers 5 stores a MoE layer's routed experts fused,
  as two 3-D parameters per layer (``EXPERT_PARAMETERS``), not as ``nn.Linear``: with
  ``model.lora.experts`` (true by default) each expert gets a rank-r adapter of its own on both tensors.
  A model folder's own code (``auto_map``: DeepSeek-MoE's ``modeling_deepseek.py``, DeepSeek-V2/V3's)
  keeps each routed expert as a module of its own, ``mlp.experts.N.gate_proj`` / ``up_proj`` /
  ``down_proj`` (``ROUTED_EXPERT_MODULES``): those are linear modules, adapted by their names like any
  other, and ``model.lora.experts=false`` excludes them (``excluded_modules``).

``adapts_module`` is the rule both layouts' linear modules follow, as peft applies the trainer's
``target_modules`` and ``exclude_modules``; the memory plan counts by it. Torch-free: the login node plans
from it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

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
    # is left alone), and so do DeepSeek-MoE's routed experts, one module each (ROUTED_EXPERT_MODULES);
    # Mixtral has no MLP linear at all, only routed experts.
    "deepseek": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "qwen2_moe": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "mixtral": ("q_proj", "k_proj", "v_proj", "o_proj"),
}
"""Adapted linear module names by ``config.model_type``: every linear layer of attention and of the
dense and shared-expert MLPs. Names an architecture does not have (``q_a_proj`` with full-rank
queries) match nothing."""
ALL_LINEAR = "all-linear"
"""peft's name for every ``nn.Linear`` but the output head: the targets of any other architecture."""
EXPERT_TENSORS = ("gate_up_proj", "down_proj")
"""The fused routed-expert tensors of transformers' MoE layers, by their names on the experts module
(``[experts, out, in]`` each), in the order they run."""
EXPERT_PARAMETERS = tuple(f"mlp.experts.{name}" for name in EXPERT_TENSORS)
"""The same tensors by their path in a decoder layer: peft's ``target_parameters``."""


def target_modules(model_type: str, configured: list[str] | None) -> list[str] | str:
    """The linear modules to adapt: ``model.lora.target_modules`` when set, else the architecture's
    defaults, else ``all-linear``."""
    if configured is not None:
        return list(configured)
    defaults = DEFAULT_LORA_TARGETS.get(model_type)
    return list(defaults) if defaults else ALL_LINEAR


ROUTED_EXPERT_MODULES = r"(?:.*\.)?experts\.\d+\..+"
"""A module inside one routed expert, where a model keeps each expert as a module of its own
(``model.layers.1.mlp.experts.7.gate_proj``), as a full-match regex: peft's ``exclude_modules`` for
``model.lora.experts=false``. The shared experts (``mlp.shared_experts.*``) and the dense MLPs are
not routed experts and stay adapted."""


def is_routed_expert_module(name: str) -> bool:
    """Whether the module ``name`` (a dotted path) is one routed expert's, or inside one."""
    return re.fullmatch(ROUTED_EXPERT_MODULES, name) is not None


def excluded_modules(module_names: Iterable[str], experts: bool) -> str | None:
    """peft's ``exclude_modules`` for ``model.lora.experts``: with it false, the routed experts' own
    modules when ``module_names`` (the model's) has any; else None (there is nothing to exclude, and
    peft warns of an exclusion that excluded nothing)."""
    if experts or not any(is_routed_expert_module(name) for name in module_names):
        return None
    return ROUTED_EXPERT_MODULES


def adapts_module(name: str, targets: list[str] | tuple[str, ...] | str, *, experts: bool) -> bool:
    """Whether LoRA adapts the linear module ``name`` (its dotted path in the model, or in a decoder
    layer): peft's match of ``target_modules`` (the path is a target or ends in ``.target``;
    ``all-linear``: any linear but the LM head), less the routed experts' own modules without
    ``experts`` (``excluded_modules``). The fused expert tensors are parameters, not modules: they are
    ``EXPERT_PARAMETERS``'s."""
    if not experts and is_routed_expert_module(name):
        return False
    if targets == ALL_LINEAR:
        return name.rpartition(".")[2] != "lm_head"
    return any(name == target or name.endswith("." + target) for target in targets)
