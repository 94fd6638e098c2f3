"""Which architectures' logits are their LM head's output, unchanged: a fact of the model code.

The trainer may then take the training loss at the head itself (``hpcsweep.train.head_loss``): a chunk
of tokens' logits at a time from the hidden states, so that no logits tensor of the whole batch is
ever made. An architecture that scales or soft-caps its logits after the head (Gemma 2's
``final_logit_softcapping``, Cohere's ``logit_scale``, Granite's ``logits_scaling``) is not listed:
its loss goes through the logits (``hpcsweep.train.loss``). The memory plan reads the same list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PLAIN_HEAD_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3",
    "olmoe", "phi3",
    # DeepSeek-MoE's remote code (modeling_deepseek.py): ``logits = self.lm_head(hidden_states).float()``.
    "deepseek",
})
"""``config.json`` ``model_type`` values whose causal-LM forward returns ``lm_head(hidden_states)`` as
the logits (checked against transformers' modeling files; the ``.float()`` of DeepSeek-MoE changes no value)."""

LOGIT_TRANSFORM_KEYS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")
"""config.json keys of a transformation applied to the logits after the head: any set, the loss takes the logits."""


def logits_are_the_heads(model_type: str, config: Mapping[str, Any] | None = None) -> bool:
    """Whether a model of ``model_type`` (with ``config.json``'s keys ``config``) returns its head's output as logits."""
    if model_type not in PLAIN_HEAD_MODEL_TYPES:
        return False
    return not any((config or {}).get(key) not in (None, 1, 1.0) for key in LOGIT_TRANSFORM_KEYS)
