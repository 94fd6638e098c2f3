"""The ``model.moe`` group: the router balance of a MoE model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .validation import _require


@dataclass(kw_only=True)
class MoeConfig:
    """Router balance of a MoE model (``hpcsweep.train.moe.load_balance``; docs/user/moe.md). A dense model
    ignores it."""

    aux_loss_coef: float | None = None
    """Weight of the auxiliary balance loss added to the training loss, as the architecture's authors
    define it (DeepSeek-MoE/V2/V3: the sequence-wise loss of ``aux_loss_alpha`` and ``seq_aux``; Mixtral
    and Qwen-MoE: transformers' ``load_balancing_loss_func``). null: the folder's own value
    (``aux_loss_alpha`` or ``router_aux_loss_coef`` in its config.json; none there: off), and under
    ``model.peft=lora`` for a router with DeepSeek-V3's bias at least 0.3 (its bias update is then off;
    ``load_balance.LORA_BIAS_ROUTER_AUX_LOSS_COEF``); 0: off."""
    bias_update_rate: float = 0.001
    """DeepSeek-V3's aux-loss-free balance (routers with an ``e_score_correction_bias``): before each
    optimizer step each expert's bias moves by this much toward the mean load (its tokens summed over
    every rank). DeepSeek-V3's paper uses 0.001; 0: off. Off under ``model.peft=lora`` (the base is frozen;
    the aux loss stands in for it)."""

    def __post_init__(self) -> None:
        _require(
            self.aux_loss_coef is None or (math.isfinite(self.aux_loss_coef) and self.aux_loss_coef >= 0),
            "model.moe.aux_loss_coef", self.aux_loss_coef,
            "null (the model folder's own value), 0 (off) or a number > 0, e.g. 0.001",
        )
        _require(
            math.isfinite(self.bias_update_rate) and self.bias_update_rate >= 0,
            "model.moe.bias_update_rate", self.bias_update_rate, "0 (off) or a number > 0, e.g. 0.001",
        )
