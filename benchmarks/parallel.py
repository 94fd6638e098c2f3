"""FSDP vs DDP on CPU (gloo): what each rank holds, and how fast they train, side by side.

    python benchmarks/parallel.py [--ranks 2 4] [--steps 6] [--json FILE]

For each rank count it trains the same model (configs/model/deepseek_tiny.yaml, the default) with
``trainer.parallel=ddp`` and ``fsdp``, one process per rank, through the product's own pieces
(``hpcsweep.train.parallel.wrap_model``, ``optim.build_optimizer``), and prints per rank:
  - the bytes of its parameters, gradients and AdamW state after an optimizer step (the local
    shards under FSDP), and FSDP's share of DDP's (target at 2 ranks: at most 0.6);
  - tokens/s over the last ``--steps`` steps, and FSDP's ratio to DDP (informational: on CPU
    gloo's all-gathers are slow, on GPUs NCCL overlaps them with compute).
Exits 1, with a line starting with ``FAIL``, when FSDP holds more than 0.6 of DDP at 2 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from hpcsweep.config import trial_config_from_dict  # noqa: E402
from hpcsweep.train import model as model_lib, optim, parallel  # noqa: E402
from hpcsweep.train.distributed import WorldInfo  # noqa: E402
from hpcsweep.train.gpu_choices import DeviceFacts  # noqa: E402

TARGET_AT_2_RANKS = 0.6
BATCH, SEQ_LEN, WARMUP_STEPS = 4, 64, 2


def local_bytes(tensor: torch.Tensor) -> int:
    """What this rank stores of ``tensor``: its shard when it is a DTensor."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def held_bytes(net_model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    params = list(net_model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return {
        "parameters": sum(local_bytes(p) for p in params),
        "gradients": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(local_bytes(v) for v in state),
    }


def worker(rank: int, world_size: int, mode: str, steps: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    cfg = trial_config_from_dict({"trainer": {"parallel": mode, "device": "cpu"}})
    world = WorldInfo(rank, rank, world_size, torch.device("cpu"), "gloo")
    model = model_lib.build_model(cfg.model, seed=0, attn_implementation="eager")
    net = parallel.wrap_model(model, world, mode, cfg.trainer, facts=DeviceFacts("cpu"), precision="fp32",
                              find_unused_parameters=False)
    optimizer = optim.build_optimizer(model, cfg.model, cfg.trainer)
    generator = torch.Generator().manual_seed(rank)
    held: dict[str, int] = {}
    start = 0.0
    for step in range(WARMUP_STEPS + steps):
        if step == WARMUP_STEPS:
            dist.barrier()
            start = time.perf_counter()
        tokens = torch.randint(cfg.model.vocab_size, (BATCH, SEQ_LEN + 1), generator=generator)
        logits = net(input_ids=tokens[:, :-1]).logits
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        parallel.clip_grad_norm(model, 1.0)
        optimizer.step()
        held = held_bytes(model, optimizer)  # after the step: gradients and both AdamW moments exist
        optimizer.zero_grad(set_to_none=True)
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        tokens_per_s = steps * BATCH * SEQ_LEN * world_size / elapsed
        Path(out).write_text(json.dumps({**held, "tokens_per_s": tokens_per_s}))
    dist.destroy_process_group()


def measure(world_size: int, mode: str, steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="parallel-bench-") as tmp:
        out = os.path.join(tmp, "rank0.json")
        mp.spawn(worker, args=(world_size, mode, steps, os.path.join(tmp, "init"), out), nprocs=world_size)
        result = json.loads(Path(out).read_text())
    result["total"] = result["parameters"] + result["gradients"] + result["optimizer"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=6, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    print(f"{socket.gethostname()}: torch {torch.__version__}, {os.cpu_count()} CPUs, gloo; model deepseek_tiny, "
          f"batch {BATCH}x{SEQ_LEN} per rank")
    rows, failed = [], False
    for world_size in args.ranks:
        ddp, fsdp = measure(world_size, "ddp", args.steps), measure(world_size, "fsdp", args.steps)
        share, speed = fsdp["total"] / ddp["total"], fsdp["tokens_per_s"] / ddp["tokens_per_s"]
        rows.append({"ranks": world_size, "ddp": ddp, "fsdp": fsdp, "memory_share": share, "tokens_per_s_ratio": speed})
        for name, r in (("ddp", ddp), ("fsdp", fsdp)):
            print(f"{world_size} ranks {name:>4}: per rank {r['total'] / 2**20:6.2f} MiB (parameters "
                  f"{r['parameters'] / 2**20:.2f}, gradients {r['gradients'] / 2**20:.2f}, AdamW "
                  f"{r['optimizer'] / 2**20:.2f}), {r['tokens_per_s']:.0f} tokens/s")
        print(f"{world_size} ranks: FSDP holds x{share:.2f} of DDP per rank, trains at x{speed:.2f} its tokens/s")
        if world_size == 2 and share > TARGET_AT_2_RANKS:
            print(f"FAIL: FSDP holds x{share:.2f} of DDP at 2 ranks, above the target x{TARGET_AT_2_RANKS}",
                  file=sys.stderr)
            failed = True
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
