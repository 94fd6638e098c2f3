"""A trial's memory per GPU, estimated from its config alone: on the login node, before submit.

Pure arithmetic, no torch, one idea a module:

- ``model_shape``: a decoder's sizes (from a ``ModelConfig`` or a ``config.json``) and its parameters
  counted from them, LoRA adapters included (the targets are ``hpcsweep.model.lora_targets``'s);
- ``plan``: the ``TrainingSetup`` and the ``MemoryPlan`` per GPU, part by part (``plan_memory``);
- ``advice``: the plan in words (its line at submit, its breakdown) and the cheapest changes that
  would make a refused trial fit;
- ``trial_setup``: a trial's shape and setup read from its config;
- ``gpu_memory``: the memory of the GPUs a trial will get.

``docs/user/memory-plan.md`` gives the derivation. May import only ``config`` and ``model``; never a
stage or a command module.
"""

from hpcsweep.memory_plan.advice import (
    breakdown_lines,
    cheapest_fixes,
    describe,
    gb_text,
    plan_line,
    refusal_line,
)
from hpcsweep.memory_plan.plan import (
    CPU_OVERHEAD_BYTES,
    GPU_OVERHEAD_BYTES,
    MemoryPlan,
    TrainingSetup,
    activation_bytes,
    activation_bytes_per_token,
    fits,
    loss_bytes,
    plan_memory,
    plan_record,
    resolve_parallel,
)
from hpcsweep.memory_plan.trial_setup import setup_of_trial, shape_of_trial

__all__ = [
    "CPU_OVERHEAD_BYTES", "GPU_OVERHEAD_BYTES", "MemoryPlan", "TrainingSetup", "activation_bytes",
    "activation_bytes_per_token", "breakdown_lines", "cheapest_fixes", "describe", "fits", "gb_text",
    "loss_bytes", "plan_line", "plan_memory", "plan_record", "refusal_line", "resolve_parallel",
    "setup_of_trial", "shape_of_trial",
]
