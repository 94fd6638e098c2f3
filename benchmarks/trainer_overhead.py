"""Tokens/s of hpcsweep's Trainer against a bare PyTorch loop: same model, batch and steps.

    python benchmarks/trainer_overhead.py [--steps 30] [--repeats 5]

Both run in this one process, alternating (trainer, bare, trainer, bare, ...) so that load from
other work on a shared machine hits both alike; the medians are compared. The trainer run is the
real ``Trainer.fit`` loop (on-the-fly batches, schedule, logging, metrics.json, TensorBoard, stop
checks); the bare loop is forward, loss, backward, clip, step over pre-built batches, as in
nanoGPT. Both are timed from the end of step 1 to the end of step N, so the scheduled final
evaluation and checkpoint (which a bare loop lacks) are not counted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

from hpcsweep.config import trial_config_from_dict  # noqa: E402
from hpcsweep.train import data, model  # noqa: E402
from hpcsweep.train.distributed import WorldInfo  # noqa: E402
from hpcsweep.train.trainer import Trainer  # noqa: E402

CLOCK = time.perf_counter
"""Wall time by default; ``--cpu-time`` switches to this process's CPU time, which load from other
processes on a shared machine disturbs far less. With more than one intra-op thread, CPU time also
counts OpenMP threads spin-waiting between parallel regions, so compare CPU time at
OMP_NUM_THREADS=1."""


def trainer_tokens_per_s(cfg, steps: int) -> float:
    """Steady-state tokens/s of ``Trainer.fit``: steps 2..N, timed from its step hook."""
    stamps: dict[int, float] = {}

    def stamp(trainer: Trainer, step: int) -> None:
        stamps[step] = CLOCK()

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, WorldInfo(0, 0, 1, torch.device("cpu"), None), Path(tmp), hooks=[stamp])
        trainer.fit()
        trainer.close()
    return (steps - 1) * cfg.data.batch_size * cfg.data.seq_len / (stamps[steps] - stamps[1])


def bare_tokens_per_s(cfg, steps: int) -> float:
    """Steady-state tokens/s of a bare loop over the same batches: steps 2..N."""
    net = model.build_model(cfg.model, cfg.trainer.seed)
    corpus = data.load_corpus(cfg.data, cfg.model.vocab_size)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.model.lr, betas=tuple(cfg.trainer.betas), foreach=True)
    batches = [
        data.get_batch(corpus, cfg.data, split="train", step=s, rank=0, micro_step=0, world_size=1, grad_accum=1)
        for s in range(steps)
    ]
    for step, (inputs, targets) in enumerate(batches):
        if step == 1:
            start = CLOCK()
        loss = F.cross_entropy(net(input_ids=inputs).logits.flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.trainer.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    loss.item()
    return (steps - 1) * cfg.data.batch_size * cfg.data.seq_len / (CLOCK() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cpu-time", action="store_true", help="time with process CPU time, not wall time")
    args = parser.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    cfg = trial_config_from_dict(
        {"trainer": {"device": "cpu", "max_steps": args.steps, "eval_every": args.steps, "ckpt_every": 0}}
    )
    trainer_tokens_per_s(cfg, args.steps), bare_tokens_per_s(cfg, args.steps)  # warm-up
    runs: dict[str, list[float]] = {"trainer": [], "bare": []}
    for _ in range(args.repeats):
        runs["trainer"].append(trainer_tokens_per_s(cfg, args.steps))
        runs["bare"].append(bare_tokens_per_s(cfg, args.steps))
    trainer, bare = statistics.median(runs["trainer"]), statistics.median(runs["bare"])
    # Each pair ran back to back under the same load: the median pair ratio resists bursts best.
    pair_ratio = statistics.median(t / b for t, b in zip(runs["trainer"], runs["bare"]))
    print(f"deepseek_tiny, batch {cfg.data.batch_size}x{cfg.data.seq_len}, {args.steps} steps, {args.repeats} repeats, {'CPU' if args.cpu_time else 'wall'} time")
    print(f"trainer {trainer:9.0f} tokens/s  (runs: {', '.join(f'{x:.0f}' for x in runs['trainer'])})")
    print(f"bare    {bare:9.0f} tokens/s  (runs: {', '.join(f'{x:.0f}' for x in runs['bare'])})")
    print(f"ratio   {trainer / bare:.3f} (medians), {pair_ratio:.3f} (median of back-to-back pairs)")


if __name__ == "__main__":
    main()
