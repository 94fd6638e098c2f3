"""CPU time of the loss at the LM head, forward and backward, by ``trainer.loss_chunk_tokens``, on CPU.

    python benchmarks/loss_chunk.py [--rounds 4] [--chunks 128 256 512 1024 2048 0] [--shape V H T]
                                    [--quick] [--json FILE]

For each shape a user brings, scaled so one thread runs it in about a minute (a Llama-2 vocabulary of
32,000, DeepSeek-MoE's 102,400, Qwen3's tokenizer's 151,669), the head is attached as the trainer
attaches it (``hpcsweep.train.head_loss.attach``, ``trainer.loss_kernel=torch``) and takes the loss of
random hidden states, then its backward runs; one step per chunk size in turn (``0``: the whole batch),
the order rotated each round, in one process, one thread, timed with ``time.process_time``. The first
round only warms up; each chunk's median over the others is printed beside its ratio to the chunk
``trainer.loss_chunk_tokens=null`` resolves to on CPU (``hpcsweep.memory_plan.loss_chunk``), and what
one chunk holds: its fp32 logits, and the loss as the memory plan counts it (12 B a vocabulary entry a
token in fp32). ``--shape V H T``: that vocabulary, hidden size and tokens instead of the three shapes.
``--quick``: toy sizes, two rounds, for the tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from hpcsweep.memory_plan.loss_chunk import loss_chunk_tokens  # noqa: E402
from hpcsweep.train import head_loss  # noqa: E402

SHAPES = [
    # name, vocabulary, hidden size, tokens: the vocabularies as users bring them, hidden and tokens shrunk.
    ("Llama-2 32k", 32_000, 512, 2048),
    ("DeepSeek-MoE 102k", 102_400, 256, 1024),
    ("Qwen3 152k", 151_669, 256, 1024),
]
QUICK_SHAPES = [("toy", 500, 16, 512)]
CHUNKS = [128, 256, 512, 1024, 2048, 0]
QUICK_CHUNKS = [64, 256, 0]
MB = 1e6


class HeadOnly(torch.nn.Module):
    """A language model of nothing but its head: what ``head_loss.attach`` reads of a model."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
        self.config = SimpleNamespace(to_dict=lambda: {"model_type": "llama"})

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.lm_head


def step_seconds(loss: head_loss.HeadLoss, hidden: torch.Tensor, targets: torch.Tensor) -> float:
    """CPU seconds of one forward and backward of the head's loss; the gradients are dropped after."""
    start = time.process_time()
    with loss.taking(targets) as taken:
        loss.head(hidden)
    taken.loss.backward()
    seconds = time.process_time() - start
    hidden.grad = loss.head.weight.grad = None
    return seconds


def measure(vocab: int, hidden_size: int, tokens: int, chunks: list[int], rounds: int) -> dict[int, list[float]]:
    """Each chunk's CPU seconds a step, rounds after the first; the chunks alternate, the order rotated."""
    generator = torch.Generator().manual_seed(0)
    model = HeadOnly(vocab, hidden_size)
    loss = head_loss.attach(model, "torch", chunks[0], "cpu", installed=frozenset())
    assert loss is not None and loss.kernel == "torch"
    hidden = torch.randn(1, tokens, hidden_size, generator=generator).requires_grad_()
    targets = torch.randint(0, vocab, (1, tokens), generator=generator)
    seconds: dict[int, list[float]] = {chunk: [] for chunk in chunks}
    for round_ in range(rounds):
        for i in range(len(chunks)):
            chunk = chunks[(i + round_) % len(chunks)]
            loss.chunk_tokens = chunk
            taken = step_seconds(loss, hidden, targets)
            if round_ > 0:
                seconds[chunk].append(taken)
    return seconds


def chunk_name(chunk: int, tokens: int) -> str:
    if chunk == 0:
        return f"whole ({tokens})"
    return f"{chunk} (whole)" if chunk >= tokens else str(chunk)


def report(name: str, vocab: int, hidden_size: int, tokens: int, chunks: list[int], rounds: int) -> dict[str, Any]:
    """Measure one shape and print a line per chunk: median, ratio to the CPU default, memory of a chunk."""
    default = loss_chunk_tokens(None, "cpu", vocab, hidden_size, tokens)
    # A chunk of the batch's tokens or more is the whole batch: 0 stands for it (or the first such chunk).
    whole = 0 if 0 in chunks else next((chunk for chunk in chunks if chunk >= tokens), None)
    contenders = [chunk for chunk in chunks if 0 < chunk < tokens or chunk == whole]
    contenders += [default] if default not in contenders else []
    seconds = measure(vocab, hidden_size, tokens, contenders, rounds)
    reference = statistics.median(seconds[default])
    print(f"{name}: vocabulary {vocab}, hidden {hidden_size}, {tokens} tokens, fp32, one thread, "
          f"{rounds - 1} measured rounds; ratio to chunk {default} (trainer.loss_chunk_tokens=null on CPU)")
    print(f"  {'chunk':>12} {'median s':>9} {'ratio':>7} {'fp32 logits MB':>15} {'plan loss MB':>13}  all s")
    rows = {}
    for chunk in contenders:
        rows_in_chunk = tokens if chunk == 0 else min(chunk, tokens)
        median = statistics.median(seconds[chunk])
        rows[chunk] = {"median_s": median, "ratio": median / reference, "seconds": seconds[chunk],
                       "logits_bytes": 4 * rows_in_chunk * vocab, "plan_loss_bytes": 12 * rows_in_chunk * vocab}
        print(f"  {chunk_name(chunk, tokens):>12} {median:>9.3f} {median / reference:>6.2f}x "
              f"{4 * rows_in_chunk * vocab / MB:>15.1f} {12 * rows_in_chunk * vocab / MB:>13.1f}  "
              + " ".join(f"{s:.3f}" for s in seconds[chunk]))
    return {"name": name, "vocab": vocab, "hidden": hidden_size, "tokens": tokens, "default": default, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="rounds, the first left out (default 4; --quick: 2)")
    parser.add_argument("--chunks", type=int, nargs="+", help=f"tokens per chunk, 0: whole (default {CHUNKS})")
    parser.add_argument("--shape", type=int, nargs=3, metavar=("V", "H", "T"),
                        help="one shape: vocabulary, hidden size, tokens (default: the three above)")
    parser.add_argument("--quick", action="store_true", help="toy sizes, for the tests")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 4)
    if rounds < 2:
        parser.error("--rounds must be >= 2: the first round is left out")
    chunks = args.chunks or (QUICK_CHUNKS if args.quick else CHUNKS)
    torch.set_num_threads(1)
    shapes = [("--shape", *args.shape)] if args.shape else QUICK_SHAPES if args.quick else SHAPES
    results = [report(*shape, chunks, rounds) for shape in shapes]
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "torch": torch.__version__, "shapes": results}, indent=1))


if __name__ == "__main__":
    main()
