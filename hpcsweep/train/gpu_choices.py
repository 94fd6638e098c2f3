"""How a worker uses its device: precision, TF32, attention kernel, determinism, DDP buckets.

Every choice is a pure function of the device's facts (:class:`DeviceFacts`: CPU or CUDA, the
GPU's name and compute capability) and the trial's config, so tests feed device names and
capabilities as literals. The side effects sit in small functions at the edge:
:func:`device_facts` reads the device, :func:`apply_backend_settings` sets torch's global flags and
:func:`restore_backend_settings` puts them back.

:func:`gpu_allocation_error` refuses a trial whose node was given GPUs it cannot use, so it never
trains silently on CPU.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from hpcsweep.config import ModelConfig, TrainerConfig
from hpcsweep.model import lora_targets

BF16_MIN_CAPABILITY = (8, 0)
"""bf16 (and TF32) tensor cores arrived with Ampere (A100: 8.0); older GPUs emulate bf16 slowly."""
CUBLAS_WORKSPACE_CONFIG = ":4096:8"
"""A fixed cuBLAS workspace, which deterministic cuBLAS needs (NVIDIA's cuBLAS docs, "Results
reproducibility"; PyTorch's ``use_deterministic_algorithms``). 8 buffers of 4 MiB: the size PyTorch
already uses on Hopper, so it costs nothing there."""
DUMMY_GPUS_VAR = "HPCSWEEP_DUMMY_GPUS"
"""Set to 1 where the GPUs Slurm hands out are declarations without hardware: the local test
cluster's TaskProlog exports it (scripts/slurm-cluster). There a trial trains on CPU by design."""


@dataclass(frozen=True)
class DeviceFacts:
    """What the choices need to know about this worker's device."""

    type: Literal["cpu", "cuda"]
    name: str | None = None
    """``torch.cuda.get_device_name()``, e.g. ``NVIDIA H100 80GB HBM3``; None on CPU."""
    capability: tuple[int, int] | None = None
    """``torch.cuda.get_device_capability()``, e.g. ``(9, 0)``; None on CPU."""

    @property
    def has_bf16(self) -> bool:
        """bf16 tensor cores: a CUDA device of compute capability 8.0 or later."""
        return self.type == "cuda" and self.capability is not None and self.capability >= BF16_MIN_CAPABILITY


@dataclass(frozen=True)
class GpuChoices:
    """What ``auto`` and the explicit settings resolved to on this device; metrics.json records it."""

    precision: Literal["fp32", "bf16", "fp16"]
    tf32: bool
    deterministic: bool
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"]


def resolve_precision(setting: str, facts: DeviceFacts) -> str:
    """``trainer.precision``: ``auto`` is bf16 where the GPU has bf16 tensor cores, else fp32.

    fp16 is never chosen for the user: it needs loss scaling and overflows where bf16 does not.
    """
    if setting == "auto":
        return "bf16" if facts.has_bf16 else "fp32"
    if setting == "bf16" and facts.type == "cuda" and not facts.has_bf16:
        raise ValueError(
            f"trainer.precision='bf16' is not allowed on {facts.name} (compute capability "
            f"{_capability_text(facts)}): bf16 needs 8.0 or later (A100, H100); use fp16, fp32 or auto"
        )
    return setting


def resolve_tf32(setting: bool, facts: DeviceFacts) -> bool:
    """``trainer.tf32``: TF32 matmuls where they exist, CUDA devices of compute capability 8.0+."""
    return setting and facts.has_bf16


def resolve_deterministic(setting: bool | str, facts: DeviceFacts) -> bool:
    """``trainer.deterministic``: ``auto`` is true on CPU (where it costs nothing) and false on CUDA."""
    if setting == "auto":
        return facts.type == "cpu"
    return bool(setting)


def resolve_attention(
    setting: str, facts: DeviceFacts, *, precision: str, deterministic: bool, flash_available: bool,
    packing: bool = False, own_code: bool = False,
) -> str:
    """``model.attn_implementation``; ``auto``: eager on CPU, flash-attention 2 or SDPA on CUDA.

    On CPU, eager is the math every bit-exact CPU result was proved with, and a fused kernel buys
    nothing at CPU sizes. On CUDA, SDPA never builds the L x L score matrix, and under
    ``torch.use_deterministic_algorithms`` PyTorch picks its deterministic backward kernels.
    flash-attention 2 (the ``flash_attn`` package, not a dependency) runs only in bf16/fp16, and
    its backward is deterministic only on request, so ``auto`` takes it only on the fast path.

    Packed rows (``packing``, ``data.packing``) are kept apart by ``hpcsweep.train.data.sample_attention``:
    flash-attention as variable-length sequences (no mask, the fastest with packing), SDPA by a
    boolean mask (which rules out its own flash backend; the memory-efficient one runs), eager by a
    float one. A model whose own code builds its mask (``own_code``: DeepSeek-MoE's) reads only a
    padding mask on its flash path, so packed rows run it eager, and flash is refused.
    """
    if packing and own_code:
        if setting == "flash_attention_2":
            raise ValueError("model.attn_implementation='flash_attention_2' is not allowed with data.packing=true on "
                             "a folder with its own model code (auto_map): its flash path cannot be told where "
                             "packed samples end; use auto or eager, or data.packing=false")
        if setting == "auto":
            return "eager"
    if setting == "auto":
        if facts.type != "cuda":
            return "eager"
        if flash_available and precision in ("bf16", "fp16") and not deterministic:
            return "flash_attention_2"
        return "sdpa"
    if setting == "flash_attention_2":
        problem = (
            "it needs a CUDA device" if facts.type != "cuda"
            else "the flash_attn package is not installed" if not flash_available
            else f"it runs in bf16 or fp16, not {precision}" if precision not in ("bf16", "fp16")
            else None
        )
        if problem:
            raise ValueError(f"model.attn_implementation='flash_attention_2' is not allowed here: {problem}; "
                             "use auto, sdpa or eager")
    return setting


def choose(trainer: TrainerConfig, model: ModelConfig, facts: DeviceFacts, *, flash_available: bool,
           packing: bool = False, own_code: bool = False) -> GpuChoices:
    """Every choice for one trial on one device (``packing``: ``data.packing``; ``own_code``: the model
    folder ships the code that builds its attention mask)."""
    precision = resolve_precision(trainer.precision, facts)
    deterministic = resolve_deterministic(trainer.deterministic, facts)
    return GpuChoices(
        precision=precision,
        tf32=resolve_tf32(trainer.tf32, facts),
        deterministic=deterministic,
        attn_implementation=resolve_attention(
            model.attn_implementation, facts, precision=precision, deterministic=deterministic,
            flash_available=flash_available, packing=packing, own_code=own_code,
        ),
    )


def find_unused_parameters(parameter_names: Iterable[str]) -> bool:
    """DDP's ``find_unused_parameters``: only where a parameter can go without a gradient in a step.

    Experts held as one module each (``mlp.experts.3.up_proj``, transformers 4.x) get none when no
    token chose them. transformers 5 holds all experts of a layer in one tensor, which always gets a
    gradient. (Exact resume needs fixed gradient buckets, not the search: ``parallel.fix_buckets``.)
    """
    return any(lora_targets.is_routed_expert_module(name) for name in parameter_names)


def fixed_buckets(*, deterministic: bool, grad_comm: str, find_unused: bool) -> bool:
    """Whether DDP's gradient buckets are laid out once, at the first forward (``parallel.fix_buckets``).

    A deterministic trial needs it for an exact resume; so does ``trainer.grad_comm=powersgd``, whose
    state (error feedback, P and Q memories) is kept per bucket index: after DDP's default rebuild, a
    resumed process's first step would hand the saved state other buckets. With the unused-parameter
    search DDP never rebuilds its buckets, so there is nothing to fix (and PowerSGD needs no search:
    a comm hook sees whatever buckets there are).
    """
    return (deterministic or grad_comm == "powersgd") and not find_unused


def cuda_env(deterministic: bool, device_type: str, env: Mapping[str, str]) -> dict[str, str]:
    """Variables a worker must export before its first cuBLAS call (a user's own value wins)."""
    if deterministic and device_type == "cuda" and "CUBLAS_WORKSPACE_CONFIG" not in env:
        return {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE_CONFIG}
    return {}


def allocated_gpus(env: Mapping[str, str]) -> str | None:
    """The variable that says this task was given GPUs, as ``NAME=value``, or None.

    Slurm sets ``SLURM_GPUS_ON_NODE``, ``SLURM_JOB_GPUS``/``SLURM_STEP_GPUS`` and
    ``CUDA_VISIBLE_DEVICES`` for a task with GPUs; outside Slurm, a non-empty
    ``CUDA_VISIBLE_DEVICES`` names the GPUs a user meant to use (``""`` or ``-1`` hides them all).
    """
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = env.get(name, "").strip()
        if not value or value.startswith("-1") or (name == "SLURM_GPUS_ON_NODE" and value == "0"):
            continue
        return f"{name}={value}"
    return None


def gpu_allocation_error(
    env: Mapping[str, str], *, cuda_available: bool, torch_cuda_version: str | None, device_pref: str
) -> str | None:
    """Why this worker must not train, or None: GPUs were wanted or given but CUDA sees none.

    ``device_pref`` is ``trainer.device``: ``cpu`` never refuses; ``cuda`` refuses without CUDA;
    ``auto`` refuses when the node gave this task GPUs (:func:`allocated_gpus`), unless they are
    the local test cluster's declared dummies (``HPCSWEEP_DUMMY_GPUS=1``). The message says why
    (a CPU build of torch, or the driver) and how to fix it.
    """
    if cuda_available or device_pref == "cpu":
        return None
    given = allocated_gpus(env)
    if device_pref == "auto" and (given is None or env.get(DUMMY_GPUS_VAR) == "1"):
        return None
    wanted = f"this task was given GPUs ({given})" if given else "trainer.device='cuda' asks for a GPU"
    if torch_cuda_version is None:
        why = (f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None): install a CUDA "
               "build of torch that the node's driver supports (https://pytorch.org/get-started/locally/)")
    else:
        why = (f"torch is built for CUDA {torch_cuda_version} but finds no usable GPU: the NVIDIA driver is "
               f"missing or older than CUDA {torch_cuda_version} needs; run `nvidia-smi` on the node (its "
               "'CUDA Version' must be at least that) and update the driver, or install a torch build for "
               "the driver's CUDA version")
    instead = ("or ask for no GPUs (hydra.launcher.gpus_per_node=0) and train on CPU on purpose "
               "(trainer.device=cpu)")
    return f"{wanted}, but CUDA is not available: {why}; {instead}"


def flash_attention_available() -> bool:
    """Whether the ``flash_attn`` package can be imported (it is not a dependency)."""
    return importlib.util.find_spec("flash_attn") is not None


def device_facts(device: torch.device) -> DeviceFacts:
    """The facts of ``device`` as the CUDA runtime reports them."""
    if device.type != "cuda":
        return DeviceFacts("cpu")
    return DeviceFacts("cuda", torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device)))


@dataclass(frozen=True)
class BackendSettings:
    """torch's process-wide flags as :func:`apply_backend_settings` found them, to put back when the trial ends."""

    deterministic: bool
    """``torch.are_deterministic_algorithms_enabled()``."""
    deterministic_warn_only: bool
    """``torch.is_deterministic_algorithms_warn_only_enabled()``."""
    cuda_flags: tuple[bool, bool, bool, bool] | None
    """CUDA's matmul TF32, cuDNN's TF32, cuDNN deterministic and cuDNN benchmark; None where they were
    left alone (on CPU), so a process that set TF32 through PyTorch's newer API is not refused for
    reading the legacy flags."""


def _cuda_flags() -> tuple[bool, bool, bool, bool]:
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)


def apply_backend_settings(choices: GpuChoices, device_type: str) -> BackendSettings:
    """Set torch's process-wide flags for ``choices``, every one explicitly; returns the flags as they
    were, for :func:`restore_backend_settings` when the trial ends.

    Explicit both ways: a local sweep runs one trial after another in one process, and the last
    trial's flags must not leak into the next. TF32 goes through the CUDA-only flags: the global
    ``torch.set_float32_matmul_precision`` also switches oneDNN's CPU matmuls (torch 2.9+), and
    PyTorch refuses a mix of its legacy and new TF32 settings.
    """
    before = BackendSettings(torch.are_deterministic_algorithms_enabled(),
                             torch.is_deterministic_algorithms_warn_only_enabled(),
                             _cuda_flags() if device_type == "cuda" else None)
    torch.use_deterministic_algorithms(choices.deterministic)
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = choices.tf32
        torch.backends.cudnn.allow_tf32 = choices.tf32
        torch.backends.cudnn.deterministic = choices.deterministic
        torch.backends.cudnn.benchmark = False
    return before


def restore_backend_settings(settings: BackendSettings) -> None:
    """Put torch's process-wide flags back as :func:`apply_backend_settings` found them: a trial
    must leave the process (a notebook, a test run, the next trial) as it found it."""
    torch.use_deterministic_algorithms(settings.deterministic, warn_only=settings.deterministic_warn_only)
    if settings.cuda_flags is not None:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = settings.cuda_flags


def _capability_text(facts: DeviceFacts) -> str:
    return "unknown" if facts.capability is None else ".".join(map(str, facts.capability))
