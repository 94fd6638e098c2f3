"""A trial's shape and training setup, read from its config (so that fields other branches add are
optional): what the plan is computed from, on the login node and on each worker alike.

A pretrained folder's sizes come from its record (``hpcsweep.model.record.ModelRecord``), read once for a
whole sweep on the login node and once per attempt on a node; a caller without one has the folder read here.
"""

from __future__ import annotations

from typing import Any

from hpcsweep.memory_plan.model_shape import ModelShape, shape_from_hf_config, shape_from_model_config
from hpcsweep.memory_plan.plan import AUTO, TrainingSetup
from hpcsweep.model.folder import read_model_folder
from hpcsweep.model.record import ModelRecord


def shape_of_trial(model: Any, record: ModelRecord | None = None) -> ModelShape:
    """The shape of a trial's ``model`` group: its pretrained folder's ``config.json`` when
    ``model.path`` is set (as ``record`` holds it; without one, read now), else the config's own sizes."""
    if not model.path:
        return shape_from_model_config(model)
    config = read_model_folder(model.path).config if record is None else record.config
    return shape_from_hf_config(config)


def setup_of_trial(
    trial: Any, *, world_size: int, device: str, bf16: bool = True, record: ModelRecord | None = None
) -> TrainingSetup:
    """The ``TrainingSetup`` of a ``TrialConfig`` on ``world_size`` workers of ``device``.

    ``precision=auto`` is bf16 on a GPU with bf16 tensor cores, else fp32 (as
    ``hpcsweep.train.gpu_choices`` resolves it); ``model.attn_implementation=auto`` is fused on
    CUDA (SDPA's mask planned for packed rows, where flash-attention needs none), eager on CPU and for
    packed rows of a model whose own code builds its mask. ``model.lora.target_modules=null`` counts adapters on the architecture's
    targets (``hpcsweep.model.lora_targets``), and the routed experts' unless ``model.lora.experts=false``.
    ``trainer.loss_chunk_tokens`` null: :data:`~hpcsweep.memory_plan.plan.AUTO`, resolved by the plan as
    the trainer resolves it; absent: the loss over the whole batch's fp32 logits. ``record``: the
    pretrained folder as read once (``mapped_weights_bytes``).
    """
    model, trainer, data = trial.model, trial.trainer, trial.data
    precision = trainer.precision
    if precision == "auto":
        precision = "bf16" if device == "cuda" and bf16 else "fp32"
    targets = model.lora.target_modules
    attention = model.attn_implementation
    packed = bool(getattr(data, "packing", False))
    # Whose code builds the mask matters only for packed rows (whole rows need no mask of hpcsweep's).
    own_code = packed and bool(model.path) and (
        read_model_folder(model.path) if record is None else record).needs_remote_code
    return TrainingSetup(
        precision=precision, optimizer=trainer.optimizer, momentum=trainer.momentum,
        peft=model.peft, lora_rank=model.lora.r,
        lora_targets=None if targets is None else (targets,) if isinstance(targets, str) else tuple(targets),
        lora_experts=getattr(model.lora, "experts", True),
        grad_checkpointing=trainer.grad_checkpointing, batch_size=data.batch_size, seq_len=data.seq_len,
        # A DPO micro-batch is data.batch_size pairs: two sequences each. Under LoRA the reference's forward runs
        # without gradients before the policy's and keeps nothing, so the policy's rows bound the activations.
        rows_per_item=2 if getattr(getattr(trial, "objective", None), "kind", "next_token") == "dpo" else 1,
        parallel=trainer.parallel, world_size=world_size, device=device,
        fused_attention=attention != "eager" and (attention != "auto" or (device == "cuda" and not (packed and own_code))),
        flash_attention=attention == "flash_attention_2", packed_rows=packed, own_code=own_code,
        from_scratch=not model.path or bool(getattr(model, "random_init", False)),
        loss_chunk_tokens=_loss_chunk_setting(trainer),
        reshard_after_forward=getattr(trainer, "fsdp_reshard_after_forward", True),
        mapped_weights_bytes=mapped_weights_bytes(model, record) if device == "cpu" else 0,
    )


def _loss_chunk_setting(trainer: Any) -> int | str | None:
    if not hasattr(trainer, "loss_chunk_tokens"):
        return None
    return AUTO if trainer.loss_chunk_tokens is None else trainer.loss_chunk_tokens


def mapped_weights_bytes(model: Any, record: ModelRecord | None = None) -> int:
    """The bytes of the safetensors files a trial of ``model`` loads (0: built from its config, or
    ``model.random_init``), as ``record`` holds them; without one, read now."""
    if not model.path or getattr(model, "random_init", False):
        return 0
    if record is not None:
        return record.weights_bytes
    folder = read_model_folder(model.path)
    return sum((folder.path / name).stat().st_size for name in folder.weight_files)
