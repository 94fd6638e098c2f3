"""What router balance costs a training step, and what it does to a router biased toward one expert.

    python benchmarks/router_balance.py [--steps 30] [--repeats 5]

Cost: the built-in model (``deepseek_tiny``: 4 experts, top-2) at batch 16 x 64, AdamW steps with the
balance attached (DeepSeek-V3's bias update at 0.001, the aux loss at 0.001 and the window statistics)
and without it (no hooks at all), alternating in this one process on one thread, CPU time of steps
2..N (step 1 left out); the median of the back-to-back pairs' ratios is reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from hpcsweep.config import ModelConfig, MoeConfig  # noqa: E402
from hpcsweep.train import model as models  # noqa: E402
from hpcsweep.train import moe_balance  # noqa: E402
from hpcsweep.train.distributed import WorldInfo  # noqa: E402

ONE = WorldInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend=None)


def step_seconds(balanced: bool, steps: int) -> float:
    """CPU seconds per step of steps 2..``steps``, with or without the balance attached."""
    cfg = ModelConfig(moe=MoeConfig(aux_loss_coef=0.001, bias_update_rate=0.001))
    net = models.build_model(cfg, seed=0)
    balance = moe_balance.attach(net, cfg) if balanced else moe_balance.NoBalance()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    net.train()
    start = 0.0
    for step in range(1, steps + 1):
        if step == 2:
            start = time.process_time()
        inputs = torch.randint(0, cfg.vocab_size, (16, 64), generator=generator)
        logits = net(input_ids=inputs).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), inputs[:, 1:].flatten())
        (loss + balance.take_aux_loss()).backward()
        balance.after_optimizer_step(ONE)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            balance.window_report(ONE)
    return (time.process_time() - start) / (steps - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ratios = []
    for _ in range(args.repeats):
        off, on = step_seconds(False, args.steps), step_seconds(True, args.steps)
        ratios.append(on / off)
        print(f"step CPU time: balance off {1000 * off:.1f} ms, on {1000 * on:.1f} ms")
    print(f"balance on / off step CPU time, median of {args.repeats} pairs: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
