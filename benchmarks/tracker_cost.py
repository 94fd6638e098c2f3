"""What MLflow logging costs a trial: tokens/s of the real ``Trainer.fit`` with
``logging.backends=[tensorboard,mlflow]`` against ``[tensorboard]``.

    python benchmarks/tracker_cost.py [--steps 80] [--repeats 5] [--log-every 10]

Both contenders train the same tiny trial, alternating in this one process so that load from other
work hits both alike, on one thread, timed in CPU time of the process (``time.process_time``: the
MLflow client's work, on whatever thread, is counted) from the end of step 1 until the trainer has closed (the final evaluation, save and the
trackers' last flush and end of run included).
MLflow logs to the sweep dir's default SQLite store, made beforehand as the login node makes it. The
median of the back-to-back pairs' ratios is reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a checkout

from hpcsweep.config import trial_config_from_dict, trial_config_to_dict  # noqa: E402
from hpcsweep.sweep.tracker_check import create_default_mlflow_stores  # noqa: E402
from hpcsweep.train.distributed import WorldInfo  # noqa: E402
from hpcsweep.train.trainer import Trainer  # noqa: E402


def tokens_per_cpu_s(cfg, steps: int, sweep_dir: Path, run: int) -> float:
    """Tokens per CPU second of ``Trainer.fit`` over steps 2..N, in a fresh trial dir of ``sweep_dir``."""
    stamps: dict[int, float] = {}

    def stamp(trainer: Trainer, step: int) -> None:
        stamps[step] = time.process_time()

    trial_dir = sweep_dir / str(run)
    trial_dir.mkdir()
    (trial_dir / "config.yaml").write_text(yaml.safe_dump(trial_config_to_dict(cfg)))
    create_default_mlflow_stores([(cfg.logging, trial_dir)])
    trainer = Trainer(cfg, WorldInfo(0, 0, 1, torch.device("cpu"), None), trial_dir, hooks=[stamp])
    trainer.fit()
    trainer.close()  # the trackers' last flush and the run's end are part of what logging costs
    end = time.process_time()
    trackers = trainer.report.get("trackers", {})
    assert all(t["status"] == "ok" for t in trackers.values()), trackers
    return (steps - 1) * cfg.data.batch_size * cfg.data.seq_len / (end - stamps[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--log-every", type=int, default=10, help="trainer.log_every of both contenders")
    args = parser.parse_args()
    torch.set_num_threads(1)

    def config(backends: list[str]):
        return trial_config_from_dict({
            "trainer": {"device": "cpu", "max_steps": args.steps, "eval_every": args.steps, "ckpt_every": 0,
                        "log_every": args.log_every, "telemetry_every_s": 0},
            "logging": {"backends": backends}})

    on, off = config(["tensorboard", "mlflow"]), config(["tensorboard"])
    runs: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = Path(tmp)
        tokens_per_cpu_s(on, args.steps, sweep_dir, 0), tokens_per_cpu_s(off, args.steps, sweep_dir, 1)  # warm-up
        for i in range(args.repeats):
            runs["on"].append(tokens_per_cpu_s(on, args.steps, sweep_dir, 2 + 2 * i))
            runs["off"].append(tokens_per_cpu_s(off, args.steps, sweep_dir, 3 + 2 * i))
    pair_ratio = statistics.median(a / b for a, b in zip(runs["on"], runs["off"]))
    print(f"deepseek_tiny, batch {on.data.batch_size}x{on.data.seq_len}, {args.steps} steps, log every "
          f"{args.log_every}, {args.repeats} repeats, 1 thread, CPU time, step 1 left out, "
          f"the trial's end included")
    print(f"mlflow on   {statistics.median(runs['on']):9.0f} tokens/CPU-s  (runs: {', '.join(f'{x:.0f}' for x in runs['on'])})")
    print(f"mlflow off  {statistics.median(runs['off']):9.0f} tokens/CPU-s  (runs: {', '.join(f'{x:.0f}' for x in runs['off'])})")
    print(f"MLflow on/off tokens/s {pair_ratio:.3f} (median of back-to-back pairs; cost {100 * (1 - pair_ratio):.1f} %)")


if __name__ == "__main__":
    main()
