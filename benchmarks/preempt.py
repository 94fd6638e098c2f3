"""Time from a stop signal to a clean exit, and the steps it loses, over injected preemptions.

    python benchmarks/preempt.py [--stops 5] [--nproc 2] [--steps-between 3]

Runs one trial of the default model and data locally (``python -m hpcsweep hydra.run.dir=...``, no Slurm) through the
real runner: with ``--nproc`` > 1 that is the torchrun path, whose workers learn of the stop only
through the runner's stop file, since the signal goes to the runner's process alone. Each round
starts the trial (resuming the same dir), waits until it has done ``--steps-between`` more steps,
sends SIGTERM or SIGUSR2 (alternating) and times until the process has exited. Printed per stop:
the signal, the step seen just before it, the checkpointed step, the steps lost (steps finished
but not in the checkpoint: 0 means at most the step in flight was lost), the runner's own
signal-to-workers-gone time (``stop_to_exit_s`` in metrics.json) and the wall time from the signal
to the process's exit. The trial then runs to the end and its weights hash is printed.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The default model and data (configs/config.yaml); only the schedule is shortened (to what the
# stops need and 10 steps more) and checkpoints come from the stops alone.
TRIAL = [
    "trainer.ckpt_every=1000", "trainer.eval_every=1000", "trainer.log_every=1",
    "trainer.eval_batches=1", "trainer.warmup_steps=2",
]
SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


def read_metrics(trial_dir: Path) -> dict:
    try:
        return json.loads((trial_dir / "metrics.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def newest_checkpoint_step(trial_dir: Path) -> int:
    steps = [int(re.match(r"step(\d+)", p.name).group(1)) for p in (trial_dir / "checkpoints").glob("step*.pt")]
    return max(steps, default=0)


def last_logged_step(trial_dir: Path) -> int:
    """The highest step any rank logged as finished (rank logs included)."""
    logs = [trial_dir / "train.log", *(trial_dir / "logs").glob("rank*.log")]
    steps = [int(m.group(1)) for path in logs if path.exists() for m in re.finditer(r" step (\d+) loss", path.read_text())]
    return max(steps, default=0)


def start_trial(trial_dir: Path, nproc: int, max_steps: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hpcsweep", f"hydra.run.dir={trial_dir}", f"trainer.nproc_per_node={nproc}",
         f"trainer.max_steps={max_steps}", *TRIAL],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def wait_for_step(trial_dir: Path, proc: subprocess.Popen, step: int, timeout: float = 300) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = read_metrics(trial_dir).get("step", 0)
        if seen >= step:
            return seen
        if proc.poll() is not None:
            raise RuntimeError(f"the trial exited with {proc.returncode} before step {step}")
        time.sleep(0.05)
    raise RuntimeError(f"the trial did not reach step {step} within {timeout:g} s")


def one_stop(trial_dir: Path, nproc: int, sig: signal.Signals, steps_between: int, max_steps: int) -> dict:
    proc = start_trial(trial_dir, nproc, max_steps)
    seen = wait_for_step(trial_dir, proc, read_metrics(trial_dir).get("step", 0) + steps_between)
    sent = time.monotonic()
    proc.send_signal(sig)
    code = proc.wait(timeout=120)
    exit_s = time.monotonic() - sent
    metrics = read_metrics(trial_dir)
    saved = newest_checkpoint_step(trial_dir)
    return {
        "signal": sig.name, "exit_code": code, "step_seen": seen, "saved": saved,
        "lost": last_logged_step(trial_dir) - saved, "reason": metrics.get("last_stop_reason"),
        "stop_to_exit_s": metrics.get("stop_to_exit_s"), "signal_to_exit_s": round(exit_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps-between", type=int, default=3)
    args = parser.parse_args()
    # Each round trains its steps, the one seen at the signal and the one in flight.
    max_steps = args.stops * (args.steps_between + 2) + 10
    with tempfile.TemporaryDirectory(prefix="hpcsweep-preempt-") as tmp:
        trial_dir = Path(tmp) / "trial"
        print(f"{'signal':8} {'code':>4} {'seen':>5} {'saved':>5} {'lost':>4} {'reason':11} "
              f"{'runner s':>8} {'exit s':>7}")
        rows = []
        for i in range(args.stops):
            row = one_stop(trial_dir, args.nproc, SIGNALS[i % len(SIGNALS)], args.steps_between, max_steps)
            rows.append(row)
            print(f"{row['signal']:8} {row['exit_code']:>4} {row['step_seen']:>5} {row['saved']:>5} {row['lost']:>4} "
                  f"{row['reason']!s:11} {row['stop_to_exit_s']!s:>8} {row['signal_to_exit_s']:>7}", flush=True)
        final = start_trial(trial_dir, args.nproc, max_steps)
        final.wait(timeout=600)
        metrics = read_metrics(trial_dir)
        exits = sorted(r["signal_to_exit_s"] for r in rows)
        print(f"signal to exit: median {exits[len(exits) // 2]} s, max {exits[-1]} s; "
              f"steps lost: max {max(r['lost'] for r in rows)}")
        print(f"final: {metrics.get('status')} at step {metrics.get('step')}, restarts {metrics.get('restarts')}, "
              f"weights sha256 {metrics.get('weights_sha256')}")


if __name__ == "__main__":
    main()
