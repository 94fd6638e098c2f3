"""How the ranks of a trial share the model: DDP (every rank holds it whole) or FSDP2 (sharded).

``trainer.parallel=ddp`` wraps the model in ``DistributedDataParallel``. ``fsdp`` applies PyTorch's
``fully_shard`` (FSDP2, parameters as DTensors sharded on dim 0) to each decoder layer and then to
the whole model, as torchtitan does: a layer's parameters are all-gathered just before its forward
and backward, and its gradients reduce-scattered after, so each rank keeps 1/N of the parameters,
gradients and optimizer state. ``fully_shard`` changes the model in place and keeps every
parameter name, so the optimizer, DCP checkpoints (one shard per rank) and evaluation need
nothing else.

The decisions are pure functions (:func:`resolve_parallel`, :func:`mixed_precision_policy`,
:func:`decoder_layers`); :func:`wrap_model` applies them.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator
from typing import Literal

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from hpcsweep.config import TrainerConfig
from hpcsweep.train.distributed import WorldInfo
from hpcsweep.train.gpu_choices import DeviceFacts
from hpcsweep.train.checkpoint.trained_state import trained_state_dict

ParallelMode = Literal["ddp", "fsdp"]


def resolve_parallel(trainer: TrainerConfig, *, ddp_fits: bool = True) -> ParallelMode:
    """``trainer.parallel`` as this trial runs it; ``auto`` is DDP unless the trial does not fit.

    ``ddp_fits`` is the memory plan's verdict on the trial with DDP on its GPUs. A trial that asks
    for a DDP-only communication option (``grad_comm``, ``sync_every``) stays DDP: the memory plan
    refuses it before submit when DDP cannot hold it.
    """
    if trainer.parallel != "auto":
        return trainer.parallel
    ddp_only = trainer.grad_comm != "none" or trainer.sync_every > 1
    return "ddp" if ddp_fits or ddp_only else "fsdp"


def mixed_precision_policy(facts: DeviceFacts, precision: str) -> MixedPrecisionPolicy:
    """FSDP's parameter and reduction dtypes: bf16 parameters with fp32 reduction on a GPU that
    trains in bf16 (torchtitan's policy), fp32 throughout everywhere else.

    The sharded parameters, the optimizer state and the checkpoints stay fp32 either way; only the
    gathered copy a layer computes with is bf16. Reducing in fp32 keeps the gradient sum as exact
    as DDP's. On CPU bf16 buys nothing and would lose the bits exact resume is proved with.
    """
    if facts.type == "cuda" and precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks, each its own FSDP unit: the modules whose class a
    Hugging Face model names in ``_no_split_modules`` (``LlamaDecoderLayer``, ...), found through
    any wrapper (a peft model)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def wrap_model(
    model: torch.nn.Module, world: WorldInfo, mode: ParallelMode, trainer: TrainerConfig, *,
    facts: DeviceFacts, precision: str, find_unused_parameters: bool, fixed_buckets: bool = False,
) -> torch.nn.Module:
    """The module to run forward and backward through: DDP's wrapper, or ``model`` itself, sharded
    in place by FSDP. A single process without a process group runs ``model`` as it is; FSDP with
    one rank still shards (over one), so a one-GPU trial runs the FSDP code path."""
    if mode == "fsdp" and world.backend is not None:
        mesh = init_device_mesh(world.device.type, (world.world_size,))
        policy = mixed_precision_policy(facts, precision)
        layers = decoder_layers(model)
        if not layers:
            raise ValueError(f"trainer.parallel='fsdp' found no decoder layers in {type(model).__name__}")
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=trainer.fsdp_reshard_after_forward)
        # The root unit holds the embeddings, the final norm and the output head; it is gathered
        # for the whole step, so resharding it after the forward would only gather it again.
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
        quiet_root_view_warning(model)
        return model
    if not world.is_distributed:
        return model
    # Buffers stay equal on every rank without a sync before each forward: rotary tables never change,
    # and DeepSeek-V3's routing bias changes by an update every rank computes alike from counts summed over
    # all ranks (hpcsweep.train.moe.load_balance). They are equal from the start, so the sync at construction
    # changes nothing (a broadcast from rank 0 each step would only repeat what each rank has); the older
    # spelling, broadcast_buffers=False, filled every worker's log with a deprecation warning.
    ddp = DistributedDataParallel(model, forward_sync_buffers=False, find_unused_parameters=find_unused_parameters)
    if fixed_buckets:
        fix_buckets(ddp)
    return ddp


def quiet_root_view_warning(root: torch.nn.Module) -> None:
    """Silence FSDP2's "returned a view tensor" warning for the root unit ``root`` alone (a decoder
    layer that returned a view would still warn).

    A false alarm here. The warning guards against an in-place op on an output view in the forward,
    which would drop the pre-backward hook FSDP put on it. The root's view is the stand-in that
    ``hpcsweep.train.head_loss`` returns for the logits when the head takes the loss
    (``loss.reshape(1, 1, 1)``): nothing writes to it, and backward starts from the loss itself, so the
    hook on the view is never needed. The root's parameters stay gathered for the whole step
    (``reshard_after_forward=False``) and FSDP's end-of-backward callback reduce-scatters the root's
    gradients whether or not its hook fired (the FSDP and DDP trials of test_trainer_parallel train
    alike); what the unfired hook costs is overlap alone (the root's reduce-scatter waits for that
    callback). Where the loss takes the logits instead (``hpcsweep.train.loss``), they are the head's own
    output, not a view, and the one write over them (``overwrite_logits``) happens in backward,
    after their hook has run. Measured: torch 2.13, one warning a training step without this."""
    name = re.escape(type(root).__name__)  # FSDP<model class> once fully_shard has run
    warnings.filterwarnings("ignore", rf"FSDP2-wrapped module \({name}\) returned a view tensor", UserWarning)


def fix_buckets(ddp: DistributedDataParallel) -> None:
    """Lay out DDP's gradient buckets once, in parameter order, at the first forward, for good.

    Exact resume needs the same buckets at every step of every process: the ring all-reduce sums
    each element in an order that depends on where it lies in the bucket, and from 3 ranks up another
    layout changes the last bits. By default DDP starts with one layout and, after the first step of
    each process, rebuilds the buckets in the order gradients arrived: a resumed process's first step
    would all-reduce the first layout where the uninterrupted run used the rebuilt one. Handing the
    reducer every parameter as "arrived" (what DDP's own ``Join`` does) makes the rebuild at the first
    forward use parameter order, the same in every process, and none follows. Unlike
    ``find_unused_parameters``, it costs no autograd-graph walk per step; the buckets no longer follow
    the backward's order, so their all-reduce overlaps less with it (deterministic and PowerSGD trials only).
    """
    ddp.reducer._push_all_rebuilt_params()


@contextlib.contextmanager
def gradient_sync(net: torch.nn.Module, sync: bool) -> Iterator[None]:
    """Reduce gradients in the backward passes inside (``sync``) or accumulate them locally (a
    micro-step of gradient accumulation): DDP's ``no_sync``, FSDP's ``set_requires_gradient_sync``."""
    if sync:
        yield
    elif isinstance(net, DistributedDataParallel):
        with net.no_sync():
            yield
    elif isinstance(net, FSDPModule):
        net.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            net.set_requires_gradient_sync(True)
    else:
        yield


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm to ``max_norm``; the norm before clipping, a plain tensor.

    With FSDP the gradients are DTensor shards: ``clip_grad_norm_`` reduces their norms over the
    ranks, so the norm is the whole model's, as with DDP.
    """
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def full_trained_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What trains (``trained_state.trained_state_dict``: a LoRA base left out), whole, under the
    usual names, for the weights hash. With FSDP a collective: every rank must call it, and rank 0
    alone gets the gathered CPU tensors."""
    if not isinstance(model, FSDPModule):
        return trained_state_dict(model)
    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True))
