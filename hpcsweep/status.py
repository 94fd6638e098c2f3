"""``python -m hpcsweep.status SWEEP_DIR``: where each trial of a sweep is, now.

One line per trial, labelled by the values it trained with (``hpcsweep.results.overrides``): its
status (and ``slurm STATE`` where the job's Slurm state says more), a progress bar of step/max_steps, the ETA from its throughput, the latest loss, restarts
and nodes, or for a pending trial Slurm's reason it waits; failed trials add why, and a reason
that never clears (``PartitionConfig`` ...) is flagged in red with what it means. A retried trial
shows its attempt, and one with profiler traces where they are. Above the trials: the GPU-hours every run of the sweep has spent (allocated
GPU-hours, ``hpcsweep.results.gpu_hours``; CPU-hours for a local sweep on CPUs, as the report says), against ``hydra.launcher.budget_gpu_hours``, flagged
from 80 % of it on. Each poll makes one ``sacct`` call for the whole sweep (none for a local
sweep), plus one ``squeue`` while a trial is queued, and for a ``data=text`` sweep one for its token
preparation job, whose line says why the trials were cancelled when it failed. SWEEP_DIR may also be one trial dir (``sbatch
slurm/train.sbatch`` writes one). ``--follow`` refreshes until every trial has ended, or stops
when a trial can never start; ``--logs N`` tails trial N's ``train.log`` and submitit ``.err``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcsweep.files.metrics_file import NOT_STARTED
from hpcsweep.files.sweep_record import SWEEP_FILE, missing_sweep_message
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.results.budget import BudgetView
from hpcsweep.results.efficiency_table import hours_word
from hpcsweep.results.failure import submitit_logs, tail, unexplained_failure
from hpcsweep.results.slurm_config import this_shells_hint
from hpcsweep.results.table import (
    FINAL_STATUSES,
    TrialRow,
    load_sweep,
    memory_text,
    resolve_trial_dir,
    swept_keys,
)
from hpcsweep.results.token_preparation import preparation_status
from hpcsweep.results.wandb_sync import sync_line
from hpcsweep.sweep.earlier_sweep import UNFINISHED
from hpcsweep.sweep.resume_hint import RUN_DIR_KEY, SWEEP_DIR_KEY

BAR_WIDTH = 20
LOG_LINES = 30
CLEAR_SCREEN = "\x1b[H\x1b[2J"
RED, RESET = "\x1b[31m", "\x1b[0m"
EXIT_FAILED = 1
"""Exit status when a trial failed (and none is stuck)."""
EXIT_NEVER_STARTS = 3
"""Exit status when a pending trial can never start: its Slurm reason never clears."""
EXIT_CANCELLED = 4
"""Exit status when a trial was cancelled or never started (and none failed or is stuck)."""
EXIT_STOPPED = 5
"""Exit status when a trial stopped with a checkpoint and nothing runs it again (and none ended worse);
a ``resume:`` line after the trials says how to resume it (``resume_advice``)."""
EXIT_INTERRUPTED = 130
"""Exit status of a Ctrl-C (the shell's 128 + SIGINT); ``--follow`` then ends without a traceback."""
NOT_ENDED_WELL = {"cancelled": EXIT_CANCELLED, NOT_STARTED: EXIT_CANCELLED, "stopped": EXIT_STOPPED,
                  "skipped_budget": EXIT_STOPPED}
"""Final statuses other than a finished trial's, and the exit status each gives."""
EPILOG = f"""\
exit status (the first that applies):
  {EXIT_NEVER_STARTS}  a pending trial can never start: Slurm's reason for it never clears
     (PartitionConfig, PartitionTimeLimit, QOSMaxWallDurationPerJobLimit, InvalidAccount,
     ReqNodeNotAvail on DOWN or DRAINED nodes, ...); --follow then stops instead of waiting for ever
  {EXIT_FAILED}  a trial failed
  {EXIT_CANCELLED}  a trial was cancelled, or never started (its token preparation failed ...)
  {EXIT_STOPPED}  a trial stopped with a checkpoint (or the budget skipped it) and nothing runs it again;
     a "resume:" line after the trials says how: the local sweep's command again with
     hydra.sweep.dir=SWEEP_DIR (the same command without it starts a new sweep from step 0);
     python -m hpcsweep.retry SWEEP_DIR --status stopped,skipped_budget for a Slurm sweep
  0  every trial completed (or stopped early, or was pruned); without --follow: nothing above, so far
  2  SWEEP_DIR is neither a sweep nor a trial dir
  {EXIT_INTERRUPTED}  interrupted by Ctrl-C"""


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


NOT_CHOSEN = "not chosen yet"
"""What a search trial shows before the search has chosen its values."""


def trial_params(row: TrialRow, keys: Sequence[str]) -> str:
    """``model.lr=1e-4 data.batch_size=8``: the trial's values of the swept keys.

    A trial that has none of them yet (a search trial the search has not chosen values for) shows
    ``not chosen yet``; one missing only some shows ``-`` for those.
    """
    if keys and not any(k in row.overrides for k in keys):
        return NOT_CHOSEN
    return " ".join(f"{k}={row.overrides.get(k, '-')}" for k in keys)


def paint(text: str, color: bool) -> str:
    """``text`` in red for a terminal (``color``), else as it is."""
    return f"{RED}{text}{RESET}" if color else text


def where_column(row: TrialRow, color: bool) -> str:
    """The nodes of a placed trial, or squeue-style ``(Reason)`` of a pending one (red if it never clears)."""
    if row.status == "pending" and row.reason:
        return paint(f"({row.reason})", color and bool(row.never_starts))
    return row.nodes or "-"


STATUS_WIDTH = max(len(status) for status in (*FINAL_STATUSES, "running", "pending"))
"""The status column fits the longest status, so the columns after it line up on every line."""


SLURM_STATES_OF = {"running": "RUNNING", "pending": "PENDING", "failed": "FAILED", "cancelled": "CANCELLED",
                   **{status: "COMPLETED" for status in ("completed", "stopped_early", "pruned", "stopped", "skipped_budget")}}
"""The Slurm state a trial of each status runs or ends with: a line shows Slurm's state only where it says more."""


def slurm_state_text(row: TrialRow) -> str:
    """``slurm RUNNING`` where the job's Slurm state says more than the trial's status (a completed trial
    whose job is still ending, a failed one that ran OUT_OF_MEMORY, a stopped one REQUEUED), else ``""``."""
    if not row.slurm_state:
        return ""
    state = row.slurm_state.split()[0]
    return "" if SLURM_STATES_OF.get(row.status) == state else f"slurm {state}"


def status_line(row: TrialRow, params: str, eta: float | None, color: bool = False, slurm_width: int = 0) -> str:
    """One trial's line, plus why when it failed or can never start; ``params`` comes padded, and the
    Slurm state (``slurm_state_text``) to ``slurm_width`` (0: no such column)."""
    states = f"{row.status:<{STATUS_WIDTH}}" + (f" {slurm_state_text(row):<{slurm_width}}" if slurm_width else "")
    loss = row.train_loss if row.train_loss is not None else row.val_loss
    steps = f"{row.step if row.step is not None else '-'}/{row.max_steps or '-'}"
    line = (
        f"#{row.num:<3} {params}  {states} {progress_bar(row.step, row.max_steps)} "
        f"{steps:>11}  eta {format_duration(eta):>7}  loss {'-' if loss is None else f'{loss:.4f}'}  "
        f"restarts {row.restarts if row.restarts is not None else '-'}  {where_column(row, color)}"
    )
    if row.attempt > 1:
        line += f"  attempt {row.attempt}"
    if row.memory_plan_bytes is not None or row.memory_peak_bytes is not None:
        line += f"  GB(plan/peak) {memory_text(row)}"
    if row.last_stop_reason == "budget" and row.status == "stopped":
        line += "  (stopped by the budget)"
    if row.status == "failed":
        line += f"\n     error: {row.error or unexplained_failure(row.slurm_state)}"
    elif row.error:
        line += f"\n     why: {row.error}"
    if row.profile_dir:
        line += f"\n     profile: {Path(row.trial_dir) / row.profile_dir}/ (Perfetto traces, one per rank)"
    if row.status == "pending" and row.never_starts:
        line += "\n     " + paint(f"never starts: {row.reason.split(',')[0]}: {row.never_starts}", color)
    return line


def stuck_message(rows: Sequence[TrialRow]) -> str:
    """The line ``--follow`` ends with when some pending trials can never start."""
    stuck = [row for row in rows if row.status == "pending" and row.never_starts]
    jobs = " ".join(row.job_id or f"#{row.num}" for row in stuck)
    return (
        f"not following: {len(stuck)} pending trial(s) can never start as submitted; "
        f"cancel them (scancel {jobs}) and resubmit with a request the cluster can hold\n"
    )


def read_step_tokens(
    trial_dir: Path, world_size: int | None, parsed: dict[str, Mapping[str, Any]] | None = None
) -> int | None:
    """Tokens per step of a trial from its config.yaml (None before it exists).

    ``parsed`` keeps the configs parsed so far by their text: ``--follow`` reads each file again at
    every poll, but parses it again only when it changed.
    """
    try:
        text = TrialFiles(trial_dir).config.read_text()
    except FileNotFoundError:
        return None
    parsed = {} if parsed is None else parsed
    if text not in parsed:
        import yaml  # here: only running trials need it

        # libyaml's loader where PyYAML has it: the pure-Python one takes 5 ms a config, 5 s for 1,000.
        parsed[text] = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return tokens_per_step(parsed[text], world_size or 1)


RESUMABLE = {"local": (*UNFINISHED, "skipped_budget"), "slurm": ("stopped", "skipped_budget")}
"""By launcher, the statuses of trials that the ``resume_advice`` line picks up again: a local sweep's
dir, run again, resumes its stopped trials and starts those a stop kept from starting (``UNFINISHED``);
``hpcsweep.retry --status stopped,skipped_budget`` takes the stopped ones and those the budget skipped."""


def resume_advice(rows: Sequence[TrialRow], launcher: str, sweep_dir: Path, single_trial: bool = False,
                  hours: str = "GPU") -> str | None:
    """The line that says how to resume the trials of ``rows`` that stopped and that nothing runs again,
    once every trial has ended; None when there is none (or some trial still runs).

    Hydra gives the same command typed again a new dir, whose trials start from step 0: a local sweep
    resumes only with its dir pinned (the ``resume with:`` line its command printed on stopping), one
    trial dir with ``hydra.run.dir``. sweep.json does not keep the command, so the line names the key
    to add, not the whole command; the dir is absolute, as ``status`` may run from another folder than
    the sweep was started from. A Slurm sweep's trials go back into their trial dirs with ``hpcsweep.retry``.
    """
    launcher = "slurm" if launcher == "slurm" else "local"
    if not all_ended(rows) or not any(row.status in RESUMABLE[launcher] for row in rows):
        return None
    where = str(sweep_dir.resolve())
    if single_trial:
        line = f"resume: run its command again with {RUN_DIR_KEY}={where}"
        if launcher == "slurm":
            line += f" (sbatch: HPCSWEEP_TRIAL_DIR={shlex.quote(where)} sbatch slurm/train.sbatch with its overrides)"
    elif launcher == "local":
        line = (f"resume: run the sweep's command again with {SWEEP_DIR_KEY}={where} (the 'resume with:' line it "
                "printed when it stopped); the same command without it starts a new sweep from step 0")
    else:
        line = f"resume: python -m hpcsweep.retry {shlex.quote(where)} --status stopped,skipped_budget"
    if stopped_by_budget(rows):
        line += f"; raise hydra.launcher.budget_gpu_hours above the {hours}-hours spent, or the budget stops it again"
    return line


def render_status(
    sweep_dir: Path, color: bool = False, parsed_configs: dict[str, Mapping[str, Any]] | None = None
) -> tuple[str, list[TrialRow]]:
    """The status text of one poll and its rows (``parsed_configs``: see :func:`read_step_tokens`)."""
    sweep = load_sweep(sweep_dir, with_scalars=False)
    keys = swept_keys(sweep.rows)
    params = [trial_params(row, keys) for row in sweep.rows]
    width = max((len(p) for p in params), default=0)
    slurm_width = max((len(slurm_state_text(row)) for row in sweep.rows), default=0)
    lines = []
    for row, trial, param_text in zip(sweep.rows, sweep.record.trials, params):
        eta = None
        if row.status == "running":
            step_tokens = read_step_tokens(resolve_trial_dir(sweep_dir, trial), row.world_size, parsed_configs)
            eta = eta_seconds(row.step, row.max_steps, row.tokens_per_s, step_tokens)
        lines.append(status_line(row, param_text.ljust(width), eta, color, slurm_width))
    counts = {s: sum(r.status == s for r in sweep.rows) for s in dict.fromkeys(r.status for r in sweep.rows)}
    trials = "1 trial" if len(sweep.rows) == 1 else f"{len(sweep.rows)} trials"
    summary = f"{sweep_dir}: {trials}, " + ", ".join(f"{n} {s}" for s, n in counts.items())
    if sweep.slurm_error:
        summary += f"\n(no Slurm states: {sweep.slurm_error.splitlines()[0]})"
        hint = this_shells_hint()
        summary += f"\n{hint}" if hint else ""
    if sweep.record.token_preparation is not None:
        summary += "\n" + preparation_status(sweep.record.token_preparation)
    hours = hours_word(sweep.rows, local=sweep.record.launcher != "slurm")
    summary += "\n" + budget_text(sweep.usage.spent_hours if sweep.usage else None, sweep.record.budget_gpu_hours,
                                  color, stopped_by_budget(sweep.rows), hours)
    advice = resume_advice(sweep.rows, sweep.record.launcher, sweep_dir, not (sweep_dir / SWEEP_FILE).exists(),
                           hours)
    if advice:
        lines.append(advice)
    return "\n".join([summary, *lines]) + "\n", sweep.rows


def stopped_by_budget(rows: Sequence[TrialRow]) -> bool:
    """Whether the budget has stopped or skipped some trial that has not run again since."""
    return any(r.status == "skipped_budget" or (r.status == "stopped" and r.last_stop_reason == "budget") for r in rows)


def budget_text(spent_hours: float | None, budget_hours: float | None, color: bool, stopped: bool = False,
                hours: str = "GPU") -> str:
    """The budget line: spent / budget, its share, and a red flag from 80 % on (spending unknown: says so).

    ``stopped``: the budget has stopped the sweep (``stopped_by_budget``), which flags it as spent;
    ``hours``: ``CPU`` for a local sweep on CPUs (``hours_word``).
    """
    if spent_hours is None:
        return "budget: spending unknown (accounting did not answer)" + (
            "" if budget_hours is None else f", budget {budget_hours:.3f} {hours}-hours")
    view = BudgetView(spent_hours, budget_hours, stopped, hours)
    return paint(view.line(), color) if view.flag else view.line()


def render_logs(sweep_dir: Path, num: int, lines: int = LOG_LINES) -> str:
    """The tails of trial ``num``'s train.log and newest submitit .err."""
    sweep = load_sweep(sweep_dir, query=lambda ids: {}, with_scalars=False)
    trial = next((t for t in sweep.record.trials if t.num == num), None)
    if trial is None:
        return f"no trial #{num} in {sweep_dir}\n"
    trial_dir = resolve_trial_dir(sweep_dir, trial)
    paths = [TrialFiles(trial_dir).train_log, *submitit_logs(sweep_dir, trial.job_id, ".err")[-1:]]
    parts = []
    for path in paths:
        text = tail(path)
        shown = "\n".join(text.splitlines()[-lines:]) if text else "(empty or missing)"
        parts.append(f"==> {path} <==\n{shown}\n")
    return "\n".join(parts)


def all_ended(rows: Sequence[TrialRow]) -> bool:
    """True when no trial can change any more."""
    return all(row.status in FINAL_STATUSES for row in rows)


def never_starting(rows: Sequence[TrialRow]) -> bool:
    """True when some pending trial waits for a reason that never clears."""
    return any(row.status == "pending" and row.never_starts for row in rows)


def exit_status(rows: Sequence[TrialRow]) -> int:
    """``EXIT_NEVER_STARTS`` when a trial is stuck, else ``EXIT_FAILED`` when one failed, else
    ``EXIT_CANCELLED`` when one was cancelled or never started, else ``EXIT_STOPPED`` when one stopped
    and nothing runs it again, else 0.

    Stuck comes first: it says "not everything has ended" to a script that ran ``--follow``.
    """
    if never_starting(rows):
        return EXIT_NEVER_STARTS
    if any(row.status == "failed" for row in rows):
        return EXIT_FAILED
    return min((NOT_ENDED_WELL[row.status] for row in rows if row.status in NOT_ENDED_WELL), default=0)


def use_color(choice: str, isatty: bool) -> bool:
    """``--color``: ``always``, ``never``, or ``auto`` (only when stdout is a terminal)."""
    return choice == "always" or (choice == "auto" and isatty)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcsweep.status",
        description=__doc__.splitlines()[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "sweep_dir", type=Path, help="the sweep's multirun dir (holds sweep.json), or one trial dir (sbatch route)"
    )
    parser.add_argument(
        "--follow", action="store_true",
        help=f"refresh until every trial has ended; stop with exit {EXIT_NEVER_STARTS} if a trial can never start",
    )
    parser.add_argument("--interval", type=float, default=10.0, metavar="S", help="seconds between polls (default %(default)s)")
    parser.add_argument("--logs", type=int, metavar="N", help="also tail trial N's train.log and submitit .err")
    parser.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto",
        help="flag reasons that never clear in red: auto (default) only when stdout is a terminal",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Show the status (once, or until all trials end or one can never start); see ``exit_status``."""
    args = parse_args(argv)
    missing = missing_sweep_message(args.sweep_dir)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    try:
        return show(args)
    except KeyboardInterrupt:
        # Ctrl-C is how a user leaves --follow: a quiet end, not a traceback.
        sys.stdout.write("\n")
        return EXIT_INTERRUPTED


def show(args: argparse.Namespace) -> int:
    """Print the status once, or (``--follow``) until every trial has ended or one can never start."""
    color = use_color(args.color, sys.stdout.isatty())
    parsed_configs: dict[str, Mapping[str, Any]] = {}
    while True:
        text, rows = render_status(args.sweep_dir, color, parsed_configs)
        if args.logs is not None:
            text += "\n" + render_logs(args.sweep_dir, args.logs)
        if args.follow and sys.stdout.isatty():
            text = CLEAR_SCREEN + text
        if args.follow and never_starting(rows):
            text += stuck_message(rows)
        sys.stdout.write(text)
        sys.stdout.flush()
        if not args.follow or all_ended(rows) or never_starting(rows):
            break
        time.sleep(args.interval)
    sync = sync_line(args.sweep_dir)
    if sync:
        print(sync)
    return exit_status(rows)


if __name__ == "__main__":
    from hpcsweep.results.closed_pipe import exit_code

    sys.exit(exit_code(main))
