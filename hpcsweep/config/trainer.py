"""The ``trainer`` group: a trial's size, optimisation, checkpoints, evaluation, parallelism and profiling."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .tasks import _task_key
from .validation import _require


@dataclass(kw_only=True)
class TrainerConfig:
    """How a trial trains: its size on the cluster, optimisation, checkpoints and logging."""

    nodes: int = 1
    """Nodes per trial; drives the Slurm allocation."""
    nproc_per_node: int | Literal["auto"] = "auto"
    """Worker processes per node. ``auto``: one per GPU the node gives the trial (the launcher's
    ``gpus_per_node`` on Slurm), or 1 without GPUs. A number also sets the GPUs asked for."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto``: CUDA when available, else CPU (gloo)."""
    max_steps: int = 200
    """Optimizer steps in the whole trial."""
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    """The optimizer."""
    weight_decay: float = 0.1
    """Decoupled weight decay (AdamW) or L2 (Adam, SGD)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """Adam betas."""
    momentum: float = 0.9
    """SGD momentum."""
    warmup_steps: int = 20
    """Linear warmup steps before the cosine decay."""
    min_lr_ratio: float = 0.1
    """The cosine schedule decays to ``model.lr * min_lr_ratio``."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""
    grad_accum: int = 1
    """Micro-steps accumulated per optimizer step."""
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "auto"
    """``auto``: bf16 autocast on a GPU that has bf16 tensor cores (compute capability 8.0+: A100,
    H100, H200), else fp32 (CPUs and older GPUs). ``bf16``: autocast, ``fp16``: autocast with a
    GradScaler, ``fp32``: no autocast."""
    tf32: bool = True
    """On CUDA, run fp32 matmuls and convolutions on the tensor cores in TF32 (10-bit mantissa
    inputs, fp32 accumulation). No effect on CPU, or on what bf16 autocast already casts."""
    deterministic: bool | Literal["auto"] = "auto"
    """``true``: the same bits on every run and across stop and resume (on CUDA: deterministic
    kernels, ``CUBLAS_WORKSPACE_CONFIG``, fixed DDP buckets; slower). ``false``: the fast path.
    ``auto``: true on CPU, false on CUDA. metrics.json records what a trial ran with."""
    grad_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    loss_chunk_tokens: int | None = None
    """The cross-entropy works on this many tokens' logits at a time: the LM head computes each
    chunk's logits from the hidden states, upcasts, uses and frees them (hpcsweep.train.head_loss),
    so no logits tensor of the whole batch exists; for a model that changes its logits after the head,
    the logits are chunked instead (hpcsweep.train.loss). Smaller saves memory (about 12-16 B x chunk
    x vocabulary), larger saves kernel launches; 0 (or a value >= the batch's tokens): one chunk.
    null (auto): 256 on CPU (measured: no chunk beat it at every shape); on CUDA Liger's rule, a chunk's logits
    about the size of the hidden states, 512 rows at least, one chunk's fp32 logits 512 MiB at most
    (hpcsweep.memory_plan.loss_chunk, which the memory plan resolves too)."""
    loss_kernel: Literal["auto", "torch", "liger", "cut_cross_entropy"] = "auto"
    """What computes the training loss at the head: ``torch``, the chunks above; ``liger`` or
    ``cut_cross_entropy``, a fused linear cross-entropy kernel (CUDA, and the ``liger-kernel`` or
    ``cut-cross-entropy`` package installed); ``auto``: a fused kernel on CUDA when one is installed
    (Liger first), else ``torch``."""
    seed: int = 0
    """Seed of model initialisation and dropout."""
    ckpt_every: int = 50
    """Save a checkpoint every this many steps (0: only at the end and on request)."""
    ckpt_every_min: float | None = None
    """Also save every this many minutes (rank 0's clock, since the last save began); null: by steps
    only. With ``ckpt_every`` both apply, whichever comes first."""
    keep_top_k: int = 2
    """Besides ``last``, keep the k checkpoints with the best validation loss."""
    eval_every: int = 25
    """Evaluate on the validation split every this many steps."""
    eval_batches: int = 4
    """Validation batches per evaluation."""
    log_every: int = 10
    """Log training scalars every this many steps."""
    early_stop_patience: int = 0
    """Stop after this many evaluations without improvement (0 disables)."""
    early_stop_min_delta: float = 0.0
    """An improvement smaller than this does not count."""
    early_stop_metric: str = "val_loss"
    """What early stopping watches: ``val_loss``, ``val_accuracy``, with ``objective=dpo``
    ``val_reward_accuracy`` or ``val_reward_margin`` (checked every ``trainer.eval_every`` steps) or a task score ``tasks.NAME.METRIC`` (every ``tasks.every`` steps; NAME one of ``tasks.names``)."""
    early_stop_mode: Literal["min", "max"] = "min"
    """``min``: lower is better (a loss); ``max``: higher is better (an accuracy, a task score)."""
    hang_timeout_min: float = 15.0
    """When no step finishes for this many minutes (an evaluation, a save or the start-up included),
    the trial's stacks go to its log, its workers end, and it fails as a hang, which is retried on
    other nodes (``hydra.launcher.max_retries``). Below ``nccl.pg_timeout_s`` (30 min), so a hung
    collective ends here first. 0 disables; fractions are fine."""
    # How the ranks share the model and its gradients (hpcsweep.train.parallel, docs/user/parallel.md).
    parallel: Literal["auto", "ddp", "fsdp"] = "auto"
    """``ddp``: every rank holds the whole model, gradients and optimizer state. ``fsdp``: FSDP2
    (``fully_shard`` per decoder layer, then the whole model) shards all three over the ranks.
    ``auto``: DDP when the trial fits a GPU with DDP (the memory plan), else FSDP."""
    fsdp_reshard_after_forward: bool = True
    """FSDP: free each layer's gathered parameters after its forward and gather them again for the
    backward (less memory, one more all-gather per layer); false keeps them until the backward."""
    grad_comm: Literal["none", "bf16", "fp16", "powersgd"] = "none"
    """DDP's gradient all-reduce: ``none`` (full precision), ``bf16``/``fp16`` (compressed to half
    precision on the wire), ``powersgd`` (low-rank compression with error feedback). For slow
    interconnects; DDP only."""
    powersgd_rank: int = 4
    """``grad_comm=powersgd``: the rank of its low-rank approximation (lower compresses more)."""
    sync_every: int = 1
    """1: gradients are all-reduced every step. H > 1: local SGD (PyTorch's post-local SGD): after
    ``comm_warmup_steps`` every rank steps on its own gradients and the models are averaged every H
    steps. DDP only."""
    comm_warmup_steps: int = 20
    """Steps of plain all-reduce before ``grad_comm=powersgd`` compresses or ``sync_every`` goes local."""
    # The step-time breakdown (hpcsweep.train.observe.step_timer, docs/user/step-time.md).
    step_timing: bool = True
    """Each log window records where its wall time went (data, forward+backward, optimizer,
    checkpoint, logging, other) and its peak memory: metrics.json ``step_time`` and
    ``step_time_total``, TensorBoard ``time/*_pct`` and ``mem/peak_gb``. False switches it off (the
    overhead benchmark's baseline)."""
    # Per-trial telemetry (hpcsweep.telemetry, docs/user/telemetry.md).
    telemetry_every_s: float = 10.0
    """Seconds between two samples of the trial's GPUs (NVML: utilisation, memory, power, SM clock,
    GPM's SM- and tensor-active %) and its workers' CPU and memory, taken by a thread on each node's
    local rank 0; logged as ``sys/...`` scalars at each log window and summarised in metrics.json's
    ``telemetry``. 0 disables it."""
    # Profiler traces (hpcsweep.train.observe.profiling, docs/user/profiling.md): they never change what a step
    # computes.
    profile_steps: list[int] | None = None
    """``[START, END]``: run ``torch.profiler`` over optimizer steps START..END (1-based, inclusive) and
    write one Chrome/Perfetto trace per rank to ``TRIAL_DIR/profile/steps-START-END/rankR.json``. A
    resumed trial skips a window it has passed and takes the rest of one it stopped inside. null: none
    (a running trial can still be asked for one: ``python -m hpcsweep.profile``)."""
    profile_memory: bool = False
    """Also record memory: allocations in the trace and, on CUDA, an allocator snapshot
    (``rankR-memory.pickle``, for https://pytorch.org/memory_viz)."""
    profile_stacks: bool = False
    """Also record the Python stack of every operator (larger traces, slower steps while profiling)."""

    def __post_init__(self) -> None:
        _require(self.nodes >= 1, "trainer.nodes", self.nodes, "an integer >= 1")
        _require(
            self.nproc_per_node == "auto" or self.nproc_per_node >= 1,
            "trainer.nproc_per_node",
            self.nproc_per_node,
            "auto or an integer >= 1",
        )
        _require(self.max_steps >= 1, "trainer.max_steps", self.max_steps, "an integer >= 1")
        _require(self.grad_accum >= 1, "trainer.grad_accum", self.grad_accum, "an integer >= 1")
        _require(self.loss_chunk_tokens is None or self.loss_chunk_tokens >= 0, "trainer.loss_chunk_tokens",
                 self.loss_chunk_tokens, "null (auto: chosen for the device and the model's sizes) or an integer "
                 ">= 0 (tokens per chunk of the loss; 0: one chunk)")
        _require(self.warmup_steps >= 0, "trainer.warmup_steps", self.warmup_steps, "an integer >= 0")
        _require(
            0.0 <= self.min_lr_ratio <= 1.0, "trainer.min_lr_ratio", self.min_lr_ratio, "0..1"
        )
        _require(self.grad_clip >= 0, "trainer.grad_clip", self.grad_clip, "a number >= 0")
        _require(len(self.betas) == 2, "trainer.betas", self.betas, "a list of two numbers")
        for name in ("ckpt_every", "keep_top_k", "early_stop_patience"):
            value = getattr(self, name)
            _require(value >= 0, f"trainer.{name}", value, "an integer >= 0")
        _require(
            self.ckpt_every_min is None or self.ckpt_every_min > 0,
            "trainer.ckpt_every_min",
            self.ckpt_every_min,
            "minutes > 0, or null to save by steps only",
        )
        for name in ("eval_every", "eval_batches", "log_every"):
            value = getattr(self, name)
            _require(value >= 1, f"trainer.{name}", value, "an integer >= 1")
        _require(
            self.hang_timeout_min >= 0, "trainer.hang_timeout_min", self.hang_timeout_min, "minutes >= 0 (0 disables)"
        )
        self._check_parallel()
        _require(self.early_stop_metric in EVAL_METRICS or _task_key(self.early_stop_metric) is not None,
                 "trainer.early_stop_metric", self.early_stop_metric,
                 f"one of {', '.join(EVAL_METRICS)}, or a task score tasks.NAME.METRIC")
        _require(self.telemetry_every_s >= 0, "trainer.telemetry_every_s", self.telemetry_every_s,
                 "seconds >= 0 (0 disables telemetry)")
        self._check_profile()

    def _check_profile(self) -> None:
        steps = self.profile_steps
        _require(steps is None or (len(steps) == 2 and 1 <= steps[0] <= steps[1] <= self.max_steps),
                 "trainer.profile_steps", steps,
                 f"null or [START, END]: two optimizer steps with 1 <= START <= END <= trainer.max_steps={self.max_steps}")

    def _check_parallel(self) -> None:
        _require(self.powersgd_rank >= 1, "trainer.powersgd_rank", self.powersgd_rank, "an integer >= 1")
        _require(self.sync_every >= 1, "trainer.sync_every", self.sync_every, "an integer >= 1 (1: every step)")
        # PowerSGD's error feedback cannot start before DDP has built its buckets, at its second step.
        least = 2 if self.grad_comm == "powersgd" else 0
        _require(self.comm_warmup_steps >= least, "trainer.comm_warmup_steps", self.comm_warmup_steps,
                 f"an integer >= {least}" + (" with trainer.grad_comm='powersgd'" if least else ""))
        if self.parallel == "fsdp":
            _require(self.grad_comm == "none", "trainer.grad_comm", self.grad_comm,
                     "only 'none' with trainer.parallel='fsdp' (grad_comm is a DDP communication hook; FSDP "
                     "reduce-scatters in fp32): set trainer.parallel=ddp or trainer.grad_comm=none")
            _require(self.sync_every == 1, "trainer.sync_every", self.sync_every,
                     "only 1 with trainer.parallel='fsdp' (local SGD averages whole DDP replicas): "
                     "set trainer.parallel=ddp or trainer.sync_every=1")
        _require(self.sync_every == 1 or self.grad_comm == "none", "trainer.sync_every", self.sync_every,
                 f"only 1 with trainer.grad_comm={self.grad_comm!r} (local SGD replaces the all-reduce that "
                 "grad_comm compresses): set one of trainer.sync_every=1 or trainer.grad_comm=none")


EVAL_METRICS = ("val_loss", "val_accuracy", "val_reward_accuracy", "val_reward_margin")
"""What an evaluation measures (``trainer.eval_every``; the reward ones with ``objective=dpo``):
``trainer.early_stop_metric`` may watch these."""
