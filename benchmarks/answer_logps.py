"""The peak memory and CPU time of DPO's loss on a batch's logits: the answers' log-probabilities in chunks against
the log-softmax of every token at once, on CPU.

    python benchmarks/answer_logps.py [--vocab 129280] [--pairs 2] [--prompt 256] [--answer 384] [--rounds 3]
                                      [--chunk-tokens 256] [--json FILE]

A batch of ``pairs`` preference pairs, each as two rows (the prompt with the chosen answer, the prompt with the
rejected one), holds fp32 logits of DeepSeek-V3's 129,280-word vocabulary with a leaf's gradient, as the LM
head's output would. One step is: each answer's summed log-probability, DPO's sigmoid loss against fixed
reference log-probabilities (``hpcsweep.train.preference.dpo_loss``), backward to the logits. The contenders
alternate in one process, one thread: ``chunked`` (``hpcsweep.train.preference.answer_logps``, ``chunk_tokens``
answer tokens of fp32 work at a time) and ``whole`` (``logits.log_softmax(-1)`` of every position, gathered and
summed per answer, as TRL's ``selective_log_softmax`` on fp32 logits). A step's peak is the rise of the resident
set's high-water mark over its level before the step (``tests/loss_memory.py``); the largest over the rounds. Ends
with

    peak drop X.XX GB = X.XX fp32 logits tensors (rows x T x V x 4 = X.XX GB)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from hpcsweep.config import ObjectiveConfig  # noqa: E402
from hpcsweep.train.preference.answer_logps import answer_logps  # noqa: E402
from hpcsweep.train.preference.dpo_loss import dpo_loss  # noqa: E402
from tests.loss_memory import large_allocations_mapped, step_peak_bytes  # noqa: E402

GB = 1e9


def batch(vocab: int, pairs: int, prompt: int, answer: int) -> dict[str, torch.Tensor]:
    """``2 x pairs`` rows of ``prompt + answer`` positions: row ``2i`` pair ``i``'s chosen answer, ``2i + 1`` its
    rejected one; answer ``r`` is row ``r``'s."""
    generator = torch.Generator().manual_seed(0)
    rows, length = 2 * pairs, prompt + answer
    mask = torch.zeros(rows, length, dtype=torch.bool)
    mask[:, prompt:] = True
    return {"logits": torch.randn(rows, length, vocab, generator=generator).requires_grad_(),
            "targets": torch.randint(0, vocab, (rows, length), generator=generator), "answer_mask": mask,
            "segment_ids": torch.arange(rows).unsqueeze(1).expand(rows, length),
            "reference": -float(answer) * torch.rand(rows, generator=generator) - answer}


def whole_logps(logits: torch.Tensor, targets: torch.Tensor, answer_mask: torch.Tensor,
                segment_ids: torch.Tensor) -> torch.Tensor:
    """Each answer's summed log-probability from the log-softmax of every position at once."""
    per_token = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1) * answer_mask
    return torch.zeros(logits.shape[0], dtype=per_token.dtype).index_add(0, segment_ids[:, 0], per_token.sum(-1))


def step(data: dict[str, torch.Tensor], contender: str, chunk_tokens: int) -> float:
    """One DPO loss step on ``data``'s logits; returns the loss."""
    inputs = {key: data[key] for key in ("logits", "targets", "answer_mask", "segment_ids")}
    if contender == "chunked":
        found = answer_logps(**inputs, chunk_tokens=chunk_tokens, answers=data["logits"].shape[0])
        logps, tokens = found.logps, found.tokens
    else:
        logps, tokens = whole_logps(**inputs), data["answer_mask"].sum(-1)
    reference = data["reference"]
    loss = dpo_loss(logps[0::2], logps[1::2], reference[0::2], reference[1::2], tokens[0::2], tokens[1::2],
                    ObjectiveConfig(kind="dpo")).losses.mean()
    loss.backward()
    data["logits"].grad = None
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=129_280)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--answer", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-tokens", type=int, default=256,
                        help="default: the chunk of the next-token loss on CPU (trainer.loss_chunk_tokens)")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = batch(args.vocab, args.pairs, args.prompt, args.answer)
    contenders = ("whole", "chunked")
    results = {name: {"peak_bytes": [], "cpu_s": [], "loss": []} for name in contenders}
    with large_allocations_mapped():
        for name in contenders:
            step(data, name, args.chunk_tokens)  # warm the allocator
        for _ in range(args.rounds):
            for name in contenders:
                losses: list[float] = []
                start = time.process_time()
                results[name]["peak_bytes"].append(step_peak_bytes(
                    lambda: losses.append(step(data, name, args.chunk_tokens))))  # noqa: B023 (called at once)
                results[name]["cpu_s"].append(time.process_time() - start)
                results[name]["loss"].append(losses[0])
    logits_bytes = data["logits"].numel() * 4
    print(f"vocab {args.vocab}, {args.pairs} pairs = {2 * args.pairs} rows of {args.prompt} prompt + {args.answer} "
          f"answer tokens, chunk {args.chunk_tokens} tokens, {args.rounds} rounds, fp32, one thread")
    print(f"{'answers':<8} {'peak GB (max)':>14} {'peaks GB':>20} {'CPU s/step':>11} {'loss':>9}")
    peak = {}
    for name, record in results.items():
        peak[name] = max(record["peak_bytes"])  # a reading can only miss memory (tests/loss_memory.py)
        peaks = " ".join(f"{b / GB:.2f}" for b in record["peak_bytes"])
        print(f"{name:<8} {peak[name] / GB:>14.2f} {peaks:>20} {statistics.median(record['cpu_s']):>11.2f} "
              f"{record['loss'][-1]:>9.4f}")
    drop = peak["whole"] - peak["chunked"]
    print(f"peak drop {drop / GB:.2f} GB = {drop / logits_bytes:.2f} fp32 logits tensors "
          f"(rows x T x V x 4 = {logits_bytes / GB:.2f} GB)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                                         "logits_bytes": logits_bytes, "drop_bytes": drop}, indent=1))


if __name__ == "__main__":
    main()
