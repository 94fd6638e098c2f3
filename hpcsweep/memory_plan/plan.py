"""A trial's peak memory per GPU, by part: pure arithmetic over a ``ModelShape`` and a ``TrainingSetup``.

The parts, per GPU (``docs/user/memory-plan.md`` gives the derivation):

- **weights**: fp32 master weights (4 B/param; a LoRA base is frozen in bf16 under bf16/fp16, 2 B),
  plus the bf16 copies autocast makes of every linear weight and autograd keeps until backward (2 B);
- **gradients**: fp32, of what trains (4 B/param), twice under multi-process DDP, whose buckets hold
  a second copy (``gradient_as_bucket_view=False``, PyTorch's default);
- **optimizer**: AdamW/Adam two fp32 moments (8 B/param), SGD one momentum buffer (4 B) or none;
- **activations**: what autograd saves for backward, per token and layer, counted tensor by tensor
  for transformers' Llama, DeepSeek (MLA, MoE), Mixtral and Qwen2-MoE modules (``activation_bytes``);
- **loss**: the logits and the cross-entropy's fp32 work (``loss_bytes``);
- **temporaries**: what lives for a moment only: the optimizer's foreach step (4 B per trained
  parameter), FSDP's gathered layers and reduce-scatter buffer, the expert LoRA's per-token products;
- **overhead**: the CUDA context, cuBLAS workspaces and NCCL buffers, ``GPU_OVERHEAD_BYTES``.

FSDP divides weights, gradients and optimizer states by the world size and gathers layers unsharded
in the compute dtype: the root (embeddings, LM head) and two decoder layers (one prefetched), or with
``trainer.fsdp_reshard_after_forward=false`` every layer (each stays gathered from its forward to its
backward), plus one layer's fp32 gradient for the reduce-scatter.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from hpcsweep.memory_plan.gpu_memory import GIB, GpuMemory
from hpcsweep.memory_plan.loss_chunk import loss_chunk_tokens
from hpcsweep.memory_plan.model_shape import (
    ModelShape,
    active_parameters,
    largest_layer_parameters,
    lora_parameters,
    root_parameters,
    total_parameters,
)
from hpcsweep.model import lora_targets
from hpcsweep.model.head import logits_are_the_heads

GPU_OVERHEAD_BYTES = 2 * GIB
"""CUDA context with lazy module loading (~0.5 GB on A100/H100 with CUDA 12), cuBLAS workspaces
(a few MiB per stream), NCCL's channel buffers (``NCCL_BUFFSIZE`` 4 MiB per channel and peer: ~0.5 GB
for 8 GPUs a node over InfiniBand), and headroom for the caching allocator's fragmentation."""
CPU_OVERHEAD_BYTES = 416 * 2**20
"""A CPU worker's interpreter with torch, transformers and peft imported: its resident set with no
model to speak of (measured: 415 MiB resident peak for a trial of a 128k-parameter model, torch 2.13
CPU, transformers 5.24, peft 0.21, Linux x86-64)."""
DEFAULT_LORA_RANK = 8
AUTO = "auto"
"""``TrainingSetup.loss_chunk_tokens`` for ``trainer.loss_chunk_tokens=null``: resolved by the plan as the trainer resolves it."""


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """What decides a trial's memory besides its model's shape."""

    precision: str
    """Resolved: ``bf16``, ``fp16`` (autocast over fp32 weights) or ``fp32``."""
    optimizer: str = "adamw"
    momentum: float = 0.9
    peft: str = "none"
    lora_rank: int = DEFAULT_LORA_RANK
    lora_targets: tuple[str, ...] | None = None
    """``model.lora.target_modules``; None: the architecture's own (``hpcsweep.model.lora_targets``)."""
    lora_experts: bool = True
    """``model.lora.experts``: the routed experts' fused tensors get adapters too."""
    grad_checkpointing: bool = False
    batch_size: int
    seq_len: int
    rows_per_item: int = 1
    """Rows a micro-batch holds for each of its ``batch_size`` items: 1 for windows and samples; 2 for DPO's pairs
    (a chosen and a rejected sequence each, one a row at most, ``hpcsweep.train.data.pairs``)."""
    parallel: str = "ddp"
    """``ddp`` or ``fsdp`` (``auto`` is resolved by ``resolve_parallel``)."""
    world_size: int = 1
    device: str = "cuda"
    fused_attention: bool = True
    """sdpa or flash attention (no score matrix kept); false: eager attention, which keeps it."""
    flash_attention: bool = False
    """The kernel is flash-attention (``model.attn_implementation=flash_attention_2``, or ``auto`` resolved
    to it on a node): packed rows run as variable-length sequences, no mask. ``auto`` on the login node
    plans SDPA's mask, the larger of the two."""
    packed_rows: bool = False
    """``data.packing``: rows of several samples, kept apart by a mask unless the kernel is flash
    (``hpcsweep.train.data.sample_attention``)."""
    own_code: bool = False
    """The model folder's own code builds its mask (``auto_map``)."""
    from_scratch: bool = False
    """No pretrained weights (a built-in model, or ``model.random_init=true``): training, not fine-tuning."""
    loss_chunk_tokens: int | str | None = None
    """``trainer.loss_chunk_tokens`` (0: one chunk), or :data:`AUTO` for its null (the chunk
    ``hpcsweep.memory_plan.loss_chunk`` gives this device and shape); None: a loss over the whole batch's
    fp32 logits."""
    reshard_after_forward: bool = True
    """``trainer.fsdp_reshard_after_forward``."""
    mapped_weights_bytes: int = 0
    """On CPU, the size of the model folder's safetensors files: the loader memory-maps them and
    their pages stay in the worker's resident set beside the model (on a GPU they are host memory)."""

    @property
    def rows(self) -> int:
        """Rows of ``seq_len`` positions in a micro-batch, at most: ``batch_size x rows_per_item``."""
        return self.batch_size * self.rows_per_item


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
    loss: int
    temporaries: int
    overhead: int

    @property
    def parts(self) -> dict[str, int]:
        """Every part by name, in the order the breakdown shows them."""
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "loss": self.loss, "temporaries": self.temporaries,
                "overhead": self.overhead}

    @property
    def tensors(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` measures: every part but the fixed overhead."""
        return self.total - self.overhead

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def compute_bytes(setup: TrainingSetup) -> int:
    """Bytes of an element in the compute dtype: 2 under bf16/fp16 autocast, 4 in fp32."""
    return 4 if setup.precision == "fp32" else 2


def adapted_targets(shape: ModelShape, setup: TrainingSetup) -> tuple[str, ...] | str:
    """The linear modules LoRA adapts: ``setup.lora_targets``, else the architecture's (``lora_targets``)."""
    targets = lora_targets.target_modules(shape.model_type or shape.arch, list(setup.lora_targets)
                                          if setup.lora_targets is not None else None)
    return targets if isinstance(targets, str) else tuple(targets)


def adapts_experts(shape: ModelShape, setup: TrainingSetup) -> bool:
    """Whether the routed experts get the expert LoRA (``model.lora.experts``, on a model that has them)."""
    return setup.peft == "lora" and setup.lora_experts and shape.moe_layers > 0


def activation_bytes_per_token(shape: ModelShape, setup: TrainingSetup) -> dict[str, float]:
    """Bytes autograd saves per token: one decoder layer of each kind (``attention``, ``dense_mlp``,
    ``moe_mlp``), and the head (the final norm and the LM head's input; the logits are the loss's).

    Counted tensor by tensor from transformers' modules under autocast over fp32 weights: the
    residual stream and each RMSNorm's input and normalised output are fp32 (8 B x width); every
    linear saves its input in the compute dtype, cast once per consumer under autocast (``e`` = 2)
    or shared in fp32 (``e`` = 4); a gated MLP saves gate, act(gate), up and their product (4e x width);
    fused attention saves q, k, v, its output and the log-sum-exp, eager attention also the fp32
    softmax and its ``e``-byte copy (``(4 + e) x heads x seq``). Same method as Korthikanti et al.,
    "Reducing Activation Recomputation in Large Transformer Models" (2022), sec. 4.1, whose GPT
    block gives ``34·h + 5·a·s`` bytes per token in 16-bit; here it is applied to these modules.
    """
    e, h, n, s = compute_bytes(setup), shape.hidden_size, shape.num_heads, setup.seq_len
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
    # transformers' grouped_mm experts run in the weights' dtype whatever autocast says: fp32 master
    # weights, or a LoRA base frozen in the compute dtype. Each token-expert keeps its input,
    # gate/up, act, product, and output (for its weight).
    w = e if setup.peft == "lora" else 4
    expert_lora = 2 * setup.lora_rank * e if adapts_experts(shape, setup) else 0  # x·A of gate_up and of down
    moe = (
        # The router and the shared experts' gate and up read the norm's output.
        norm(h, 3)
        + 8 * shape.n_routed_experts  # router logits and scores, fp32
        + k * (w * (4 * shape.moe_intermediate_size + 2 * h) + expert_lora)
        + gated_mlp(shape.shared_intermediate_size)
    )
    head = norm(h, 1)
    return {"attention": attention, "dense_mlp": dense, "moe_mlp": moe if shape.moe_layers else 0.0, "head": head}


def activation_bytes(shape: ModelShape, setup: TrainingSetup) -> int:
    """Activations per GPU: every layer's saved tensors for ``batch_size x seq_len`` tokens; with
    gradient checkpointing only each layer's fp32 input, plus one layer recomputed in backward."""
    per = activation_bytes_per_token(shape, setup)
    tokens = setup.rows * setup.seq_len
    layers = [per["attention"] + (per["moe_mlp"] if shape.is_moe_layer(i) else per["dense_mlp"])
              for i in range(shape.num_layers)]
    inside = max(layers) + 4 * shape.hidden_size * shape.num_layers if setup.grad_checkpointing else sum(layers)
    mask = mask_entry_bytes(setup) * setup.rows * setup.seq_len**2
    return int(tokens * (inside + per["head"]) + mask)


def mask_entry_bytes(setup: TrainingSetup) -> int:
    """Bytes per entry of the ``batch x seq_len x seq_len`` attention mask a forward holds (alive until
    its backward): eager's float mask (its own causal one, or hpcsweep's for packed rows), 4 B; a model's
    own code given packed rows, its 1/0 mask and the additive one it makes of it, 8 B; SDPA given packed
    rows, hpcsweep's boolean mask, 1 B; none for flash, nor for SDPA on whole rows (its causal flag)."""
    if setup.packed_rows and setup.own_code:
        return 8
    if not setup.fused_attention:
        return 4
    return 1 if setup.packed_rows and not setup.flash_attention else 0


def head_takes_loss(shape: ModelShape, setup: TrainingSetup) -> bool:
    """Whether the trainer takes the loss at the LM head (``hpcsweep.train.head_loss``): the model's
    logits are its head's output, and no LoRA adapter wraps the head."""
    adapted_head = setup.peft == "lora" and "lm_head" in (setup.lora_targets or ())
    return logits_are_the_heads(shape.model_type) and not adapted_head


def resolved_loss_chunk(shape: ModelShape, setup: TrainingSetup) -> int:
    """The tokens a chunk of the loss takes in the trial (0: one chunk, as for a setup without
    ``trainer.loss_chunk_tokens``), as the trainer resolves the key (``hpcsweep.memory_plan.loss_chunk``):
    at the head from the hidden states, else on logits that exist."""
    if setup.loss_chunk_tokens is None:
        return 0
    setting = None if setup.loss_chunk_tokens == AUTO else setup.loss_chunk_tokens
    hidden = shape.hidden_size if head_takes_loss(shape, setup) else None
    return loss_chunk_tokens(setting, setup.device, shape.vocab_size, hidden, setup.rows * setup.seq_len)


def loss_bytes(shape: ModelShape, setup: TrainingSetup) -> int:
    """What the loss holds at its peak.

    The chunk is ``resolved_loss_chunk``'s. At the head (``hpcsweep.train.head_loss``): one chunk's logits at a
    time, in backward made again beside their fp32 upcast, log-softmax and gradient and the gradient
    cast back (16 B a vocabulary entry a token of the chunk; 12 B in fp32, where the upcast is the
    chunk itself); nothing of the whole batch. The fused CUDA kernels (Liger, cut-cross-entropy) are
    planned alike: they hold chunks of their own size. Chunked logits (``hpcsweep.train.loss``, a model
    that changes its logits after the head): the logits of every token in the compute dtype (their
    gradient is written over them), plus one chunk's fp32 work (its upcast, its log-softmax and its
    gradient: 12 B, or 8 B in fp32). Unchunked: lm_head's logits, their fp32 copy, log-softmax's fp32
    output, and in backward its fp32 gradient beside them (12 B a vocabulary entry a token)."""
    tokens, vocab = setup.rows * setup.seq_len, shape.vocab_size
    if setup.loss_chunk_tokens is None:
        return 12 * tokens * vocab
    chunk = resolved_loss_chunk(shape, setup)
    chunk = chunk if 0 < chunk < tokens else tokens
    if head_takes_loss(shape, setup):
        return (12 if setup.precision == "fp32" else 16) * chunk * vocab
    work = 8 if setup.precision == "fp32" else 12
    return compute_bytes(setup) * tokens * vocab + work * chunk * vocab


def expert_lora_bytes(shape: ModelShape, setup: TrainingSetup) -> int:
    """The expert LoRA's temporaries (``hpcsweep.train.moe.expert_lora``'s grouped GEMMs): the product x·A·B of
    every token-expert on the wider tensor (``gate_up_proj``, 2I wide) in the compute dtype, made, added and
    freed (no W + s·BA is built); and, with fused experts, the adapter weights copied into the grouped GEMM's
    layout at each forward and kept for the backward, by every MoE layer whose activations are kept (one under
    gradient checkpointing): ``B`` (``[E, r, 2I]``, ``[E, r, h]``), and ``A`` (``[E, r, h]``, ``[E, r, I]``)
    where autocast casts it or the rank is padded, the rank rounded up to whole 16 bytes."""
    if not adapts_experts(shape, setup):
        return 0
    e, h, width = compute_bytes(setup), shape.hidden_size, shape.moe_intermediate_size
    product = setup.rows * setup.seq_len * shape.num_experts_per_tok * 2 * width * e
    if not shape.fused_experts:
        return product
    rank = -(-setup.lora_rank * e // 16) * 16 // e
    copied = (2 * width + h) + ((h + width) if e != 4 or rank != setup.lora_rank else 0)
    layers = 1 if setup.grad_checkpointing else shape.moe_layers
    return product + layers * shape.n_routed_experts * rank * copied * e


def _shard(nbytes: int, world: int) -> int:
    return -(-nbytes // world)


def plan_memory(shape: ModelShape, setup: TrainingSetup) -> MemoryPlan:
    """The per-GPU memory of training ``shape`` with ``setup`` (see the module docstring)."""
    total, world = total_parameters(shape), setup.world_size
    lora = setup.peft == "lora"
    trainable = (
        lora_parameters(shape, setup.lora_rank, adapted_targets(shape, setup), adapts_experts(shape, setup))
        if lora else total
    )
    mixed = setup.precision != "fp32"
    e = compute_bytes(setup)
    base = total * (e if lora else 4)
    trained_weights = trainable * 4 if lora else 0
    # autocast's bf16 copies of the fp32 weights (a 16-bit frozen base needs none).
    copies = 0 if (lora or not mixed) else 2 * total
    states = {"adamw": 8, "adam": 8}.get(setup.optimizer, 4 if setup.momentum else 0) * trainable
    step_temporary = 4 * trainable if states else 0
    gradients = 4 * trainable
    temporaries = expert_lora_bytes(shape, setup)
    if setup.parallel == "fsdp" and world > 1:
        block, root = largest_layer_parameters(shape), root_parameters(shape)
        # FSDP gathers in bf16 only under bf16 (its MixedPrecisionPolicy); a LoRA base is stored in e already.
        gather = 2 if setup.precision == "bf16" or (lora and mixed) else 4
        held = total if not setup.reshard_after_forward else root + 2 * block
        weights = _shard(base + trained_weights, world)
        gradients = _shard(gradients, world)
        states, step_temporary = _shard(states, world), _shard(step_temporary, world)
        temporaries += gather * held + 4 * max(block, root)
    else:
        weights = base + trained_weights + copies
        if world > 1:
            gradients *= 2  # DDP's buckets hold a copy of every gradient
    if setup.device == "cpu":
        weights += setup.mapped_weights_bytes
    overhead = GPU_OVERHEAD_BYTES if setup.device == "cuda" else CPU_OVERHEAD_BYTES
    return MemoryPlan(
        total_parameters=total, active_parameters=active_parameters(shape), trainable_parameters=trainable,
        weights=weights, gradients=gradients, optimizer=states, activations=activation_bytes(shape, setup),
        loss=loss_bytes(shape, setup), temporaries=temporaries + step_temporary, overhead=overhead,
    )


def fits(plan: MemoryPlan, gpu: GpuMemory) -> bool:
    """Whether the plan's total stays within one GPU's memory."""
    return plan.total <= gpu.bytes


def resolve_parallel(shape: ModelShape, setup: TrainingSetup, gpu: GpuMemory | None) -> str:
    """``trainer.parallel=auto``: ``ddp`` when the DDP plan fits the GPU (or the GPU is unknown), else ``fsdp``."""
    if gpu is None or setup.world_size == 1:
        return "ddp"
    return "ddp" if fits(plan_memory(shape, replace(setup, parallel="ddp")), gpu) else "fsdp"


def plan_record(plan: MemoryPlan, setup: TrainingSetup, gpu: GpuMemory | None) -> dict[str, Any]:
    """The plan as metrics.json's ``memory_plan`` holds it: parts and totals in bytes, what it assumed,
    the GPU memory it was compared with, and the verdict (``fits``, ``does not fit``, ``not compared``)."""
    verdict = "not compared" if gpu is None else ("fits" if fits(plan, gpu) else "does not fit")
    targets = setup.lora_targets
    return {
        "parameters": {"total": plan.total_parameters, "active": plan.active_parameters,
                       "trainable": plan.trainable_parameters},
        "bytes": plan.parts,
        "tensors_bytes": plan.tensors,
        "total_bytes": plan.total,
        "setup": {**asdict(setup), "lora_targets": None if targets is None else list(targets)},
        "gpu_memory_bytes": None if gpu is None else gpu.bytes,
        "gpu": None if gpu is None else f"{gpu.label} ({gpu.source})",
        "verdict": verdict,
    }
