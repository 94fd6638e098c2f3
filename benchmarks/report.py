"""Time the report's loading of a sweep against reading the same files with TensorBoard.

    python benchmarks/report.py [--trials 100] [--steps 2000] [--repeats 2]

Generates a local sweep in a temp dir (sweep.json, metrics.json and one event file per trial, 6
scalar tags logged every step), then alternates: ``hpcsweep.results.table.load_sweep`` and a
baseline that reads sweep.json, every metrics.json, and every trial's events with TensorBoard's
``EventAccumulator(size_guidance={scalars: 0})``. Prints the best wall time of each and their
ratio, and the ratio of the best CPU times (steadier on a shared machine), asserts both saw
identical points, and exits 1 when the wall ratio is under the 10x target. Event files
are written by ``synthetic_sweep.scalar_event_file``, as ``SummaryWriter.add_scalar`` writes them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    SCALARS,
    EventAccumulator,
)
from synthetic_sweep import TAGS, scalar_event_file  # noqa: E402

from hpcsweep.files.sweep_record import (  # noqa: E402
    SweepRecord,
    TrialRecord,
    read_sweep_record,
    write_sweep_record,
)
from hpcsweep.results.table import load_sweep  # noqa: E402

TARGET_RATIO = 10.0


def write_trial(trial_dir: Path, steps: int, rng: np.random.Generator) -> None:
    """An event file with every tag at every step, and a completed metrics.json."""
    (trial_dir / "tb").mkdir(parents=True)
    values = rng.random((steps, len(TAGS)), dtype=np.float32)
    (trial_dir / "tb" / "events.out.tfevents.1700000000.bench.1.0").write_bytes(scalar_event_file(values))
    metrics = {"status": "completed", "step": steps, "max_steps": steps, "train_loss": float(values[-1, 0]),
               "val_loss": float(values[-1, 1]), "best_val_loss": float(values[:, 1].min()), "tokens_per_s": 1.0,
               "restarts": 0, "world_size": 1, "nodes": ["bench"]}
    (trial_dir / "metrics.json").write_text(json.dumps(metrics))


def generate(sweep_dir: Path, trials: int, steps: int) -> None:
    rng = np.random.default_rng(0)
    records = []
    for num in range(trials):
        write_trial(sweep_dir / str(num), steps, rng)
        records.append(TrialRecord(num, [f"model.lr={1e-4 * (num + 1):g}"], str(sweep_dir / str(num)), None, "now"))
    write_sweep_record(SweepRecord(str(sweep_dir), "local", "now", records))


def ours(sweep_dir: Path) -> dict:
    sweep = load_sweep(sweep_dir)
    return {
        (num, tag): list(zip(s.steps, s.wall_times, s.values))
        for num, tags in sweep.scalars.items()
        for tag, s in tags.items()
    }


def baseline(sweep_dir: Path) -> dict:
    points = {}
    for trial in read_sweep_record(sweep_dir).trials:
        json.loads((Path(trial.trial_dir) / "metrics.json").read_text())
        acc = EventAccumulator(str(Path(trial.trial_dir) / "tb"), size_guidance={SCALARS: 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            points[(trial.num, tag)] = [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)]
    return points


def timed(fn, sweep_dir: Path) -> tuple[float, float, dict]:
    """Wall and CPU seconds of ``fn(sweep_dir)``, and its result."""
    start, cpu_start = time.perf_counter(), time.process_time()
    result = fn(sweep_dir)
    return time.perf_counter() - start, time.process_time() - cpu_start, result


def runs(times: list[float]) -> str:
    return ", ".join(f"{t:.2f}" for t in times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = Path(tmp)
        start = time.perf_counter()
        generate(sweep_dir, args.trials, args.steps)
        print(f"generated {args.trials} trials x {args.steps} steps x {len(TAGS)} scalars "
              f"in {time.perf_counter() - start:.1f} s")
        wall: dict[str, list[float]] = {"report": [], "tensorboard": []}
        cpu: dict[str, list[float]] = {"report": [], "tensorboard": []}
        for _ in range(args.repeats):
            for side, fn in (("report", ours), ("tensorboard", baseline)):
                seconds, cpu_seconds, points = timed(fn, sweep_dir)
                wall[side].append(seconds)
                cpu[side].append(cpu_seconds)
                if side == "report":
                    got = points
            assert got == points, "the report and TensorBoard read different points"
        assert len(got) == args.trials * len(TAGS) and all(len(v) == args.steps for v in got.values())
    ratio = min(wall["tensorboard"]) / min(wall["report"])
    cpu_ratio = min(cpu["tensorboard"]) / min(cpu["report"])
    for side, name in (("report", "report loading"), ("tensorboard", "EventAccumulator")):
        print(f"{name + ':':22s} {min(wall[side]):.2f} s  (runs: {runs(wall[side])}; CPU s: {runs(cpu[side])})")
    print(f"ratio: {ratio:.1f}x wall, {cpu_ratio:.1f}x CPU (target >= {TARGET_RATIO:g}x wall); identical values: yes")
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
