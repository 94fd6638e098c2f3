"""Time ``status`` and ``report`` on a 1,000-trial sweep, run as a user runs them, beside their targets.

    python benchmarks/status.py [--trials 1000] [--steps 200] [--repeats 5] [--compare-with REV]

Generates a sweep of --trials trials (50% completed, 20% running halfway, 25% pending, 5% failed),
each with sweep.json's entry, metrics.json, config.yaml, .hydra/overrides.yaml and a TensorBoard run:
6 scalars at every step and an HParams file. It is timed twice: as a local sweep (no Slurm command),
and as a Slurm sweep whose ``sacct`` and ``squeue`` are fake commands first on PATH that print one
line per trial and log their calls (so the Slurm path runs, parsing included, without a cluster; a
real controller's answer time comes on top). Each repeat runs, in turn, ``python -c pass`` (the
interpreter's floor), ``python -m hpcsweep.status DIR`` and ``python -m hpcsweep.report DIR`` as
subprocesses. With ``--compare-with REV`` the same commands from git revision REV's ``hpcsweep``
run alternately with them: before and after, side by side, and their outputs compared. Exits 1 when
status misses its target or makes more than one sacct call.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from synthetic_sweep import write_sweep  # noqa: E402

STATUS_TARGET_S = 1.0
MIX = (("completed", 0.50), ("running", 0.20), ("pending", 0.25), ("failed", 0.05))
SLURM_STATES = {"completed": "COMPLETED|600|cpu=8,gres/gpu=1,node=1|node1", "running": "RUNNING|300|cpu=8,gres/gpu=1,node=1|node2",
                "pending": "PENDING|0||None assigned", "failed": "FAILED|100|cpu=8,gres/gpu=1,node=1|node3"}


def statuses(trials: int) -> list[str]:
    counts = [round(share * trials) for _, share in MIX]
    counts[0] += trials - sum(counts)
    return [status for (status, _), count in zip(MIX, counts) for _ in range(count)]


def composed_config() -> str:
    """A trial's config.yaml as Hydra writes it (model.lr=3e-4)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose("config", overrides=["model.lr=3e-4"])
    return OmegaConf.to_yaml(cfg)


def fake_slurm(bin_dir: Path, trial_statuses: list[str], array_id: str) -> None:
    """``sacct`` and ``squeue`` that print one line per trial and log each call."""
    bin_dir.mkdir()
    sacct = "".join(f"{array_id}_{num}|{SLURM_STATES[s]}\n" for num, s in enumerate(trial_statuses))
    squeue = "".join(f"{array_id}_{num}|PENDING||Priority\n" for num, s in enumerate(trial_statuses) if s == "pending")
    for command, text in (("sacct", sacct), ("squeue", squeue)):
        (bin_dir / f"{command}.out").write_text(text)
        script = bin_dir / command
        script.write_text(f'#!/bin/sh\necho "$*" >> "{bin_dir}/{command}.log"\ncat "{bin_dir}/{command}.out"\n')
        script.chmod(0o755)


def calls(bin_dir: Path, command: str) -> int:
    log = bin_dir / f"{command}.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(argv: list[str], source: Path, cwd: Path, path_prefix: Path | None) -> tuple[float, float, str]:
    """Wall time and CPU time (its own and its children's) of one command with hpcsweep from ``source``; its stdout."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    start, cpu_start = time.perf_counter(), children_cpu_s()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    elapsed, cpu = time.perf_counter() - start, children_cpu_s() - cpu_start
    if proc.returncode not in (0, 1):  # status exits 1 when a trial failed, as some here did
        raise SystemExit(f"{' '.join(argv)} (from {source}) exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return elapsed, cpu, proc.stdout


def export_revision(rev: str, dest: Path) -> Path:
    """``hpcsweep/`` of git revision ``rev``, unpacked under ``dest``."""
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "hpcsweep"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def best_wall(times: list[tuple[float, float]]) -> float:
    return min(wall for wall, _ in times)


def summary(times: list[tuple[float, float]]) -> str:
    walls, cpus = [wall for wall, _ in times], [cpu for _, cpu in times]
    return f"wall best {min(walls):.2f} s, median {statistics.median(walls):.2f} s; CPU best {min(cpus):.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compare-with", metavar="REV", help="also time hpcsweep as of this git revision")
    args = parser.parse_args()
    trial_statuses = statuses(args.trials)
    ok = True
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sources = {"now": REPO}
        if args.compare_with:
            sources[args.compare_with] = export_revision(args.compare_with, tmp / "before")
        config_text = composed_config()
        start = time.perf_counter()
        sweeps = {"local": (tmp / "local", None), "slurm": (tmp / "slurm", tmp / "fake-slurm-bin")}
        write_sweep(sweeps["local"][0], trial_statuses, args.steps, config_text)
        write_sweep(sweeps["slurm"][0], trial_statuses, args.steps, config_text, launcher="slurm", array_id="4242")
        fake_slurm(sweeps["slurm"][1], trial_statuses, "4242")
        counts = {s: trial_statuses.count(s) for s, _ in MIX}
        print(f"generated 2 sweeps of {args.trials} trials ({counts}), {args.steps} steps x 6 scalars, "
              f"in {time.perf_counter() - start:.1f} s")

        times: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
        outputs: dict[tuple[str, str, str], str] = {}
        floor = []
        for _ in range(args.repeats):
            floor.append(run([sys.executable, "-c", "pass"], REPO, tmp, None)[:2])
            for kind, (sweep_dir, bin_dir) in sweeps.items():
                for command in ("status", "report"):
                    for label, source in sources.items():
                        before = calls(bin_dir, "sacct") if bin_dir else 0
                        elapsed, cpu, out = run([sys.executable, "-m", f"hpcsweep.{command}", str(sweep_dir)],
                                                source, tmp, bin_dir)
                        if bin_dir and command == "status" and calls(bin_dir, "sacct") - before != 1:
                            print(f"{label} status made {calls(bin_dir, 'sacct') - before} sacct calls, not 1")
                            ok = False
                        times.setdefault((kind, command, label), []).append((elapsed, cpu))
                        outputs[(kind, command, label)] = out

    print(f"python -c pass (floor):  {summary(floor)}")
    for kind in sweeps:
        for command in ("status", "report"):
            target = f"target < {STATUS_TARGET_S:g} s, one sacct call" if command == "status" else "no target"
            for label in sources:
                line = f"{kind:5s} {command:6s} [{label}]: {summary(times[(kind, command, label)])}"
                if label == "now":
                    line += f"   ({target})"
                else:
                    same = outputs[(kind, command, label)] == outputs[(kind, command, "now")]
                    line += (f"   now is {best_wall(times[(kind, command, label)]) / best_wall(times[(kind, command, 'now')]):.1f}x"
                             f" faster; same output: {same}")
                print(line)
            if command == "status" and best_wall(times[(kind, command, "now")]) >= STATUS_TARGET_S:
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
