"""Makespan of N short trials through hpcsweep, beside one bare ``sbatch --array`` of the same trials.

    eval "$(scripts/slurm-cluster env)"; python benchmarks/makespan.py [--trials 32] [--steps 20] [--parallelism 8]

The hpcsweep side is the command a user types, ``python -m hpcsweep -m model.lr=...`` (one job
array, ``array_parallelism`` at a time). The bare side is one ``sbatch --array=0-N%P`` whose task i
runs the same single trial, ``python -m hpcsweep model.lr=LR_i``, with the same CPUs and time
limit. The sides run one after the other, not at once: they share this host's cores.

Both are read from accounting (``sacct``: Submit, Start, End of every array task): the makespan is
from the first Submit to the last End; a task's start-up is from its Slurm Start to the first
training step its trial logs (``train.log``, ``trainer.log_every=1``). The ratio hpcsweep / bare
is printed beside the target, at most 1.0x.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

TARGET_RATIO = 1.0
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
FIRST_STEP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank0 \S+: step \d+ loss ", re.MULTILINE)
TIMEOUT_MIN = 15


def trial_overrides(steps: int) -> list[str]:
    """The short trial both sides run: the tiny model on CPU, a step logged each step."""
    return [
        f"trainer.max_steps={steps}", f"trainer.eval_every={steps}", f"trainer.ckpt_every={steps}",
        "trainer.log_every=1", "trainer.warmup_steps=2", "trainer.eval_batches=1", "trainer.device=cpu",
        "trainer.nproc_per_node=1", "data.batch_size=4", "data.seq_len=32", "topology.mode=off",
    ]


def learning_rates(n: int) -> list[str]:
    return [f"{1e-5 * (i + 1):.6g}" for i in range(n)]


def run(argv: list[str], cwd: Path) -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(argv[:6])} ... failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc.stdout


def submit_hpcsweep(n: int, steps: int, parallelism: int, workdir: Path) -> tuple[list[str], Path]:
    """The sweep's array job ids and its sweep dir, once ``python -m hpcsweep -m`` has returned."""
    run([sys.executable, "-m", "hpcsweep", "-m", f"model.lr={','.join(learning_rates(n))}", *trial_overrides(steps),
         f"hydra.launcher.array_parallelism={parallelism}", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.gpus_per_node=0", f"hydra.launcher.timeout_min={TIMEOUT_MIN}", "hydra.sweep.dir=sweep"],
        workdir)
    record = json.loads((workdir / "sweep" / "sweep.json").read_text())
    return [array["array_job_id"] for array in record["arrays"]], workdir / "sweep"


def bare_script(n: int, steps: int, run_dir: Path) -> str:
    """A batch script whose task i runs the single trial with the i-th learning rate."""
    command = [sys.executable, "-m", "hpcsweep", *trial_overrides(steps)]
    return "\n".join([
        "#!/bin/bash",
        f"LRS=({' '.join(learning_rates(n))})",
        f'exec {shlex.join(command)} "model.lr=${{LRS[$SLURM_ARRAY_TASK_ID]}}" '
        f'"hydra.run.dir={run_dir}/$SLURM_ARRAY_TASK_ID"',
        "",
    ])


def submit_bare(n: int, steps: int, parallelism: int, workdir: Path) -> tuple[list[str], Path]:
    """The bare array's job id and the dir holding its trial dirs (one per task id)."""
    script = workdir / "bare.sbatch"
    script.write_text(bare_script(n, steps, workdir / "bare"))
    out = run(["sbatch", "--parsable", f"--array=0-{n - 1}%{parallelism}", "--cpus-per-task=1",
               f"--time={TIMEOUT_MIN}", f"--output={workdir}/bare-%A_%a.out", f"--chdir={workdir}", str(script)],
              workdir)
    return [out.strip().split(";")[0]], workdir / "bare"


@dataclass(frozen=True)
class TaskTimes:
    """One array task's accounting: its ``ARRAYID_TASK`` label, state, and Submit, Start, End."""

    label: str
    state: str
    submit: datetime
    start: datetime | None
    end: datetime | None


def parse_sacct(text: str) -> list[TaskTimes]:
    """Array task rows of ``sacct -X --parsable2 --format=JobID,State,Submit,Start,End`` (pending ranges skipped)."""
    def when(value: str) -> datetime | None:
        return None if value in ("Unknown", "None", "") else datetime.fromisoformat(value)

    rows = []
    for line in text.splitlines():
        job_id, state, submit, start, end = line.split("|")
        if re.fullmatch(r"\d+_\d+", job_id):
            rows.append(TaskTimes(job_id, state.split()[0], when(submit), when(start), when(end)))
    return rows


def wait_for_tasks(job_ids: list[str], n: int, timeout_s: float) -> list[TaskTimes]:
    """Poll accounting until all ``n`` array tasks have ended; their times."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(
            ["sacct", "-X", "--noheader", "--parsable2", "-j", ",".join(job_ids), "--format=JobID,State,Submit,Start,End"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout
        tasks = parse_sacct(out)
        if len(tasks) == n and all(t.state in TERMINAL and t.end for t in tasks):
            return tasks
        if time.monotonic() > deadline:
            raise SystemExit(f"jobs {job_ids}: not all {n} tasks ended within {timeout_s:.0f} s")
        time.sleep(5)


def first_step_at(trial_dir: Path) -> datetime:
    """When the trial logged its first training step."""
    match = FIRST_STEP.search((trial_dir / "train.log").read_text())
    if not match:
        raise SystemExit(f"{trial_dir}/train.log logs no training step")
    return datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f")


@dataclass(frozen=True)
class Side:
    """What one side measured: makespan and the mean Slurm-start-to-first-step of its tasks, in seconds."""

    makespan_s: float
    start_to_step_s: float
    failed: int


def measure(tasks: list[TaskTimes], trial_dir_of: dict[str, Path]) -> Side:
    makespan = (max(t.end for t in tasks) - min(t.submit for t in tasks)).total_seconds()  # type: ignore[type-var]
    done = [t for t in tasks if t.state == "COMPLETED"]
    lags = [(first_step_at(trial_dir_of[t.label]) - t.start).total_seconds() for t in done]  # type: ignore[operator]
    return Side(makespan, statistics.mean(lags) if lags else float("nan"), len(tasks) - len(done))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--parallelism", type=int, default=8, help="array_parallelism, and %%P of the bare array")
    parser.add_argument("--timeout-s", type=float, default=3600, help="per side")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sides: dict[str, Side] = {}
    with tempfile.TemporaryDirectory(prefix="makespan-") as tmp:
        for name, submit in (("hpcsweep", submit_hpcsweep), ("bare", submit_bare)):
            workdir = Path(tmp) / name
            workdir.mkdir()
            job_ids, trials_dir = submit(args.trials, args.steps, args.parallelism, workdir)
            tasks = wait_for_tasks(job_ids, args.trials, args.timeout_s)
            if name == "hpcsweep":
                trials = json.loads((trials_dir / "sweep.json").read_text())["trials"]
                dir_of = {t["job_id"]: workdir / t["trial_dir"] for t in trials}
            else:
                dir_of = {t.label: trials_dir / t.label.split("_")[1] for t in tasks}
            sides[name] = measure(tasks, dir_of)
    ours, bare = sides["hpcsweep"], sides["bare"]
    print(f"{args.trials} trials x {args.steps} steps, {args.parallelism} at a time")
    print(f"{'':<34} {'hpcsweep -m':>12} {'bare sbatch --array':>20}")
    print(f"{'makespan (s)':<34} {ours.makespan_s:>12.1f} {bare.makespan_s:>20.1f}")
    print(f"{'Slurm start -> first step, mean (s)':<34} {ours.start_to_step_s:>12.1f} {bare.start_to_step_s:>20.1f}")
    print(f"{'failed tasks':<34} {ours.failed:>12} {bare.failed:>20}")
    ratio = ours.makespan_s / bare.makespan_s
    verdict = "met" if ratio <= TARGET_RATIO else "missed"
    print(f"makespan ratio hpcsweep / bare: {ratio:.2f}x (target <= {TARGET_RATIO:.1f}x: {verdict})")


if __name__ == "__main__":
    main()
