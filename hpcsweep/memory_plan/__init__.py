"""A trial's memory per GPU, estimated from its config alone: on the login node, before submit.

Pure arithmetic over a ``ModelShape`` (``hpcsweep.memory_plan.model_shape``) and a ``TrainingSetup``,
compared with a ``GpuMemory`` (``hpcsweep.memory_plan.gpu_memory``); no torch.
The parts, per GPU (``docs/user/memory-plan.md`` gives the derivation):

- **weights**: fp32 master weights (4 B/param; a LoRA base is frozen in bf16 under bf16/fp16, 2 B),
  plus the bf16 copies autocast makes of every linear weight and autograd keeps until backward (2 B);
- **gradients**: fp32, of what trains (4 B/param), twice under multi-process DDP, whose buckets hold
  a second copy (``gradient_as_bucket_view=False``, PyTorch's default);
- **optimizer**: AdamW/Adam two fp32 moments (8 B/param), SGD one momentum buffer (4 B) or none,
  plus the foreach step's temporary (4 B/param);
- **activations**: what autograd saves for backward, per token and layer, counted tensor by tensor
  for transformers' Llama and DeepSeek (MLA, MoE) modules (``activation_bytes``);
- **overhead**: the CUDA context, cuBLAS workspaces and NCCL buffers, ``GPU_OVERHEAD_BYTES``.

FSDP divides weights, gradients and optimizer states by the world size and adds what it gathers
unsharded at once: the root (embeddings, LM head) and two decoder layers (one prefetched) in the
compute dtype, and one layer's fp32 gradient for the reduce-scatter.

May import only ``config`` and ``model``; never a stage or a command module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hpcsweep.memory_plan.gpu_memory import GIB, GpuMemory
from hpcsweep.memory_plan.model_shape import (
    ModelShape,
    active_parameters,
    largest_layer_parameters,
    lora_parameters,
    root_parameters,
    shape_from_hf_config,
    shape_from_model_config,
    total_parameters,
)
from hpcsweep.model.folder import read_model_folder

GPU_OVERHEAD_BYTES = 2 * GIB
"""CUDA context with lazy module loading (~0.5 GB on A100/H100 with CUDA 12), cuBLAS workspaces
(a few MiB per stream), NCCL's channel buffers (``NCCL_BUFFSIZE`` 4 MiB per channel and peer: ~0.5 GB
for 8 GPUs a node over InfiniBand), and headroom for the caching allocator's fragmentation."""
CPU_OVERHEAD_BYTES = 1 * GIB
"""A CPU worker's interpreter with torch and transformers imported (its resident set before a model)."""
DEFAULT_LORA_TARGETS = (
    "q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
    "gate_proj", "up_proj", "down_proj",
)
"""Every ``nn.Linear`` of attention and the dense/shared-expert MLPs (routed experts are 3D tensors)."""
DEFAULT_LORA_RANK = 8


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """What decides a trial's memory besides its model's shape."""

    precision: str
    """Resolved: ``bf16``, ``fp16`` (autocast over fp32 weights) or ``fp32``."""
    optimizer: str = "adamw"
    momentum: float = 0.9
    peft: str = "none"
    lora_rank: int = DEFAULT_LORA_RANK
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    grad_checkpointing: bool = False
    batch_size: int
    seq_len: int
    parallel: str = "ddp"
    """``ddp`` or ``fsdp`` (``auto`` is resolved by ``resolve_parallel``)."""
    world_size: int = 1
    device: str = "cuda"
    fused_attention: bool = True
    """sdpa or flash attention (no score matrix kept); false: eager attention, which keeps it."""
    from_scratch: bool = False
    """No pretrained weights (a built-in model, or ``model.random_init=true``): training, not fine-tuning."""


@dataclass(frozen=True)
class MemoryPlan:
    """A trial's estimated peak memory per GPU, by part, in bytes."""

    total_parameters: int
    active_parameters: int
    trainable_parameters: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    overhead: int

    @property
    def tensors(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` measures: every part but the fixed overhead."""
        return self.weights + self.gradients + self.optimizer + self.activations

    @property
    def total(self) -> int:
        return self.tensors + self.overhead


def _compute_bytes(setup: TrainingSetup) -> int:
    return 4 if setup.precision == "fp32" else 2


def activation_bytes_per_token(shape: ModelShape, setup: TrainingSetup) -> dict[str, float]:
    """Bytes autograd saves per token: one decoder layer of each kind (``attention``, ``dense_mlp``,
    ``moe_mlp``), and the head (final norm, LM head, the loss on fp32 logits).

    Counted tensor by tensor from transformers' modules under autocast over fp32 weights: the
    residual stream and each RMSNorm's input and normalised output are fp32 (8 B x width); every
    linear saves its input in the compute dtype, cast once per consumer under autocast (``e`` = 2)
    or shared in fp32 (``e`` = 4); a gated MLP saves gate, act(gate), up and their product (4e x width);
    fused attention saves q, k, v, its output and the log-sum-exp, eager attention also the fp32
    softmax and its ``e``-byte copy (``(4 + e) x heads x seq``). Same method as Korthikanti et al.,
    "Reducing Activation Recomputation in Large Transformer Models" (2022), sec. 4.1, whose GPT
    block gives ``34·h + 5·a·s`` bytes per token in 16-bit; here it is applied to these modules.
    """
    e, h, n, s = _compute_bytes(setup), shape.hidden_size, shape.num_heads, setup.seq_len
    mixed = setup.precision != "fp32"

    def linear_inputs(consumers: int, width: int) -> float:
        return (consumers * e if mixed else 4) * width

    def norm(width: int, consumers: int) -> float:  # an RMSNorm on the fp32 residual, then its linears
        return 8 * width + linear_inputs(consumers, width)

    def low_rank_norm(width: int) -> float:  # an RMSNorm on a 16-bit latent (MLA), then one linear
        return (4 + 2 * e) * width

    def gated_mlp(width: int) -> float:
        return 4 * e * width

    def attention_core(q: int, k: int, v: int, out: int) -> float:
        if setup.fused_attention:  # q, k, v, the output and the fp32 log-sum-exp per head
            return e * (q + k + v + out) + 4 * n
        return e * (q + k + v) + (4 + e) * n * s  # q, k, v, the fp32 softmax and its e-byte copy

    if shape.is_mla:
        qk = shape.qk_nope_head_dim + shape.qk_rope_head_dim
        query = 0.0 if shape.q_lora_rank is None else low_rank_norm(shape.q_lora_rank)
        # Fused attention keeps v as a view of kv_b_proj's output, so all of it (nope + v per head);
        # eager attention keeps a contiguous copy of v alone.
        value = n * (shape.qk_nope_head_dim + shape.v_head_dim) if setup.fused_attention else n * shape.v_head_dim
        attention = (
            norm(h, 2) + query + low_rank_norm(shape.kv_lora_rank)
            + attention_core(n * qk, n * qk, value, n * shape.v_head_dim)
            + e * n * shape.v_head_dim  # o_proj's input: the output made contiguous
        )
    else:
        width = n * shape.head_dim  # k and v repeated to every head (repeat_kv) before attention
        attention = norm(h, 3) + attention_core(width, width, width, width) + e * width
    dense = norm(h, 2) + gated_mlp(shape.intermediate_size)
    k = shape.num_experts_per_tok
    moe = (
        # The router and the shared experts' gate and up read the norm's output.
        norm(h, 3)
        + 8 * shape.n_routed_experts  # router logits and scores, fp32
        # transformers' grouped_mm experts run in the weights' dtype, fp32, whatever autocast says:
        # each token-expert keeps its fp32 input, gate/up, act, product, and output (for its weight).
        + k * (16 * shape.moe_intermediate_size + 8 * h)
        + gated_mlp(shape.moe_intermediate_size * shape.n_shared_experts)
    )
    # The loss: lm_head's logits (e), their fp32 copy (.float()), log-softmax's fp32 output, and in
    # backward its fp32 gradient beside them: 12 bytes a vocabulary entry at the peak.
    head = norm(h, 1) + 12 * shape.vocab_size
    return {"attention": attention, "dense_mlp": dense, "moe_mlp": moe if shape.moe_layers else 0.0, "head": head}


def activation_bytes(shape: ModelShape, setup: TrainingSetup) -> int:
    """Activations per GPU: every layer's saved tensors for ``batch_size x seq_len`` tokens; with
    gradient checkpointing only each layer's fp32 input, plus one layer recomputed in backward."""
    per = activation_bytes_per_token(shape, setup)
    tokens = setup.batch_size * setup.seq_len
    layers = [per["attention"] + (per["moe_mlp"] if shape.is_moe_layer(i) else per["dense_mlp"])
              for i in range(shape.num_layers)]
    inside = max(layers) + 4 * shape.hidden_size * shape.num_layers if setup.grad_checkpointing else sum(layers)
    mask = 0 if setup.fused_attention else 4 * setup.batch_size * setup.seq_len**2  # eager's causal mask
    return int(tokens * (inside + per["head"]) + mask)


def plan_memory(shape: ModelShape, setup: TrainingSetup) -> MemoryPlan:
    """The per-GPU memory of training ``shape`` with ``setup`` (see the module docstring)."""
    total, world = total_parameters(shape), setup.world_size
    lora = setup.peft == "lora"
    trainable = lora_parameters(shape, setup.lora_rank, setup.lora_targets) if lora else total
    mixed = setup.precision != "fp32"
    e = _compute_bytes(setup)
    base = total * (e if lora else 4)
    trained_weights = trainable * 4 if lora else 0
    # autocast's bf16 copies of the fp32 weights (a 16-bit frozen base needs none).
    copies = 0 if (lora or not mixed) else 2 * total
    states = {"adamw": 8, "adam": 8}.get(setup.optimizer, 4 if setup.momentum else 0) * trainable
    step_temporary = 4 * trainable if states else 0
    gradients = 4 * trainable
    if setup.parallel == "fsdp" and world > 1:
        block, root = largest_layer_parameters(shape), root_parameters(shape)
        gathered = e * (root + 2 * block) + 4 * max(block, root)
        weights = -(-(base + trained_weights) // world) + gathered
        gradients = -(-gradients // world)
        states, step_temporary = -(-states // world), -(-step_temporary // world)
    else:
        weights = base + trained_weights + copies
        if world > 1:
            gradients *= 2  # DDP's buckets hold a copy of every gradient
    overhead = GPU_OVERHEAD_BYTES if setup.device == "cuda" else CPU_OVERHEAD_BYTES
    return MemoryPlan(
        total_parameters=total, active_parameters=active_parameters(shape), trainable_parameters=trainable,
        weights=weights, gradients=gradients, optimizer=states + step_temporary,
        activations=activation_bytes(shape, setup), overhead=overhead,
    )


def fits(plan: MemoryPlan, gpu: GpuMemory) -> bool:
    """Whether the plan's total stays within one GPU's memory."""
    return plan.total <= gpu.bytes


def resolve_parallel(shape: ModelShape, setup: TrainingSetup, gpu: GpuMemory | None) -> str:
    """``trainer.parallel=auto``: ``ddp`` when the DDP plan fits the GPU (or the GPU is unknown), else ``fsdp``."""
    if gpu is None or setup.world_size == 1:
        return "ddp"
    return "ddp" if fits(plan_memory(shape, replace(setup, parallel="ddp")), gpu) else "fsdp"


def describe(setup: TrainingSetup) -> str:
    """``full fine-tuning, DDP`` / ``LoRA r=8, FSDP over 16 GPUs`` / ``training from scratch, DDP``: what the
    plan assumed, in words."""
    every_weight = "training from scratch" if setup.from_scratch else "full fine-tuning"
    what = f"LoRA r={setup.lora_rank}" if setup.peft == "lora" else every_weight
    how = f"FSDP over {setup.world_size} GPUs" if setup.parallel == "fsdp" else "DDP"
    extra = ", grad checkpointing" if setup.grad_checkpointing else ""
    return f"{what}, {how}{extra}"


def _gb(nbytes: int) -> str:
    return f"~{nbytes / GIB:.0f} GB" if nbytes >= 10 * GIB else f"~{nbytes / GIB:.1f} GB"


MAX_FSDP_GPUS = 4096
"""The largest world size the cheapest-fix search tries."""


def cheapest_fixes(shape: ModelShape, setup: TrainingSetup, gpu: GpuMemory, gpus_per_node: int) -> list[str]:
    """The changes that would make a trial fit, cheapest first, each with its estimate.

    Tried: LoRA; FSDP at the smallest world size that fits (in whole nodes of ``gpus_per_node``);
    gradient checkpointing; the largest ``data.batch_size`` that fits. Empty when nothing fits.
    """
    fixes = []
    if setup.peft != "lora":
        lora = plan_memory(shape, replace(setup, peft="lora"))
        if fits(lora, gpu):
            fixes.append(f"use model.peft=lora ({_gb(lora.total)})")
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
        fixes.append(f"trainer.grad_checkpointing=true ({_gb(checkpointed.total)})")
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
        f"trial #{num}: {_gb(plan.total)}/GPU ({describe(setup)}) > {gpu.gb:.0f} GB per {gpu.label}: {advice}"
    )


def plan_record(plan: MemoryPlan, setup: TrainingSetup, gpu: GpuMemory | None) -> dict[str, Any]:
    """The plan as metrics.json's ``memory_plan`` holds it: parts and totals in bytes, what it assumed,
    the GPU memory it was compared with, and the verdict (``fits``, ``does not fit``, ``not compared``)."""
    verdict = "not compared" if gpu is None else ("fits" if fits(plan, gpu) else "does not fit")
    return {
        "parameters": {"total": plan.total_parameters, "active": plan.active_parameters,
                       "trainable": plan.trainable_parameters},
        "bytes": {"weights": plan.weights, "gradients": plan.gradients, "optimizer": plan.optimizer,
                  "activations": plan.activations, "overhead": plan.overhead},
        "tensors_bytes": plan.tensors,
        "total_bytes": plan.total,
        "setup": {**asdict(setup), "lora_targets": list(setup.lora_targets)},
        "gpu_memory_bytes": None if gpu is None else gpu.bytes,
        "gpu": None if gpu is None else f"{gpu.label} ({gpu.source})",
        "verdict": verdict,
    }


# ----- a trial's config, read so that fields other branches add are optional ------------------


def shape_of_trial(model: Any) -> ModelShape:
    """The shape of a trial's ``model`` group: its pretrained folder's ``config.json`` when
    ``model.path`` is set, else the config's own sizes."""
    path = model.path
    if path:
        return shape_from_hf_config(read_model_folder(Path(path)).config)
    return shape_from_model_config(model)


def setup_of_trial(trial: Any, *, world_size: int, device: str, bf16: bool = True) -> TrainingSetup:
    """The ``TrainingSetup`` of a ``TrialConfig`` on ``world_size`` workers of ``device``.

    ``precision=auto`` is bf16 on a GPU with bf16 tensor cores, else fp32 (as
    ``hpcsweep.train.gpu_choices`` resolves it); ``model.attn_implementation=auto`` is fused on
    CUDA, eager on CPU. ``model.lora.target_modules=null`` counts adapters on every attention and
    MLP linear layer (``DEFAULT_LORA_TARGETS``).
    """
    model, trainer, data = trial.model, trial.trainer, trial.data
    precision = trainer.precision
    if precision == "auto":
        precision = "bf16" if device == "cuda" and bf16 else "fp32"
    targets = model.lora.target_modules or DEFAULT_LORA_TARGETS
    attention = model.attn_implementation
    return TrainingSetup(
        precision=precision, optimizer=trainer.optimizer, momentum=trainer.momentum,
        peft=model.peft, lora_rank=model.lora.r,
        lora_targets=tuple(targets) if not isinstance(targets, str) else (targets,),
        grad_checkpointing=trainer.grad_checkpointing, batch_size=data.batch_size, seq_len=data.seq_len,
        parallel=trainer.parallel, world_size=world_size, device=device,
        fused_attention=attention != "eager" and (attention != "auto" or device == "cuda"),
        from_scratch=not model.path or bool(getattr(model, "random_init", False)),
    )
