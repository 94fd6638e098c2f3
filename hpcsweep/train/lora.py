"""LoRA adapters through ``peft`` (``model.peft=lora``): only the adapters train, the base stays frozen.

``apply_lora`` wraps a built (or loaded) model in a ``peft`` model before DDP sees it, so DDP registers
only the adapters; the optimizer (``hpcsweep.train.optim``) takes only parameters that need a gradient,
and a checkpoint holds only those (``hpcsweep.train.checkpoint.trained_state``).

Which weights get adapters (``hpcsweep.model.lora_targets``, the one list the memory plan reads too):

- every linear layer of attention and of the dense and shared-expert MLPs (``model.lora.target_modules``,
  null: the architecture's defaults), as peft's ``lora.Linear``;
- with ``model.lora.experts`` (true by default) the routed experts of a MoE model, which transformers 5 stores
  fused as two 3-D parameters per layer (``mlp.experts.gate_up_proj``, ``down_proj``): each expert gets a
  rank-r adapter of its own on both, as peft's ``target_parameters``. ``hpcsweep.train.moe.expert_lora`` computes
  every expert's adapter on the tokens routed to it in grouped GEMMs over the tokens sorted by expert, so
  neither ``W + s·B·A`` nor the expert weight gradient is built;
- a model that runs its folder's own code (DeepSeek-MoE-16B's ``modeling_deepseek.py``) keeps each routed
  expert as three ``nn.Linear`` of its own (``mlp.experts.N.gate_proj``, ``up_proj``, ``down_proj``): the
  target names reach them as they reach the shared experts, one peft ``lora.Linear`` per expert and
  projection, run by that code's own expert loop (not ``expert_lora``). ``model.lora.experts=false``
  leaves them out through peft's ``exclude_modules`` (``hpcsweep.model.lora_targets.excluded_modules``).

peft (0.18 and later) turns the names ``gate_proj``, ``up_proj`` and ``down_proj`` in ``target_modules`` into
``target_parameters`` on those fused tensors for the architectures whose MLP changed from transformers 4 to 5
(DeepSeek-V2/V3, Qwen-MoE), when it builds the adapters and again when it loads them, so on such a model the
dense and shared-expert linears of those names can only be reached by parameter: they are named in
``target_parameters`` as ``gate_proj.weight`` etc. (peft's ``ParamWrapper`` over an ``nn.Linear``, whose
adapter has ``lora.Linear``'s shapes and names). ``expert_lora`` runs them as ``lora.Linear`` does.

peft's ``ParamWrapper`` refuses ``lora_dropout``: when any weight is adapted by parameter, peft builds the
adapters without dropout and ``model.lora.dropout`` is set on every adapter's dropout module afterwards. The
adapter's ``adapter_config.json`` then says ``lora_dropout: 0.0``, which is what inference uses, and keeps it
loadable by ``PeftModel.from_pretrained``.

Adapters start from ``trainer.seed`` (``lora_A`` drawn from the seeded generator, ``lora_B`` zero), so
the same seed gives the same adapters bit for bit on every rank and every run.

Gradient checkpointing needs no input hook: ``hpcsweep.train.trainer`` enables it non-reentrant, which
keeps the graph to the adapters inside a checkpointed layer even though the frozen embedding's output
does not require a gradient (``enable_input_require_grads`` is for the reentrant variant).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from transformers import PretrainedConfig

from hpcsweep.config import ModelConfig
from hpcsweep.model import lora_targets
from hpcsweep.train import model

_ADAPTER_STREAM = 0x10A
"""Keeps the adapters' random stream apart from the base model's initialisation (also from the seed)."""


def adapter_seed(seed: int) -> int:
    """The seed the adapters are drawn from, for ``trainer.seed`` (the same on every rank)."""
    return int(np.random.SeedSequence([seed, _ADAPTER_STREAM]).generate_state(1)[0])


def peft_config(cfg: ModelConfig, net: torch.nn.Module):
    """The ``peft.LoraConfig`` of ``model.lora`` for ``net`` (its targets depend on the modules it holds)."""
    import peft

    modules, parameters = lora_target_spec(net, cfg)
    excluded = lora_targets.excluded_modules((name for name, _ in net.named_modules()), cfg.lora.experts)
    return peft.LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=0.0 if parameters else cfg.lora.dropout,
        target_modules=modules,
        target_parameters=parameters or None,
        exclude_modules=excluded,
        bias="none",
    )


def lora_target_spec(net: torch.nn.Module, cfg: ModelConfig) -> tuple[list[str] | str, list[str]]:
    """``(target_modules, target_parameters)`` for peft: ``hpcsweep.model.lora_targets``'s linear modules, those
    of them that peft would move onto the fused experts named by parameter instead, and with
    ``model.lora.experts`` the fused expert tensors ``net`` has."""
    names = lora_targets.target_modules(net.config.model_type, cfg.lora.target_modules)
    expert_tensors = [p for p in lora_targets.EXPERT_PARAMETERS
                      if any(name.endswith("." + p) for name, _ in net.named_parameters())]
    if not expert_tensors:
        return names, []
    if names == lora_targets.ALL_LINEAR:
        output = net.get_output_embeddings()
        names = sorted({name.rpartition(".")[2] for name, module in net.named_modules()
                        if isinstance(module, torch.nn.Linear) and module is not output})
    by_parameter = [name for name in names if _peft_moves_to_experts(name, net)]
    modules = [name for name in names if name not in by_parameter]
    parameters = [f"{name}.weight" for name in by_parameter]
    return modules, parameters + (expert_tensors if cfg.lora.experts else [])


def _peft_moves_to_experts(name: str, net: torch.nn.Module) -> bool:
    """Whether peft's transformers-5 conversion turns the module name ``name`` into a fused expert parameter
    on ``net``'s architecture (asked of peft itself, one name at a time)."""
    import peft
    from peft.utils.transformers_weight_conversion import convert_peft_config_for_transformers

    probe = peft.LoraConfig(target_modules=[name])
    try:
        convert_peft_config_for_transformers(probe, net, conversions=None)
    except ValueError:
        # peft refuses one half of a fused pair (gate_proj without up_proj): a name it maps onto the experts.
        return True
    return name not in (probe.target_modules or ())


def apply_lora(net: torch.nn.Module, cfg: ModelConfig, *, seed: int) -> torch.nn.Module:
    """``net`` itself for ``model.peft=none``; for ``lora``, a peft model with fresh adapters over it.

    Call before DDP wraps the model, with the model on its device (the adapters follow the layer they
    wrap). Every parameter of the base is frozen.
    """
    if cfg.peft == "none":
        return net
    import peft

    from hpcsweep.train.moe import expert_lora

    torch.manual_seed(adapter_seed(seed))
    config = peft_config(cfg, net)
    with warnings.catch_warnings():
        # peft asks the deprecated spelling of transformers' gradient-checkpointing flag.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        wrapped = peft.get_peft_model(net, config)
    if config.target_parameters:
        expert_lora.use_grouped_forward(wrapped)
        if cfg.lora.dropout:
            _set_dropout(wrapped, cfg.lora.dropout)
    return wrapped


def _set_dropout(net: torch.nn.Module, p: float) -> None:
    """``model.lora.dropout`` on the input of every adapter (peft built them without, see the module doc)."""
    from peft.tuners.lora import LoraLayer

    for module in net.modules():
        if isinstance(module, LoraLayer):
            for adapter in module.lora_dropout:
                module.lora_dropout[adapter] = torch.nn.Dropout(p)


def trainable_parameter_names(net: torch.nn.Module) -> list[str]:
    """The names of the parameters that train (all of them without LoRA; the adapters with it)."""
    return [name for name, param in net.named_parameters() if param.requires_grad]


def training_flops_per_token(
    config: PretrainedConfig, peft: str, seq_len: int, net: torch.nn.Module | None = None
) -> float:
    """Training FLOPs per token that run, for MFU: ``hpcsweep.train.model.flops_per_token``, less under LoRA
    the frozen base's weight gradients (2 x its active parameters), which are never computed (the routed
    experts' included: ``hpcsweep.train.moe.expert_lora`` builds no expert weight gradient), plus the adapters'
    own forward and backward (``adapter_flops_per_token`` of ``net``, the peft model, when given).
    ``config`` is the transformers config of the base (``model.config``).
    """
    full = model.flops_per_token(config, seq_len)
    if peft == "none":
        return full
    # At seq_len 0 the attention term vanishes: what is left is 6 x the active parameters.
    adapters = adapter_flops_per_token(net) if net is not None else 0.0
    return full - model.flops_per_token(config, 0) / 3 + adapters


def adapter_flops_per_token(net: torch.nn.Module) -> float:
    """6 x the adapter parameters one token goes through (forward, input gradient, weight gradient, 2 FLOPs
    a multiply-add each): every adapter of a linear layer, and of a routed expert's adapters the share of the
    experts a token is routed to (``num_experts_per_tok`` of them), fused or one module per expert."""
    from peft.tuners.lora import LoraLayer, ParamWrapper

    top_k = getattr(net.config, "num_experts_per_tok", None)
    routed = model.routed_experts(net.config) or 1
    active = 0.0
    for name, module in net.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        if isinstance(module, ParamWrapper):
            experts = module.num_experts
        else:
            experts = routed if lora_targets.is_routed_expert_module(name) else 1
        share = top_k / experts if experts > 1 and top_k else 1.0
        for adapters in (module.lora_A, module.lora_B):
            active += share * sum(p.numel() for layer in adapters.values() for p in layer.parameters())
    return 6 * active
