"""Makespan of N short trials packed ``trials_per_task`` to a task, beside the same trials one per task.

    eval "$(scripts/slurm-cluster env)"; python benchmarks/packing.py [--trials 64] [--steps 20] \\
        [--trials-per-task 8] [--parallelism 8]

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--trials-per-task", type=int, default=8)
    parser.add_argument("--parallelism", type=int, default=8)
    args = parser.parse_args()
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
