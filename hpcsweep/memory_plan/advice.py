"""The plan in words: what it assumed, whether it fits, its breakdown, and the cheapest changes that
would make a trial fit that does not."""

from __future__ import annotations

from dataclasses import replace

from hpcsweep.memory_plan.gpu_memory import GIB, GpuMemory
from hpcsweep.memory_plan.model_shape import ModelShape
from hpcsweep.memory_plan.plan import MemoryPlan, TrainingSetup, fits, plan_memory

MAX_FSDP_GPUS = 4096
"""The largest world size the cheapest-fix search tries."""


def describe(setup: TrainingSetup) -> str:
    """``full fine-tuning, DDP`` / ``LoRA r=8, FSDP over 16 GPUs`` / ``training from scratch, DDP``: what the
    plan assumed, in words."""
    every_weight = "training from scratch" if setup.from_scratch else "full fine-tuning"
    what = f"LoRA r={setup.lora_rank}" if setup.peft == "lora" else every_weight
    how = f"FSDP over {setup.world_size} GPUs" if setup.parallel == "fsdp" else "DDP"
    extra = ", grad checkpointing" if setup.grad_checkpointing else ""
    return f"{what}, {how}{extra}"


def gb_text(nbytes: int) -> str:
    """``~53 GB`` (``~1.5 GB`` under 10 GB): binary GB, as the GPUs' memory is counted."""
    return f"~{nbytes / GIB:.0f} GB" if nbytes >= 10 * GIB else f"~{nbytes / GIB:.1f} GB"


def plan_line(plan: MemoryPlan, setup: TrainingSetup, gpu: GpuMemory | None) -> str:
    """``~53 GB/GPU of 80 per A100 (LoRA r=16, DDP): fits`` (without a GPU: ``not compared``)."""
    if gpu is None:
        return f"{gb_text(plan.total)}/GPU ({describe(setup)}): not compared (the GPUs' memory is unknown)"
    verdict = "fits" if fits(plan, gpu) else "does not fit"
    return f"{gb_text(plan.total)}/GPU of {gpu.gb:.0f} per {gpu.label} ({describe(setup)}): {verdict}"


PART_NOTES = {
    "weights": "the model: fp32 master weights (+ autocast's bf16 copies), or a frozen base in the compute dtype + fp32 adapters",
    "gradients": "fp32, of what trains (DDP over several ranks: its buckets hold a second copy)",
    "optimizer": "AdamW's two fp32 moments (SGD: one, or none), of what trains",
    "activations": "what autograd saves for backward, every layer, batch x seq_len tokens",
    "loss": "the logits and the cross-entropy's fp32 work",
    "temporaries": "the optimizer step's foreach temporary, FSDP's gathered layers, the expert LoRA's products",
    "overhead": "CUDA context, cuBLAS workspaces, NCCL buffers, allocator headroom (CPU: the interpreter)",
}
"""What each part of the breakdown holds, in one line each (``docs/user/memory-plan.md`` has the formulas)."""


def _count(n: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def breakdown_lines(plan: MemoryPlan, setup: TrainingSetup, gpu: GpuMemory | None) -> list[str]:
    """The plan part by part, in GB (and bytes a parameter for the states: the weights per parameter,
    gradients and optimizer per trained one), then its total line."""
    lines = [f"parameters   {_count(plan.total_parameters)} total, {_count(plan.active_parameters)} active a token, "
             f"{_count(plan.trainable_parameters)} trained"]
    per = {"weights": plan.total_parameters, "gradients": plan.trainable_parameters,
           "optimizer": plan.trainable_parameters}
    for name, nbytes in plan.parts.items():
        rate = f"{nbytes / per[name]:5.1f} B/param" if per.get(name) else " " * 13
        lines.append(f"{name:<12} {nbytes / GIB:9.2f} GB  {rate}  {PART_NOTES[name]}")
    lines.append(f"{'total':<12} {plan.total / GIB:9.2f} GB  {' ' * 13}  {plan_line(plan, setup, gpu)}")
    return lines


def cheapest_fixes(shape: ModelShape, setup: TrainingSetup, gpu: GpuMemory, gpus_per_node: int) -> list[str]:
    """The changes that would make a trial fit, cheapest first, each with its estimate.

    Tried: LoRA (for a fine-tuning: adapters over random weights train nothing worth having); FSDP at
    the smallest world size that fits (in whole nodes of ``gpus_per_node``); gradient checkpointing;
    the largest ``data.batch_size`` that fits. Empty when nothing fits.
    """
    fixes = []
    if setup.peft != "lora" and not setup.from_scratch:
        lora = plan_memory(shape, replace(setup, peft="lora"))
        if fits(lora, gpu):
            fixes.append(f"use model.peft=lora ({gb_text(lora.total)})")
    per_node = max(gpus_per_node, 1)
    least = setup.world_size + 1 if setup.parallel == "fsdp" else 2
    # Within a node any number of GPUs; beyond it, whole nodes.
    worlds = [*range(least, per_node + 1), *range(max(2 * per_node, least), MAX_FSDP_GPUS + 1, per_node)]
    checkpointed = plan_memory(shape, replace(setup, grad_checkpointing=True))
    # FSDP shards the states, not the activations: with too many of those it needs checkpointing too
    # (named only when checkpointing alone would not do).
    variants = [(setup.grad_checkpointing, "")]
    if not setup.grad_checkpointing and not fits(checkpointed, gpu):
        variants.append((True, " and trainer.grad_checkpointing=true"))
    for checkpointing, also in variants:
        sharded = replace(setup, parallel="fsdp", grad_checkpointing=checkpointing)
        world = next((w for w in worlds if fits(plan_memory(shape, replace(sharded, world_size=w)), gpu)), None)
        if world is not None:
            nodes = -(-world // per_node)
            where = f" (trainer.nodes={nodes})" if nodes > 1 else ""
            fixes.append(f"trainer.parallel=fsdp{also} over >= {world} GPUs{where}")
            break
    if not setup.grad_checkpointing and fits(checkpointed, gpu):
        fixes.append(f"trainer.grad_checkpointing=true ({gb_text(checkpointed.total)})")
    batch = setup.batch_size // 2
    while batch >= 1 and not fits(plan_memory(shape, replace(setup, batch_size=batch)), gpu):
        batch //= 2
    if batch >= 1:
        fixes.append(f"data.batch_size={batch} (raise trainer.grad_accum to keep the tokens per step)")
    return fixes


def refusal_line(
    num: int, shape: ModelShape, setup: TrainingSetup, plan: MemoryPlan, gpu: GpuMemory, gpus_per_node: int
) -> str:
    """``trial #3: ~262 GB/GPU (full fine-tuning, DDP) > 80 GB per A100: use model.peft=lora (~35 GB), or ...``."""
    fixes = cheapest_fixes(shape, setup, gpu, gpus_per_node)
    advice = ", or ".join(fixes) if fixes else "no change tried fits (LoRA, FSDP, checkpointing, a smaller batch)"
    return (
        f"trial #{num}: {gb_text(plan.total)}/GPU ({describe(setup)}) > {gpu.gb:.0f} GB per {gpu.label}: {advice}"
    )
