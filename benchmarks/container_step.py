"""*cluster.* A trial's start and step time in Slurm's OCI container (runc) against bare, side by side.

    python benchmarks/container_step.py --bundle DIR [--repeats 3] [--steps 20 120]

Needs the local cluster with OCI support (``scripts/slurm-cluster up --oci``, then
``eval "$(scripts/slurm-cluster env)"``) and a bundle from ``scripts/make-test-image DIR``. Submits the same
one-node, one-process trial (the tiny default model, one thread, a step logged each step) as a one-trial
sweep, bare and with ``hydra.launcher.container.runtime=oci``, each side at two lengths (``--steps``),
alternating (bare, oci, oci, bare, ...) so that load from other work on a shared machine hits both alike,
one trial at a time, and compares the medians:

- start: from the job's start in Slurm's accounting (whole seconds) to the trial's first step in its
  train.log (wall time); the container's share is runc's start, the oci.conf wrapper, and the bundle's
  Python importing torch from its own root;
- step, CPU time: the job step's CPU time in Slurm's accounting (``TotalCPU``: the task and every process
  below it, runc and the container included), the shorter trial's taken from the longer's, over the steps
  between: start-up, imports and the first steps cancel out, and load from other work hardly counts;
- step, wall time: the median time between consecutive steps of the longer trial's train.log, the first
  step left out (what load from other work does count in).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

TRIAL = [
    "trainer.warmup_steps=1", "trainer.eval_batches=1", "trainer.log_every=1", "data.batch_size=4",
    "data.seq_len=32", "topology.mode=off", "hydra.launcher.timeout_min=15",
]
SIDES = ("bare", "oci")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank0 \S+: step (\d+) loss ")


def cpu_seconds(text: str) -> float:
    """sacct's ``TotalCPU`` (``[D-][HH:]MM:SS[.mmm]``) in seconds."""
    days, _, clock = text.rpartition("-")
    parts = [float(part) for part in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def accounting(job_id: str) -> tuple[datetime, float] | None:
    """The job's start and its task step's CPU seconds, once it has completed; else None."""
    out = subprocess.run(["sacct", "-n", "-P", "-j", job_id, "--format=JobID,Start,State,TotalCPU"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = {row[0]: row[1:] for row in (line.split("|") for line in out.splitlines() if line)}
    job, step = rows.get(job_id), rows.get(f"{job_id}.0")
    if not job or not step or not job[1].startswith("COMPLETED"):
        return None
    return datetime.fromisoformat(job[0]), cpu_seconds(step[2])


def run_trial(side: str, steps: int, bundle: Path, cwd: Path) -> tuple[float, float, float]:
    """One trial on ``side``: its start (job start to first step), its step's CPU seconds and its median
    step time, in seconds."""
    container = [] if side == "bare" else ["hydra.launcher.container.runtime=oci",
                                           f"hydra.launcher.container.image={bundle}"]
    command = [sys.executable, "-m", "hpcsweep", "-m", *TRIAL, f"trainer.max_steps={steps}",
               f"trainer.eval_every={steps}", f"trainer.ckpt_every={steps}", *container]
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        sys.exit(f"the {side} submission failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    (sweep_file,) = cwd.glob("multirun/*/*/sweep.json")
    (trial,) = json.loads(sweep_file.read_text())["trials"]
    deadline = time.monotonic() + 600
    while (accounted := accounting(trial["job_id"])) is None:
        if time.monotonic() > deadline:
            sys.exit(f"the {side} trial (job {trial['job_id']}) did not complete in 600 s")
        time.sleep(1)
    stamps = [(int(m[2]), datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f"))
              for line in (cwd / trial["trial_dir"]).joinpath("train.log").read_text().splitlines()
              if (m := STAMP.match(line))]
    times = [t for _, t in sorted(stamps)]
    intervals = [(b - a).total_seconds() for a, b in zip(times[1:], times[2:])]
    start, cpu = accounted
    return (times[0] - start).total_seconds(), cpu, statistics.median(intervals)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True, help="the OCI bundle (scripts/make-test-image DIR)")
    parser.add_argument("--repeats", type=int, default=3, help="trials per side")
    parser.add_argument("--steps", type=int, nargs=2, default=[20, 120], metavar=("SHORT", "LONG"),
                        help="training steps of the two trials a side and round")
    args = parser.parse_args(argv)
    if not os.environ.get("SLURM_CONF"):
        sys.exit('no SLURM_CONF: run eval "$(scripts/slurm-cluster env)" first')
    short, long = sorted(args.steps)

    starts: dict[str, list[float]] = {side: [] for side in SIDES}
    step_cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    step_wall: dict[str, list[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="container-step-", dir="/tmp") as tmp:
        for repeat in range(args.repeats):
            for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
                runs = {}
                for steps in (short, long) if repeat % 2 == 0 else (long, short):
                    cwd = Path(tmp) / f"{side}-{repeat}-{steps}"
                    cwd.mkdir()
                    runs[steps] = run_trial(side, steps, args.bundle.resolve(), cwd)
                    starts[side].append(runs[steps][0])
                cpu = (runs[long][1] - runs[short][1]) / (long - short)
                step_cpu[side].append(cpu)
                step_wall[side].append(runs[long][2])
                print(f"{side:5s} start to first step {runs[short][0]:6.2f} / {runs[long][0]:6.2f} s, step CPU "
                      f"{cpu * 1000:7.2f} ms, median step (wall) {runs[long][2] * 1000:7.2f} ms", flush=True)

    print(f"\nmedians over {args.repeats} rounds of a {short}- and a {long}-step trial a side "
          f"(load {os.getloadavg()[0]:.1f}):")
    print(f"{'':22s}{'bare':>10s}{'oci':>10s}{'oci/bare':>10s}")
    for label, values, unit, scale in (("start to first step", starts, "s", 1.0),
                                       ("step, CPU time", step_cpu, "ms", 1000.0),
                                       ("step, wall time", step_wall, "ms", 1000.0)):
        bare, oci = statistics.median(values["bare"]), statistics.median(values["oci"])
        print(f"{label:22s}{bare * scale:8.2f}{unit:>2s}{oci * scale:8.2f}{unit:>2s}{oci / bare:9.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
