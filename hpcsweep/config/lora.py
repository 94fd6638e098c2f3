"""The ``model.lora`` group: the settings of LoRA adapters."""

from __future__ import annotations

from dataclasses import dataclass

from .validation import _require


@dataclass(kw_only=True)
class LoraConfig:
    """LoRA adapters through ``peft`` (``model.peft=lora``; see ``hpcsweep.train.lora``)."""

    r: int = 16
    """Rank of each adapter (its ``A`` is r x in, its ``B`` out x r)."""
    alpha: float = 32.0
    """Scale: an adapter adds ``alpha / r`` times ``B @ A`` to its layer's output."""
    dropout: float = 0.0
    """Dropout on each adapter's input."""
    target_modules: list[str] | None = None
    """Names of the modules that get adapters (peft's ``target_modules``: a name matches a module
    whose own name or dotted tail equals it). null: every linear layer of attention and of the MLPs,
    named for the model's architecture (``hpcsweep.model.lora_targets.DEFAULT_LORA_TARGETS``)."""
    experts: bool = True
    """Whether a MoE model's routed experts get adapters too: a rank-r adapter per expert on its fused
    ``gate_up_proj`` and ``down_proj``, run on the tokens routed to it (``hpcsweep.train.moe.expert_lora``).
    false: only ``target_modules`` (attention, dense and shared-expert MLPs) train."""

    def __post_init__(self) -> None:
        _require(self.r >= 1, "model.lora.r", self.r, "an integer >= 1, e.g. 16")
        _require(self.alpha > 0, "model.lora.alpha", self.alpha, "a number > 0, e.g. 2 x model.lora.r")
        _require(0.0 <= self.dropout < 1.0, "model.lora.dropout", self.dropout, "0 <= dropout < 1")
        _require(
            self.target_modules is None or (len(self.target_modules) > 0 and all(self.target_modules)),
            "model.lora.target_modules",
            self.target_modules,
            "null (every attention and MLP linear layer) or a non-empty list of module names, e.g. [q_proj, o_proj]",
        )
