"""How long a non-blocking sweep submission takes, beside one bare ``sbatch --array`` of the same size.

    eval "$(scripts/slurm-cluster env)"; python benchmarks/submit.py [--sizes 100 1000] [--repeats 2]

Both sides submit held jobs (``--hold``) that are cancelled at once, so nothing runs. The hpcsweep
side is the whole command a user types, `python -m hpcsweep -m model.lr=...`: interpreter start,
Hydra composition and validation of every trial, submitit pickles, sbatch, sweep.json. Sizes and
sides alternate within one run, since this machine is noisy; the CPU time (user + system) of the
hpcsweep command is printed too, as other load changes it little. The target: at most 2 s for 1,000
trials, in at most ceil(N / MaxArraySize) sbatch calls (the arrays of each sweep are counted).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


CPU_S: dict[int, list[float]] = {}
"""CPU seconds (user + system, children included) of each hpcsweep submission, by size: unlike the
wall time, hardly changed by other load on the machine."""


def child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], check=True, timeout=120)


TARGET_S = 2.0
TARGET_TRIALS = 1000


def max_array_size() -> int:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True, timeout=60).stdout
    return int(next(line.split("=")[1] for line in out.splitlines() if line.startswith("MaxArraySize")))


def submit_sweep(n: int, workdir: Path, arrays: dict[int, int]) -> float:
    lrs = ",".join(f"{1e-5 * (i + 1):.6g}" for i in range(n))
    cpu_before = child_cpu_s()
    elapsed, _ = timed(
        [sys.executable, "-m", "hpcsweep", "-m", f"model.lr={lrs}", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.gpus_per_node=0", "+hydra.launcher.additional_parameters.hold=true"],
        workdir,
    )
    CPU_S.setdefault(n, []).append(child_cpu_s() - cpu_before)
    (sweep_file,) = workdir.glob("multirun/*/*/sweep.json")
    job_ids = [a["array_job_id"] for a in json.loads(sweep_file.read_text())["arrays"]]
    arrays[n] = len(job_ids)
    cancel(job_ids)
    sweep_file.rename(sweep_file.with_suffix(".done"))
    return elapsed


def submit_bare(n: int, workdir: Path) -> float:
    elapsed, out = timed(
        ["sbatch", "--parsable", "--hold", f"--array=0-{n - 1}", "--cpus-per-task=1", "--output=/dev/null",
         "--wrap", "true"],
        workdir,
    )
    cancel([out.strip().split(";")[0]])
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    times: dict[tuple[int, str], list[float]] = {}
    arrays: dict[int, int] = {}
    cap = max_array_size()
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for n in args.sizes:
                workdir = Path(tmp) / f"{n}-{repeat}"
                workdir.mkdir()
                times.setdefault((n, "bare"), []).append(submit_bare(n, workdir))
                times.setdefault((n, "hpcsweep"), []).append(submit_sweep(n, workdir, arrays))
    print(f"{'trials':>7} {'bare sbatch --array (s)':>24} {'python -m hpcsweep -m (s)':>26} {'CPU (s)':>8} "
          f"{'ratio':>7} {'sbatch calls':>13} {'target':>22}")
    for n in args.sizes:
        bare = statistics.median(times[(n, "bare")])
        ours = statistics.median(times[(n, "hpcsweep")])
        calls = math.ceil(n / cap)
        if n <= TARGET_TRIALS:
            verdict = "met" if ours <= TARGET_S and arrays[n] <= calls else "MISSED"
            target = f"<= {TARGET_S:g} s, {calls} call(s): {verdict}"
        else:
            target = f"(for <= {TARGET_TRIALS} trials)"
        cpu = statistics.median(CPU_S[n])
        print(f"{n:>7} {bare:>24.2f} {ours:>26.2f} {cpu:>8.2f} {ours / bare:>6.0f}x {arrays[n]:>13} {target:>22}")


if __name__ == "__main__":
    main()
