"""What a checkpoint holds of a model: what trains, never a frozen base.

In full fine-tuning or pretraining that is every parameter and buffer; under LoRA (``model.peft=lora``),
the adapters and the base's persistent buffers (a few numbers a layer, such as the MoE router's bias).
Both are ``torch.distributed.checkpoint.state_dict``'s model state dict with ``ignore_frozen_params``,
which works alike on a plain module, the module inside DDP and an FSDP2-sharded one; with FSDP2 its
tensors are DTensors and DCP writes each rank's shards.

``base_model_identity`` is what a checkpoint names as the model it was trained from, so that a resume
and an export know which base its adapters (or its fine-tuned weights) belong to.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from hpcsweep.config import ModelConfig
from hpcsweep.model.record import ModelRecord, read_model_record

_TRAINED = StateDictOptions(ignore_frozen_params=True)
# Loading: the frozen base is missing from what was saved, by design (checked below, not by strict).
_LOAD_TRAINED = StateDictOptions(ignore_frozen_params=True, strict=False)


def trained_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """The model's state dict without its frozen parameters."""
    return get_model_state_dict(model, options=_TRAINED)


def load_trained_state_dict(model: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """Load what ``trained_state_dict`` gave into ``model``; ``ValueError`` when a key is unknown or a
    trainable parameter is missing."""
    expected = set(trained_state_dict(model))
    unexpected, missing = sorted(set(state) - expected), sorted(expected - set(state))
    if unexpected or missing:
        raise ValueError(
            f"the saved weights do not fit this model: {len(missing)} missing (first {missing[:3]}), "
            f"{len(unexpected)} unknown (first {unexpected[:3]}); was it trained with other model.* or model.lora.* keys?"
        )
    set_model_state_dict(model, dict(state), options=_LOAD_TRAINED)


def base_model_identity(cfg: ModelConfig, record: ModelRecord | None = None) -> dict[str, Any]:
    """The identity of the base model a trial trains from, as its checkpoints and exports record it.

    Empty for a model built from the config: the trial's ``config.yaml`` (its ``model.*`` keys and
    ``trainer.seed``) is all there is to it. A model loaded from a folder is named by the folder's
    identity, whose ``path`` (absolute) ``hpcsweep.export`` copies the tokenizer from and names as an
    adapter's base: that of ``record``, the runner's record of the folder (its attempt file), or for a
    worker started without a runner, the folder read here. ``ValueError`` when ``record`` is of
    another folder than ``model.path``.
    """
    if cfg.path is None:
        return {}
    if record is None:
        record = read_model_record(cfg.path)
    elif record.typed != cfg.path:
        raise ValueError(f"the attempt file's model record is of model.path={record.typed}, "
                         f"the trial's config.yaml says model.path={cfg.path}")
    identity = record.identity
    return {**identity, "path": str(Path(identity["path"]).resolve())}
