"""Tokens/s of hpcsweep's Trainer with its observability on and off, and against a bare PyTorch loop.

    python benchmarks/trainer_overhead.py [--steps 20] [--repeats 7] [--telemetry-every-s S] [--cpu-time]

Three runs alternate in this one process (observed, unobserved, bare, then unobserved, observed,
bare, ...) so that load from other work on a shared machine hits them alike; the medians are compared. ``observed`` is the
real ``Trainer.fit`` loop with the step-time breakdown on (``trainer.step_timing=true``) and, where
this checkout has it, telemetry sampling every S seconds (``trainer.telemetry_every_s``);
``unobserved`` is the same loop with both off; their ratio is the observability's cost (target: at
most 2 % of tokens/s on CPU). The trainer loop holds on-the-fly batches, the schedule, logging,
metrics.json, TensorBoard and stop checks; the bare loop is forward, loss, backward, clip, step over
pre-built batches, as in nanoGPT. All are timed from the end of step 1 to the end of step N, so the
scheduled final evaluation and checkpoint (which a bare loop lacks) are not counted. Last, the step
timer's own cost per step is timed alone (its marks and a window's accounting, no training), a
figure load hardly blurs.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

from hpcsweep.config import TrainerConfig, trial_config_from_dict  # noqa: E402
from hpcsweep.train import model  # noqa: E402
from hpcsweep.train.observe import step_timer  # noqa: E402
from hpcsweep.train.data import corpora  # noqa: E402
from hpcsweep.train.distributed import WorldInfo  # noqa: E402
from hpcsweep.train.trainer import Trainer  # noqa: E402

CLOCK = time.perf_counter
"""Wall time by default; ``--cpu-time`` switches to this process's CPU time, which load from other
processes on a shared machine disturbs far less. With more than one intra-op thread, CPU time also
counts OpenMP threads spin-waiting between parallel regions, so compare CPU time at
OMP_NUM_THREADS=1."""


def trainer_tokens_per_s(cfg, steps: int) -> float:
    """Steady-state tokens/s of ``Trainer.fit``: steps 2..N, timed from its step hook."""
    stamps: dict[int, float] = {}

    def stamp(trainer: Trainer, step: int) -> None:
        stamps[step] = CLOCK()

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, WorldInfo(0, 0, 1, torch.device("cpu"), None), Path(tmp), hooks=[stamp])
        trainer.fit()
        trainer.close()
    return (steps - 1) * cfg.data.batch_size * cfg.data.seq_len / (stamps[steps] - stamps[1])


def bare_tokens_per_s(cfg, steps: int) -> float:
    """Steady-state tokens/s of a bare loop over the same batches: steps 2..N."""
    net = model.build_model(cfg.model, cfg.trainer.seed)
    corpus = corpora.load_corpus(cfg.data, cfg.model.vocab_size)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.model.lr, betas=tuple(cfg.trainer.betas), foreach=True)
    batches = [
        corpora.get_batch(corpus, cfg.data, split="train", step=s, rank=0, micro_step=0, world_size=1, grad_accum=1)
        for s in range(steps)
    ]
    for step, (inputs, targets) in enumerate(batches):
        if step == 1:
            start = CLOCK()
        loss = F.cross_entropy(net(input_ids=inputs).logits.flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.trainer.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    loss.item()
    return (steps - 1) * cfg.data.batch_size * cfg.data.seq_len / (CLOCK() - start)


TELEMETRY_KEY = "telemetry_every_s"
HAS_TELEMETRY = TELEMETRY_KEY in {field.name for field in dataclasses.fields(TrainerConfig)}
"""Telemetry (``trainer.telemetry_every_s``, 0 disables it) is measured where this checkout has it."""


def trial_config(steps: int, *, observed: bool, telemetry_every_s: float):
    """The benchmark's trial: ``observed`` turns the step-time breakdown and telemetry on, else both off."""
    trainer = {"device": "cpu", "max_steps": steps, "eval_every": steps, "ckpt_every": 0, "step_timing": observed}
    if HAS_TELEMETRY:
        trainer[TELEMETRY_KEY] = telemetry_every_s if observed else 0
    return trial_config_from_dict({"trainer": trainer})


class NoPeak:
    def window_peak(self) -> tuple[int, str]:
        return 0, "rss"


def step_timer_cost_s(steps: int = 20_000, log_every: int = 10) -> float:
    """Seconds the step timer itself adds to one step on the host clock: the marks ``Trainer.train_step``
    and ``fit`` make each step, and every ``log_every`` steps a window's end (its peak memory aside)."""
    timer = step_timer.StepTimer(step_timer.HostClock(), NoPeak())
    timer.start(0)
    start = CLOCK()
    for step in range(1, steps + 1):
        for phase in ("data", "compute", "optimizer", step_timer.OTHER):
            timer.enter(phase)
        with timer.phase("checkpoint"):
            pass
        if step % log_every == 0:
            with timer.phase("logging"):
                timer.end_window(step, tokens_per_s=1.0, mfu=None)
    return (CLOCK() - start) / steps


def pair_ratio(a: list[float], b: list[float]) -> float:
    """The median ratio of runs made back to back under the same load: it resists bursts best."""
    return statistics.median(x / y for x, y in zip(a, b))


def runs_line(name: str, runs: list[float]) -> str:
    return f"{name:<11}{statistics.median(runs):9.0f} tokens/s  (runs: {', '.join(f'{x:.0f}' for x in runs)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--telemetry-every-s", type=float, default=getattr(TrainerConfig(), TELEMETRY_KEY, 10.0),
                        help="trainer.telemetry_every_s of the observed runs (default: the config's default)")
    parser.add_argument("--cpu-time", action="store_true", help="time with process CPU time, not wall time")
    args = parser.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    observed = trial_config(args.steps, observed=True, telemetry_every_s=args.telemetry_every_s)
    unobserved = trial_config(args.steps, observed=False, telemetry_every_s=args.telemetry_every_s)
    trainer_tokens_per_s(observed, args.steps), bare_tokens_per_s(observed, args.steps)  # warm-up
    runs: dict[str, list[float]] = {"observed": [], "unobserved": [], "bare": []}
    for repeat in range(args.repeats):
        # Which trainer run goes first alternates, so a drift in load favours neither.
        for arm in (observed, unobserved) if repeat % 2 == 0 else (unobserved, observed):
            runs["observed" if arm is observed else "unobserved"].append(trainer_tokens_per_s(arm, args.steps))
        runs["bare"].append(bare_tokens_per_s(observed, args.steps))
    medians = {name: statistics.median(values) for name, values in runs.items()}
    cfg = observed
    telemetry = (f"telemetry every {args.telemetry_every_s:g} s" if HAS_TELEMETRY else
                 "no telemetry (trainer.telemetry_every_s is not in this checkout: the step breakdown alone)")
    print(f"deepseek_tiny, batch {cfg.data.batch_size}x{cfg.data.seq_len}, {args.steps} steps, log every "
          f"{cfg.trainer.log_every}, {args.repeats} repeats, {'CPU' if args.cpu_time else 'wall'} time")
    print(f"observed: step breakdown and {telemetry}; unobserved: both off")
    for name in runs:
        print(runs_line(name, runs[name]))
    on_off = pair_ratio(runs["observed"], runs["unobserved"])
    print(f"observed/unobserved {medians['observed'] / medians['unobserved']:.3f} (medians), {on_off:.3f} "
          f"(median of back-to-back pairs): cost {100 * (1 - on_off):.1f}% of tokens/s (target <= 2%)")
    print(f"unobserved/bare     {medians['unobserved'] / medians['bare']:.3f} (medians), "
          f"{pair_ratio(runs['unobserved'], runs['bare']):.3f} (median of back-to-back pairs)")
    step_s = cfg.data.batch_size * cfg.data.seq_len / medians["unobserved"]
    cost_s = step_timer_cost_s(log_every=cfg.trainer.log_every)
    print(f"step timer alone: {cost_s * 1e6:.1f} us a step, {100 * cost_s / step_s:.3f}% of a {step_s * 1e3:.0f} ms step here")


if __name__ == "__main__":
    main()
