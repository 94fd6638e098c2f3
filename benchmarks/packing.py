"""Makespan of N short trials packed ``trials_per_task`` to a task, beside the same trials one per task;
or, with ``--samples``, useful tokens/s of chat samples packed into rows beside one sample a padded row.

    eval "$(scripts/slurm-cluster env)"; python benchmarks/packing.py [--trials 64] [--steps 20] \\
        [--trials-per-task 8] [--parallelism 8]
    python benchmarks/packing.py --samples [--steps 12] [--seq-len 256] [--rows 8]

``--samples`` (no cluster): a corpus of skewed sample lengths (log-normal, median about 40 tokens,
up to ``seq_len + 1``), the rows the trainer reads (``hpcsweep.train.data.packing.SampleRows``), a tiny
llama with sdpa on CPU at one thread, full training steps (forward, backward, AdamW) on the same
number of rows each, packed and padded alternating step by step, the first of each left out. Useful
tokens are the positions holding a sample's token. The target: packed at least 2x padded.

Both sweeps are the whole command a user types (`python -m hpcsweep -m model.lr=...`) on the
local cluster, the same trials, tiny model, CPU, with the same ``array_parallelism``; the unpacked
one first, then the packed one. A makespan runs from the first task's Submit to the last task's
End, as sacct records them. The target: packed at most 0.5x the unpacked makespan.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_RATIO = 0.5
SAMPLES_TARGET = 2.0
"""``--samples``: packed useful tokens/s at least this many times padded."""
TINY = ["trainer.eval_batches=1", "data.batch_size=4", "data.seq_len=32", "trainer.warmup_steps=2",
        "hydra.launcher.cpus_per_task=1", "hydra.launcher.gpus_per_node=0", "hydra.launcher.timeout_min=30"]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def sacct_times(array_ids: list[str]) -> list[tuple[str, str, str]]:
    out = subprocess.run(["sacct", "-X", "--noheader", "--parsable2", "-j", ",".join(array_ids),
                          "--format=State,Submit,End"], capture_output=True, text=True, check=True, timeout=60).stdout
    return [tuple(line.split("|")) for line in out.splitlines() if line]  # type: ignore[misc]


def run_sweep(workdir: Path, trials: int, steps: int, per_task: int, parallelism: int) -> tuple[float, int]:
    """Submit, wait for every task to end; return the makespan in seconds and the number of tasks."""
    lrs = ",".join(f"{1e-4 * (i + 1):.6g}" for i in range(trials))
    subprocess.run(
        [sys.executable, "-m", "hpcsweep", "-m", f"model.lr={lrs}", f"trainer.max_steps={steps}",
         f"trainer.eval_every={steps}", f"trainer.ckpt_every={steps}", f"trainer.log_every={steps}", *TINY,
         f"hydra.launcher.array_parallelism={parallelism}", f"hydra.launcher.trials_per_task={per_task}"],
        cwd=workdir, capture_output=True, text=True, check=True, timeout=300,
    )
    (sweep_file,) = workdir.glob("multirun/*/*/sweep.json")
    sweep = json.loads(sweep_file.read_text())
    arrays = [a["array_job_id"] for a in sweep["arrays"]]
    tasks = len({t["job_id"] for t in sweep["trials"]})
    deadline = time.monotonic() + 3600
    while True:
        rows = sacct_times(arrays)
        if len(rows) == tasks and all(state.split()[0] in TERMINAL for state, _, _ in rows):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"{workdir}: the sweep did not end within an hour")
        time.sleep(2)
    failed = [row for row in rows if row[0] != "COMPLETED"]
    if failed:
        raise SystemExit(f"{workdir}: {len(failed)} task(s) did not complete: {failed[:3]}")
    submit = min(dt.datetime.fromisoformat(s) for _, s, _ in rows)
    end = max(dt.datetime.fromisoformat(e) for _, _, e in rows)
    return (end - submit).total_seconds(), tasks


def skewed_samples(count: int, seq_len: int, seed: int = 0):
    """Tokens, a loss mask (the second half of each sample), starts and lengths of ``count`` samples."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(40), 0.9, size=count).astype(np.int64), 4, seq_len + 1)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    tokens = rng.integers(1, 256, size=int(lengths.sum())).astype(np.uint16)
    mask = np.zeros(len(tokens), dtype=np.uint8)
    for start, n in zip(starts, lengths):
        mask[start + n // 2 : start + n] = 1
    return tokens, mask, starts, lengths


def sample_packing(steps: int, seq_len: int, rows: int) -> None:
    """Print useful tokens/s of packed rows and of padded rows, and their ratio."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from hpcsweep.config import ModelConfig
    from hpcsweep.train.model import build_model
    from hpcsweep.train.data.packing import SampleRows

    torch.set_num_threads(1)
    tokens, mask, starts, lengths = skewed_samples(4000, seq_len)
    sources = {packing: SampleRows(tokens, mask, starts, lengths, seq_len=seq_len, packing=packing, seed=0, split=0, pad_id=0)
               for packing in (True, False)}
    cfg = ModelConfig(arch="llama", vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2,
                      num_heads=4, num_kv_heads=4, max_position_embeddings=max(512, seq_len))
    model = build_model(cfg, seed=0, attn_implementation="sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seconds = {True: 0.0, False: 0.0}
    useful = {True: 0, False: 0}
    for step in range(steps + 1):
        for packing, source in sources.items():
            batch = source.batch(step * rows, rows)
            start = time.process_time()
            logits = model(input_ids=torch.from_numpy(batch.inputs),
                           position_ids=torch.from_numpy(batch.position_ids)).logits
            F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(batch.targets).flatten()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step:  # the first step of each warms up
                seconds[packing] += time.process_time() - start
                useful[packing] += batch.used
    rate = {packing: useful[packing] / seconds[packing] for packing in sources}
    fill = {packing: source.fill_rate() for packing, source in sources.items()}
    print(f"{len(lengths)} samples, median {int(np.median(lengths))} tokens, max {lengths.max()}; seq_len {seq_len}, "
          f"{rows} rows a step, {steps} steps each, CPU time at 1 thread")
    for packing, name in ((True, "packed"), (False, "padded")):
        print(f"{name}: fill rate {fill[packing]:.3f}, {rate[packing]:8.0f} useful tokens/s")
    ratio = rate[True] / rate[False]
    print(f"ratio {ratio:.2f}x (target >= {SAMPLES_TARGET}x: {'met' if ratio >= SAMPLES_TARGET else 'MISSED'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--trials-per-task", type=int, default=8)
    parser.add_argument("--parallelism", type=int, default=8)
    parser.add_argument("--samples", action="store_true", help="chat samples packed vs padded (no cluster)")
    parser.add_argument("--seq-len", type=int, default=256, help="--samples: positions a row")
    parser.add_argument("--rows", type=int, default=8, help="--samples: rows a step")
    args = parser.parse_args()
    if args.samples:
        sample_packing(args.steps, args.seq_len, args.rows)
        return
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for name, per_task in (("unpacked", 1), ("packed", args.trials_per_task)):
            workdir = Path(tmp) / name
            workdir.mkdir()
            results[name] = run_sweep(workdir, args.trials, args.steps, per_task, args.parallelism)
    (unpacked, unpacked_tasks), (packed, packed_tasks) = results["unpacked"], results["packed"]
    ratio = packed / unpacked
    print(f"{args.trials} trials x {args.steps} steps, array_parallelism {args.parallelism}")
    print(f"unpacked: {unpacked_tasks:>4} tasks, makespan {unpacked:7.1f} s")
    print(f"packed:   {packed_tasks:>4} tasks, makespan {packed:7.1f} s "
          f"(trials_per_task={args.trials_per_task})")
    print(f"ratio {ratio:.2f}x (target <= {TARGET_RATIO}x: {'met' if ratio <= TARGET_RATIO else 'MISSED'})")


if __name__ == "__main__":
    main()
