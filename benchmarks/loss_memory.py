"""The peak memory of one training step: the loss at the head and the chunked logits against the unchunked fp32 loss, on CPU.

    python benchmarks/loss_memory.py [--vocab 129280] [--seq-len 2048] [--batch 1] [--rounds 3]
                                     [--chunk-tokens 256] [--precision fp32|bf16] [--json FILE]

A Llama of DeepSeek-V3's 129,280-word vocabulary and almost nothing else (hidden 32, one layer, so the
logits dominate) takes AdamW steps at ``batch x seq-len`` tokens, alternating between the trainer's loss
(``head``: ``hpcsweep.train.head_loss``, a chunk's logits at a time from the hidden states), the chunked
loss on the logits (``chunked``: ``hpcsweep.train.loss``, for models that change their logits after the
head) and the loss both replaced (``unchunked``: ``F.cross_entropy(logits.float().flatten(0, 1), targets)``),
chunks of ``trainer.loss_chunk_tokens``, one thread, in one process; ``--precision
bf16`` runs the model under CPU autocast, so the logits are bf16 as on a GPU. Each step's peak
is the rise of the process's resident-set high-water mark over its level before the step, reset per step
(``tests/loss_memory.py``); a first step of each, unmeasured, makes the optimizer state. Ends with

    peak drop X.XX GB = X.XX fp32 logits tensors (B x T x V x 4 = X.XX GB)
    peak drop at the head X.XX GB = X.XX fp32 logits tensors
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from hpcsweep.memory_plan.loss_chunk import CPU_CHUNK_TOKENS  # noqa: E402
from tests.loss_memory import alternate_step_peaks, tiny_lm  # noqa: E402

GB = 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=129_280)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-tokens", type=int, default=CPU_CHUNK_TOKENS,
                        help="default: what trainer.loss_chunk_tokens=null gives on CPU")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = alternate_step_peaks(tiny_lm(args.vocab), batch=args.batch, seq_len=args.seq_len,
                                   rounds=args.rounds, chunk_tokens=args.chunk_tokens, precision=args.precision)
    logits_bytes = args.batch * args.seq_len * args.vocab * 4
    print(f"vocab {args.vocab}, {args.batch} x {args.seq_len} tokens, chunk {args.chunk_tokens} tokens, "
          f"{args.rounds} rounds, {args.precision}, one thread")
    print(f"{'loss':<10} {'peak GB (max)':>14} {'peaks GB':>24} {'CPU s/step':>11} {'loss':>9}")
    peak = {}
    for name, record in results.items():
        peak[name] = max(record["peak_bytes"])  # a reading can only miss memory (tests/loss_memory.py)
        peaks = " ".join(f"{b / GB:.2f}" for b in record["peak_bytes"])
        print(f"{name:<10} {peak[name] / GB:>14.2f} {peaks:>24} "
              f"{statistics.median(record['cpu_s']):>11.2f} {record['loss'][-1]:>9.4f}")
    drop = peak["unchunked"] - peak["chunked"]
    print(f"peak drop {drop / GB:.2f} GB = {drop / logits_bytes:.2f} fp32 logits tensors "
          f"(B x T x V x 4 = {logits_bytes / GB:.2f} GB)")
    head_drop = peak["unchunked"] - peak["head"]
    print(f"peak drop at the head {head_drop / GB:.2f} GB = {head_drop / logits_bytes:.2f} fp32 logits tensors")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                                         "logits_bytes": logits_bytes, "drop_bytes": drop,
                                         "head_drop_bytes": head_drop}, indent=1))


if __name__ == "__main__":
    main()
