"""Adaptive search against random search: what pruning saves, and what it costs in the best objective.

Runs the same search on the local launcher (the default model) with two methods, over several
seeds and the same number of trials:

- ``random``: random sampling, no pruning, every trial trained to the end;
- ``tpe+hyperband``: TPE with Hyperband pruning at every evaluation.

For each it prints the seconds spent, three ways:

- ``trainer_s``: the trainer-seconds, judged against the target: the device-seconds hpcsweep's own
  budget (``budget_gpu_hours``) charges each trial, summed (each trial's ``usage.json``: from the
  runner's start to the trial's end, times its GPUs or nodes);
- ``train_s``: summed over trials from each trial's first to last ``train.log`` line (the training
  loop alone);
- ``cpu_s``: the CPU seconds of the whole search: every trial process from its interpreter's start
  (about 6 CPU-s of imports and start-up per trial, which pruning cannot save), the sampler, the
  study. Other load on the machine barely changes it; the two above are wall times, which it does.

Then the steps trained, the trials pruned, the best objective (``best_val_loss``) the study found,
the means, and the ratios against the targets: a best objective within 2% of random's, for at most
50% of its trainer-seconds. The pruner runs with the search's defaults (Hyperband's rungs from
step 1 to ``trainer.max_steps``, reduction factor 3).

    python benchmarks/search.py --n-trials 27 --seeds 0 1 2 --max-steps 300 --eval-every 10 --out /tmp/search-bench
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

METHODS = {
    "random": ["hydra.sweeper.sampler=random", "hydra.sweeper.pruner=none"],
    "tpe+hyperband": ["hydra.sweeper.sampler=tpe", "hydra.sweeper.pruner=hyperband"],
}
SPACE = [
    "model.lr=tag(log, interval(1e-4, 3e-2))",
    "trainer.warmup_steps=choice(0, 5, 20)",
    "trainer.weight_decay=interval(0.0, 0.2)",
]
BEST_WITHIN = 0.02
TRAINER_SECONDS_AT_MOST = 0.5


@dataclass(frozen=True)
class Outcome:
    """One search: its best objective, the trainer-seconds and steps its trials took, and how they ended."""

    method: str
    seed: int
    best: float
    trainer_s: float
    train_s: float
    cpu_s: float
    steps: int
    pruned: int


def log_seconds(train_log: Path) -> float:
    """Seconds between the first and last timestamped line of a trial's ``train.log``."""
    stamps = []
    for line in train_log.read_text().splitlines():
        try:
            stamps.append(dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f"))
        except ValueError:
            continue
    return (stamps[-1] - stamps[0]).total_seconds() if stamps else 0.0


def budget_seconds(usage_json: Path) -> float:
    """The device-seconds the budget charges a trial: each run's span in ``usage.json`` times its units."""
    runs = json.loads(usage_json.read_text())["runs"]
    return sum(run["units"] * max(0.0, run["last_at"] - run["started_at"]) for run in runs)


def run_search(method: str, seed: int, args: argparse.Namespace) -> Outcome:
    """Run one search locally into ``args.out/method-seed`` and measure it."""
    sweep_dir = args.out / f"{method}-{seed}"
    training = [
        f"trainer.max_steps={args.max_steps}", f"trainer.eval_every={args.eval_every}",
        f"trainer.ckpt_every={args.max_steps}", f"trainer.log_every={args.eval_every}", "trainer.eval_batches=2",
    ]
    command = [
        sys.executable, "-m", "hpcsweep", "-m", "hydra/sweeper=search", "hydra/launcher=local",
        f"hydra.sweep.dir={sweep_dir}", f"hydra.sweeper.n_trials={args.n_trials}", f"hydra.sweeper.seed={seed}",
        *METHODS[method], *SPACE, *training,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if result.returncode != 0:
        raise SystemExit(f"{method} seed {seed} failed:\n{(result.stdout + result.stderr)[-3000:]}")
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(sweep_dir / "search" / "study.journal")))
    study = optuna.load_study(study_name="search", storage=storage)
    trainer_s, train_s, steps = 0.0, 0.0, 0
    for num in range(args.n_trials):
        trainer_s += budget_seconds(sweep_dir / str(num) / "usage.json")
        train_s += log_seconds(sweep_dir / str(num) / "train.log")
        steps += json.loads((sweep_dir / str(num) / "metrics.json").read_text())["step"]
    pruned = sum(t.state.name == "PRUNED" for t in study.trials)
    return Outcome(method, seed, study.best_value, trainer_s, train_s, cpu_s, steps, pruned)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-trials", type=int, default=27)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--out", type=Path, default=Path("search-bench"))
    args = parser.parse_args(argv)
    if len(args.seeds) < 3:
        parser.error("--seeds: at least 3, so that one lucky draw does not decide")

    outcomes = []
    print(f"{'method':<14} {'seed':>4} {'best':>8} {'trainer_s':>9} {'train_s':>8} {'cpu_s':>8} {'steps':>6} {'pruned':>6}")
    for seed in args.seeds:
        for method in METHODS:
            o = run_search(method, seed, args)
            outcomes.append(o)
            print(f"{o.method:<14} {o.seed:>4} {o.best:>8.4f} {o.trainer_s:>9.1f} {o.train_s:>8.1f} {o.cpu_s:>8.1f} "
                  f"{o.steps:>6} {o.pruned:>6}",
                  flush=True)
    fields = ("best", "trainer_s", "train_s", "cpu_s", "steps")
    means = {m: {f: statistics.mean(getattr(o, f) for o in outcomes if o.method == m) for f in fields} for m in METHODS}
    print()
    for method, mean in means.items():
        print(f"mean {method:<14} " + "  ".join(f"{f} {mean[f]:.4f}" if f == "best" else f"{f} {mean[f]:.1f}" for f in fields))
    ratio = {f: means["tpe+hyperband"][f] / means["random"][f] for f in fields}
    print(f"tpe+hyperband / random: best {ratio['best']:.4f} (target <= {1 + BEST_WITHIN:.2f}), "
          f"trainer_s {ratio['trainer_s']:.3f} (target <= {TRAINER_SECONDS_AT_MOST:.2f}), "
          f"train_s {ratio['train_s']:.3f}, cpu_s {ratio['cpu_s']:.3f}, steps {ratio['steps']:.3f}")
    met = ratio["best"] <= 1 + BEST_WITHIN and ratio["trainer_s"] <= TRAINER_SECONDS_AT_MOST
    print("target met" if met else "target NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
