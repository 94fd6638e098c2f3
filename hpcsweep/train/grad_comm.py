"""DDP's gradient communication options: compressed all-reduce (``trainer.grad_comm``) and local SGD
(``trainer.sync_every``), from PyTorch's own hooks, with the state a resume needs.

- ``bf16`` / ``fp16``: ``ddp_comm_hooks.default_hooks`` cast each gradient bucket to half precision
  for the all-reduce and back: half the bytes on the wire, no state.
- ``powersgd``: ``ddp_comm_hooks.powerSGD_hook`` (Vogels et al., 2019) all-reduces a rank-r
  approximation of each matrix gradient, after ``comm_warmup_steps`` of plain all-reduce. Its
  ``PowerSGDState`` holds what resuming must restore: the error feedback (each rank's residual,
  its own), the warm-started P and Q memories, the step count and the numpy RNG that seeds Q.
- ``sync_every=H``: post-local SGD (Lin et al., 2020): plain all-reduce for ``comm_warmup_steps``,
  then every rank steps on its own gradients (``post_localSGD_hook`` reduces over a group of one)
  and ``PeriodicModelAverager`` averages the parameters every H steps.

:class:`GradComm` is what the trainer holds: the hook's state as per-rank bytes for the checkpoint
(``CheckpointManager``'s ``comm_state``), and the step hook of local SGD.
"""

# No ``from __future__ import annotations``: DDP checks a hook's annotations as objects.
import io
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel

from hpcsweep.config import TrainerConfig



def gloo_bf16_compress_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """``bf16_compress_hook`` for gloo. DDP refuses the hook by its name unless NCCL 2.10+ carries
    bf16 (a check for NCCL alone); gloo all-reduces bf16 too, so CPU trials compress as GPUs do."""
    return default_hooks.bf16_compress_hook(state, bucket)


def gloo_powerSGD_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """``powerSGD_hook``, run to the end before it returns, for gloo.

    PowerSGD issues its P and Q all-reduces from callbacks of the one before, on gloo's threads,
    while DDP's reducer issues its own all-reduce (the used-parameter map) from the backward's
    thread: the ranks can issue them in different orders and mismatch. Finished inside the hook,
    they come first on every rank. NCCL orders them on its stream; on gloo (CPU) there is no
    compute to overlap with anyway.
    """
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(powerSGD_hook(state, bucket).wait())
    return done


_COMPRESS_HOOKS = {
    ("bf16", "nccl"): default_hooks.bf16_compress_hook,
    ("bf16", "gloo"): gloo_bf16_compress_hook,
    ("fp16", "nccl"): default_hooks.fp16_compress_hook,
    ("fp16", "gloo"): default_hooks.fp16_compress_hook,
}
_POWERSGD_TENSOR_DICTS = ("error_dict", "p_memory_dict", "q_memory_dict")


class GradComm:
    """The communication hook registered on one DDP model, and its checkpointable state."""

    def __init__(
        self, state: PowerSGDState | PostLocalSGDState | None = None, averager: PeriodicModelAverager | None = None,
        *, device: torch.device | None = None,
    ):
        self.state, self.averager, self.device = state, averager, device

    def after_step(self, model: torch.nn.Module) -> None:
        """After each optimizer step: local SGD averages the models when a period ends."""
        if self.averager is not None:
            self.averager.average_parameters(model.parameters())

    def state_bytes(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bytes | None:
        """This rank's state as bytes for the checkpoint (``torch.load(weights_only=True)`` reads
        them back); None for a stateless hook.

        Local SGD also saves this rank's own parameters and optimizer state: between averages the
        ranks' copies differ, and the checkpoint's model and optimizer hold one rank's (DCP writes a
        tensor that every DDP rank holds once).
        """
        if isinstance(self.state, PowerSGDState):
            plain = powersgd_plain_state(self.state)
        elif isinstance(self.state, PostLocalSGDState):
            plain = {"iter": self.state.iter, "averager_step": self.averager.step,
                     "parameters": {name: p.detach().cpu().clone() for name, p in model.named_parameters()},
                     "optimizer": optimizer.state_dict()}
        else:
            return None
        buffer = io.BytesIO()
        torch.save(plain, buffer)
        return buffer.getvalue()

    def load_state_bytes(self, data: bytes, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Restore what ``state_bytes`` saved (after the checkpoint's model and optimizer are loaded)."""
        plain = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if isinstance(self.state, PowerSGDState):
            set_powersgd_plain_state(self.state, plain, self.device)
        elif isinstance(self.state, PostLocalSGDState):
            self.state.iter, self.averager.step = plain["iter"], plain["averager_step"]
            with torch.no_grad():
                for name, parameter in model.named_parameters():
                    parameter.copy_(plain["parameters"][name])
            optimizer.load_state_dict(plain["optimizer"])


def register_grad_comm(net: torch.nn.Module, trainer: TrainerConfig) -> GradComm | None:
    """Register the hook that ``trainer.grad_comm`` / ``sync_every`` ask for on ``net``; None when
    they ask for none, or when ``net`` is no DDP model (one rank: nothing to communicate)."""
    if not isinstance(net, DistributedDataParallel):
        return None
    if trainer.grad_comm in ("bf16", "fp16"):
        net.register_comm_hook(None, _COMPRESS_HOOKS[trainer.grad_comm, dist.get_backend()])
        return GradComm()
    if trainer.grad_comm == "powersgd":
        state = PowerSGDState(
            process_group=None, matrix_approximation_rank=trainer.powersgd_rank,
            start_powerSGD_iter=trainer.comm_warmup_steps, random_seed=trainer.seed,
        )
        net.register_comm_hook(state, gloo_powerSGD_hook if dist.get_backend() == "gloo" else powerSGD_hook)
        return GradComm(state, device=next(net.parameters()).device)
    if trainer.sync_every > 1:
        # A group of one per rank: after the warm-up each rank keeps its own gradients (the
        # default, one group per node, needs GPUs to count and would all-reduce within a node).
        own_group, _ = dist.new_subgroups(group_size=1)
        state = PostLocalSGDState(process_group=None, subgroup=own_group, start_localSGD_iter=trainer.comm_warmup_steps)
        net.register_comm_hook(state, post_localSGD_hook)
        return GradComm(state, PeriodicModelAverager(period=trainer.sync_every, warmup_steps=trainer.comm_warmup_steps))
    return None


def powersgd_plain_state(state: PowerSGDState) -> dict[str, Any]:
    """``PowerSGDState.__getstate__`` (every slot but the process group) as tensors, ints, floats
    and strings: the numpy RNG becomes its ``get_state()`` fields, bucket dicts get string keys."""
    plain = dict(state.__getstate__())
    name, keys, pos, has_gauss, gauss = plain.pop("rng").get_state()
    plain["rng"] = {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                    "has_gauss": int(has_gauss), "cached_gaussian": float(gauss)}
    for name in _POWERSGD_TENSOR_DICTS:
        plain[name] = {str(bucket): tensor.detach().cpu().clone() for bucket, tensor in plain[name].items()}
    return plain


def set_powersgd_plain_state(state: PowerSGDState, plain: dict[str, Any], device: torch.device) -> None:
    """Restore what ``powersgd_plain_state`` returned into ``state`` (keeping its process group),
    its tensors on ``device``, where the gradients are."""
    plain = dict(plain)
    rng = plain.pop("rng")
    random_state = np.random.RandomState()
    random_state.set_state((rng["name"], rng["keys"].numpy().astype(np.uint32), rng["pos"], rng["has_gauss"],
                            rng["cached_gaussian"]))
    for name in _POWERSGD_TENSOR_DICTS:
        setattr(state, name, {int(bucket): tensor.to(device) for bucket, tensor in plain.pop(name).items()})
    state.rng = random_state
    for slot, value in plain.items():
        setattr(state, slot, value)
