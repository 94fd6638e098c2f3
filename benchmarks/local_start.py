"""A local trial's start, forked from the fork server against a fresh interpreter, side by side.

    python benchmarks/local_start.py [--repeats 3] [--trials 4]

Runs the same ``--trials``-trial local sweep of tiny CPU trials with
``hydra.launcher.start_method=forkserver`` (the default) and ``=spawn`` (a fresh interpreter per
trial, the old path), alternating (forkserver, spawn, spawn, forkserver, ...) so that load from
other work on a shared machine hits both alike, and compares the medians:

- start to first step: from the sweep's ``trial #N started`` line to the trial's ``step 1`` line
  in its train.log; for the first trial, from the sweep's ``sweep dir:`` line, logged as the fork
  server starts, so that its wait for the server's imports counts (shown apart);
- the sweep's wall time, from ``python -m hpcsweep -m ...`` to its exit.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "hydra/launcher=local", "trainer.device=cpu", "trainer.nproc_per_node=1", "trainer.max_steps=5",
    "trainer.warmup_steps=1", "trainer.eval_every=5", "trainer.eval_batches=1", "trainer.ckpt_every=5",
    "trainer.log_every=1", "data.batch_size=4", "data.seq_len=32", "data.synthetic_tokens=50000",
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
]
METHODS = ("forkserver", "spawn")
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")
STARTED = re.compile(r"trial #(\d+) started")


def stamp(line: str) -> datetime:
    return datetime.strptime(STAMP.search(line)[0], "%Y-%m-%d %H:%M:%S,%f")


def run_sweep(method: str, trials: int, sweep_dir: Path) -> tuple[float, list[float]]:
    """One local sweep: its wall time and each trial's start to first step, in seconds, in trial order."""
    lrs = ",".join(f"{(num + 1) * 1e-4:g}" for num in range(trials))
    # ++: the key is set whether or not this checkout's launcher config declares it already.
    command = [sys.executable, "-m", "hpcsweep", "-m", f"model.lr={lrs}", *TINY,
               f"++hydra.launcher.start_method={method}", f"hydra.sweep.dir={sweep_dir}"]
    began = time.perf_counter()
    proc = subprocess.run(command, cwd=sweep_dir.parent, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - began
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"the {method} sweep failed (exit {proc.returncode}):\n{output[-3000:]}")
    started = {int(m[1]): stamp(line) for line in output.splitlines() if (m := STARTED.search(line))}
    (started[0],) = [stamp(line) for line in output.splitlines() if "] sweep dir: " in line]
    firsts = []
    for num in range(trials):
        log = (sweep_dir / str(num) / "train.log").read_text().splitlines()
        (first,) = [line for line in log if " step 1 loss " in line]
        firsts.append((stamp(first) - started[num]).total_seconds())
    return wall, firsts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="sweeps per start method")
    parser.add_argument("--trials", type=int, default=4, help="trials per sweep, run one at a time")
    args = parser.parse_args(argv)

    walls: dict[str, list[float]] = {method: [] for method in METHODS}
    first_trial: dict[str, list[float]] = {method: [] for method in METHODS}
    later_trials: dict[str, list[float]] = {method: [] for method in METHODS}
    with tempfile.TemporaryDirectory(prefix="local-start-") as tmp:
        for repeat in range(args.repeats):
            for method in METHODS if repeat % 2 == 0 else METHODS[::-1]:
                wall, firsts = run_sweep(method, args.trials, Path(tmp) / f"{method}-{repeat}")
                walls[method].append(wall)
                first_trial[method].append(firsts[0])
                later_trials[method].extend(firsts[1:])
                print(f"{method:10s} sweep {wall:6.2f} s; start to first step: "
                      + ", ".join(f"{s:.2f}" for s in firsts) + " s", flush=True)

    def median(values: list[float]) -> float:
        return statistics.median(values)

    print(f"\nmedians over {args.repeats} sweeps of {args.trials} trials each (load {os.getloadavg()[0]:.1f}):")
    print(f"{'':34s}{'forkserver':>12s}{'spawn':>10s}{'ratio':>8s}")
    for label, values in (
        ("start to first step, later trials", later_trials),
        ("start to first step, first trial", first_trial),
        (f"{args.trials}-trial sweep wall time", walls),
    ):
        fork, spawn = median(values["forkserver"]), median(values["spawn"])
        print(f"{label:34s}{fork:10.2f} s{spawn:8.2f} s{fork / spawn:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
