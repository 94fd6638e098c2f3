"""``python -m hpcsweep.status SWEEP_DIR``: where each trial of a sweep is, now.

One line per trial: Slurm state, a progress bar of step/max_steps, the ETA from its throughput,
the latest loss, restarts and nodes; failed trials add why. Each poll makes one ``sacct`` call for
the whole sweep (none for a local sweep). ``--follow`` refreshes until every trial has ended;
``--logs N`` tails trial N's ``train.log`` and submitit ``.err``. Exits 1 when a trial failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hpcsweep.failure import submitit_logs, tail
from hpcsweep.report_data import (
    FINAL_STATUSES,
    TrialRow,
    load_sweep,
    resolve_trial_dir,
    swept_keys,
)
from hpcsweep.sweep_record import missing_sweep_message

BAR_WIDTH = 20
LOG_LINES = 30
CLEAR_SCREEN = "\x1b[H\x1b[2J"


def progress_bar(step: int | None, max_steps: int | None, width: int = BAR_WIDTH) -> str:
    """``[#####...............]`` for step/max_steps; blank bar when unknown."""
    if not step or not max_steps:
        return "[" + "." * width + "]"
    filled = min(width, round(width * step / max_steps))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def tokens_per_step(config: Mapping[str, Any], world_size: int) -> int:
    """Tokens one optimizer step consumes: batch x sequence x accumulation x ranks."""
    data, trainer = config["data"], config["trainer"]
    return int(data["batch_size"]) * int(data["seq_len"]) * int(trainer.get("grad_accum", 1)) * world_size


def eta_seconds(step: int | None, max_steps: int | None, tokens_per_s: float | None, step_tokens: int | None) -> float | None:
    """Seconds left at the current throughput; None when it is not known yet."""
    if step is None or not max_steps or not tokens_per_s or not step_tokens:
        return None
    return (max_steps - step) * step_tokens / tokens_per_s


def format_duration(seconds: float | None) -> str:
    """``3725`` -> ``1h02m``; ``75`` -> ``1m15s``; None -> ``-``."""
    if seconds is None:
        return "-"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def trial_params(row: TrialRow, keys: Sequence[str]) -> str:
    """``model.lr=1e-4 data.batch_size=8``: the trial's values of the swept keys."""
    return " ".join(f"{k}={row.overrides.get(k, '')}" for k in keys)


def status_line(row: TrialRow, params: str, eta: float | None) -> str:
    """One trial's line (plus its error line when it failed); ``params`` comes padded."""
    state = row.slurm_state or row.status
    loss = row.train_loss if row.train_loss is not None else row.val_loss
    steps = f"{row.step if row.step is not None else '-'}/{row.max_steps or '-'}"
    line = (
        f"#{row.num:<3} {params}  {row.status:<13} {state:<11} {progress_bar(row.step, row.max_steps)} "
        f"{steps:>11}  eta {format_duration(eta):>7}  loss {'-' if loss is None else f'{loss:.4f}'}  "
        f"restarts {row.restarts if row.restarts is not None else '-'}  {row.nodes or '-'}"
    )
    return line + (f"\n     error: {row.error or 'no error recorded'}" if row.status == "failed" else "")


def read_step_tokens(trial_dir: Path, world_size: int | None) -> int | None:
    """Tokens per step of a trial from its config.yaml (None before it exists)."""
    try:
        config = yaml.safe_load((trial_dir / "config.yaml").read_text())
    except FileNotFoundError:
        return None
    return tokens_per_step(config, world_size or 1)


def render_status(sweep_dir: Path) -> tuple[str, list[TrialRow]]:
    """The status text of one poll and its rows."""
    sweep = load_sweep(sweep_dir, with_scalars=False)
    keys = swept_keys(sweep.rows)
    params = [trial_params(row, keys) for row in sweep.rows]
    width = max((len(p) for p in params), default=0)
    lines = []
    for row, trial, param_text in zip(sweep.rows, sweep.record.trials, params):
        eta = None
        if row.status == "running":
            step_tokens = read_step_tokens(resolve_trial_dir(sweep_dir, trial), row.world_size)
            eta = eta_seconds(row.step, row.max_steps, row.tokens_per_s, step_tokens)
        lines.append(status_line(row, param_text.ljust(width), eta))
    counts = {s: sum(r.status == s for r in sweep.rows) for s in dict.fromkeys(r.status for r in sweep.rows)}
    summary = f"{sweep_dir}: {len(sweep.rows)} trials, " + ", ".join(f"{n} {s}" for s, n in counts.items())
    if sweep.slurm_error:
        summary += f"\n(no Slurm states: {sweep.slurm_error.splitlines()[0]})"
    return "\n".join([summary, *lines]) + "\n", sweep.rows


def render_logs(sweep_dir: Path, num: int, lines: int = LOG_LINES) -> str:
    """The tails of trial ``num``'s train.log and newest submitit .err."""
    sweep = load_sweep(sweep_dir, query=lambda ids: {}, with_scalars=False)
    trial = next((t for t in sweep.record.trials if t.num == num), None)
    if trial is None:
        return f"no trial #{num} in {sweep_dir}\n"
    trial_dir = resolve_trial_dir(sweep_dir, trial)
    paths = [trial_dir / "train.log", *submitit_logs(sweep_dir, trial.job_id, ".err")[-1:]]
    parts = []
    for path in paths:
        text = tail(path)
        shown = "\n".join(text.splitlines()[-lines:]) if text else "(empty or missing)"
        parts.append(f"==> {path} <==\n{shown}\n")
    return "\n".join(parts)


def all_ended(rows: Sequence[TrialRow]) -> bool:
    """True when no trial can change any more."""
    return all(row.status in FINAL_STATUSES for row in rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hpcsweep.status", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="the sweep's multirun dir (holds sweep.json)")
    parser.add_argument("--follow", action="store_true", help="refresh until every trial has ended")
    parser.add_argument("--interval", type=float, default=10.0, metavar="S", help="seconds between polls (default %(default)s)")
    parser.add_argument("--logs", type=int, metavar="N", help="also tail trial N's train.log and submitit .err")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Show the status (once, or until all trials end); exit 1 when a trial failed."""
    args = parse_args(argv)
    missing = missing_sweep_message(args.sweep_dir)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    while True:
        text, rows = render_status(args.sweep_dir)
        if args.logs is not None:
            text += "\n" + render_logs(args.sweep_dir, args.logs)
        if args.follow and sys.stdout.isatty():
            text = CLEAR_SCREEN + text
        sys.stdout.write(text)
        sys.stdout.flush()
        if not args.follow or all_ended(rows):
            break
        time.sleep(args.interval)
    return 1 if any(row.status == "failed" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
