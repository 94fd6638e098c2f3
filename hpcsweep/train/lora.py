"""LoRA adapters through ``peft`` (``model.peft=lora``): only the adapters train, the base stays frozen.

``apply_lora`` wraps a built (or loaded) model in a ``peft`` model before DDP sees it, so DDP registers
only the adapters; the optimizer (``hpcsweep.train.optim``) takes only parameters that need a gradient,
and a checkpoint holds only those (``hpcsweep.train.trained_state``).

Which modules get adapters (``model.lora.target_modules``, null: ``hpcsweep.model.lora_targets`` for the
model's architecture): every linear layer of attention and of the MLPs. transformers 5 stores a MoE layer's
routed experts fused, as two 3-D parameters per layer (``mlp.experts.gate_up_proj``, ``down_proj``),
not as ``nn.Linear``. For such a model peft (0.18 and later) turns the names ``gate_proj``, ``up_proj``
and ``down_proj`` into ``target_parameters`` on those fused tensors: every routed expert gets a rank-r
adapter of its own (gate and up together at rank 2r). The dense MLP of the first layers and the shared
experts, whose linears carry the same names, then stay frozen; the adapter's ``adapter_config.json``
records what was adapted.

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


def peft_config(cfg: ModelConfig, model_type: str):
    """The ``peft.LoraConfig`` of ``model.lora``."""
    import peft

    return peft.LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=lora_targets.target_modules(model_type, cfg.lora.target_modules),
        bias="none",
    )


def apply_lora(net: torch.nn.Module, cfg: ModelConfig, *, seed: int) -> torch.nn.Module:
    """``net`` itself for ``model.peft=none``; for ``lora``, a peft model with fresh adapters over it.

    Call before DDP wraps the model, with the model on its device (the adapters follow the layer they
    wrap). Every parameter of the base is frozen.
    """
    if cfg.peft == "none":
        return net
    import peft

    torch.manual_seed(adapter_seed(seed))
    with warnings.catch_warnings():
        # peft checks the rank and alpha patterns of fused experts (gate and up at 2r) against module
        # names, warns that they match nothing, then applies them to the fused parameters all the same.
        warnings.filterwarnings("ignore", r"The following (rank|alpha)_pattern keys did not match", RuntimeWarning)
        # peft asks the deprecated spelling of transformers' gradient-checkpointing flag.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        return peft.get_peft_model(net, peft_config(cfg, net.config.model_type))


def trainable_parameter_names(net: torch.nn.Module) -> list[str]:
    """The names of the parameters that train (all of them without LoRA; the adapters with it)."""
    return [name for name, param in net.named_parameters() if param.requires_grad]


def training_flops_per_token(config: PretrainedConfig, peft: str, seq_len: int) -> float:
    """Training FLOPs per token, for MFU: ``hpcsweep.train.model.flops_per_token``, less under LoRA the
    frozen base's weight gradients (2 x its active parameters), which are never computed. ``config``
    is the transformers config of the base (``model.config``).

    So a LoRA trial's MFU is over the frozen base's forward and backward (activation gradients); the
    adapters' own FLOPs, a few per cent at most, are left out.
    """
    full = model.flops_per_token(config, seq_len)
    if peft == "none":
        return full
    # At seq_len 0 the attention term vanishes: what is left is 6 x the active parameters.
    return full - model.flops_per_token(config, 0) / 3
