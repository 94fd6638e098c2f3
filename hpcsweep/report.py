"""``python -m hpcsweep.report SWEEP_DIR``: one table of a sweep's trials, best first.

Rows are sorted by ``--metric`` (default: a search's objective, best first, else ``best_val_loss``, ascending),
or best first by ``--sort KEY``,
which also takes ``val_accuracy``, ``objective=dpo``'s ``val_reward_accuracy`` and ``val_reward_margin``, and task scores ``tasks.NAME.METRIC`` (largest first, as for
accuracies; ``--ascending`` turns it); failed trials come last, each with the line that says why.
``val_acc`` and one column per task score show what each trial measured last. ``mean tok/s`` is the throughput over the whole run, every
attempt of a resumed trial included, from the trial's TensorBoard events. ``GB(plan/peak)`` is the
memory plan's tensors per GPU against the peak rank 0 measured (``docs/user/memory-plan.md``). ``GPU-h`` is the
GPU-hours the trial's allocations held and ``own GPU-h`` its own compute share; the line under the
table gives the sweep's total, the figure ``status`` and the budget count (``hpcsweep.results.gpu_hours``). ``--csv``,
``--markdown`` and ``--plot`` give the same data as a file, a Markdown table, and a PNG of the sort
key against each swept parameter (every trial, pruned ones marked) plus its curves for the best trials; ``--plot
FILE.png`` also writes ``FILE-heatmap.png``, utilisation by trial over time. ``--efficiency`` shows
instead how each trial used its hardware and which trials are the outliers
(``hpcsweep.results.efficiency``); ``--markdown`` ends with that as a section. Works on
a sweep that is still running. A search sweep (``hydra/sweeper=search``) adds its best trial, the
command that reruns it as one trial, and (``--plot``) the optimisation history. Last comes the
command that exports the best trial (the search's, else the table's first) in Hugging Face format,
once it has a checkpoint (``python -m hpcsweep.export``).
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from hpcsweep.files.sweep_record import missing_sweep_message
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.results.budget import hours_text
from hpcsweep.results.efficiency_table import efficiency_cells, hours_word, sweep_outliers
from hpcsweep.results.failure import unexplained_failure
from hpcsweep.results.search_report import SearchSummary, best_trial_text, load_search_summary, plot_history
from hpcsweep.results.slurm_config import this_shells_hint
from hpcsweep.results.table import METRICS, TrialRow, higher_is_better, load_sweep, memory_text, sort_keys, sort_rows, swept_keys
from hpcsweep.results.wandb_sync import sync_line
from hpcsweep.slurm.usage import Usage

CSV_FIELDS = (
    "num", "status", "slurm_state", "job_id", "step", "max_steps", "train_loss", "val_loss", "best_val_loss",
    "val_accuracy", "mean_tokens_per_s", "tokens_per_s", "restarts", "gpu_hours", "own_gpu_hours", "world_size", "nodes", "error",
    "trial_dir",
    "attempt", "last_stop_reason", "memory_plan_bytes", "memory_peak_bytes", "val_reward_accuracy", "val_reward_margin",
)


def _number(value: float | None, digits: int) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _steps(row: TrialRow) -> str:
    if row.step is None:
        return "-"
    return f"{row.step}/{row.max_steps}" if row.max_steps else str(row.step)


def _memory(row: TrialRow) -> str:
    """``18.5/16.2``: the memory plan's GB per GPU against the measured peak's."""
    return memory_text(row)


def task_columns(rows: Sequence[TrialRow]) -> list[str]:
    """The ``tasks.NAME.METRIC`` keys any row has, sorted: one column each."""
    return sorted({key for row in rows for key in row.task_scores})


def table_cells(
    rows: Sequence[TrialRow], keys: Sequence[str], hours: str = "GPU"
) -> tuple[list[str], list[list[str]]]:
    """The header and the cells of the report table (numbers already formatted); ``hours``: ``GPU`` or
    ``CPU``, what the hours columns count (``hpcsweep.results.efficiency_table.hours_word``)."""
    tasks = task_columns(rows)
    measured = ["val_acc"] if any(row.val_accuracy is not None for row in rows) else []
    header = ["#", *keys, "status", "steps", "train_loss", "val_loss", "best_val_loss", *measured, *tasks, "mean tok/s",
              "restarts", f"{hours}-h", f"own {hours}-h", "attempt", "GB(plan/peak)"]
    cells = [
        [
            str(row.num),
            *(row.overrides.get(k, "") for k in keys),
            row.status,
            _steps(row),
            _number(row.train_loss, 4),
            _number(row.val_loss, 4),
            _number(row.best_val_loss, 4),
            *([_number(row.val_accuracy, 4)] if measured else []),
            *(_number(row.task_scores.get(key), 4) for key in tasks),
            _number(row.mean_tokens_per_s, 0),
            _number(row.restarts, 0),
            _number(row.gpu_hours, 3),
            _number(row.own_gpu_hours, 3),
            str(row.attempt),
            _memory(row),
        ]
        for row in rows
    ]
    return header, cells


def failure_lines(rows: Sequence[TrialRow]) -> list[str]:
    """``#3 failed: ValueError: ...`` for each failed trial, and ``#4 cancelled: never started: ...`` for each
    cancelled one whose reason is known."""
    return [
        f"#{row.num} {row.status}: {row.error or unexplained_failure(row.slurm_state)}"
        for row in rows if row.status == "failed" or (row.status != "completed" and row.error)
    ]


def total_line(usage: Usage | None, rows: Sequence[TrialRow], hours: str = "GPU") -> str:
    """``GPU-hours: 0.318 allocated in all (every run of every task); the trials' own share 0.0123``
    (``CPU-hours`` for a local sweep on CPUs)."""
    own = [row.own_gpu_hours for row in rows if row.own_gpu_hours is not None]
    own_text = f"; the trials' own share {hours_text(sum(own))}" if own else ""
    if usage is None:
        return f"{hours}-hours: allocated unknown (accounting did not answer){own_text}"
    return f"{hours}-hours: {hours_text(usage.spent_hours)} allocated in all (every run of every task){own_text}"


def _aligned(header: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *cells]]


def render_text(rows: Sequence[TrialRow], keys: Sequence[str], total: str | None = None, hours: str = "GPU") -> str:
    """The table as aligned plain text, the ``total`` line, then one line per failure."""
    lines = _aligned(*table_cells(rows, keys, hours))
    return "\n".join([*lines, *([total] if total else []), *failure_lines(rows)]) + "\n"


def render_efficiency_text(
    rows: Sequence[TrialRow], total: str | None = None, keys: Sequence[str] = (), hours: str = "GPU"
) -> str:
    """``--efficiency``: the efficiency table (with the swept ``keys``) as aligned text, the ``total`` line,
    then the outlier lines."""
    lines = _aligned(*efficiency_cells(rows, keys, hours))
    return "\n".join([*lines, *([total] if total else []), *sweep_outliers(rows).lines()]) + "\n"


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _markdown_table(header: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(_markdown_cell(h) for h in header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(_markdown_cell(c) for c in line) + " |" for line in cells),
    ]


def render_markdown(
    rows: Sequence[TrialRow], keys: Sequence[str], total: str | None = None, hours: str = "GPU"
) -> str:
    """The table as GitHub Markdown, the ``total`` line, then one list item per failure."""
    lines = _markdown_table(*table_cells(rows, keys, hours))
    failures = [f"- {_markdown_cell(line)}" for line in failure_lines(rows)]
    totals = ["", _markdown_cell(total)] if total else []
    return "\n".join([*lines, *totals, *([""] + failures if failures else [])]) + "\n"


def render_efficiency_markdown(rows: Sequence[TrialRow], keys: Sequence[str] = (), hours: str = "GPU") -> str:
    """``--markdown``'s efficiency section: a heading, the efficiency table, one list item per outlier line."""
    outliers = [f"- {_markdown_cell(line)}" for line in sweep_outliers(rows).lines()]
    table = _markdown_table(*efficiency_cells(rows, keys, hours))
    return "\n".join(["## Efficiency", "", *table, "", *outliers]) + "\n"


def render_csv(rows: Sequence[TrialRow], keys: Sequence[str]) -> str:
    """One CSV row per trial: every override key, then every field (numbers unrounded)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    tasks = task_columns(rows)
    writer.writerow([*keys, *CSV_FIELDS, *tasks])
    for row in rows:
        values = ["" if getattr(row, name) is None else getattr(row, name) for name in CSV_FIELDS]
        writer.writerow([*(row.overrides.get(k, "") for k in keys), *values, *(row.task_scores.get(k, "") for k in tasks)])
    return out.getvalue()


EXPORT_COMMAND = "python -m hpcsweep.export"


def export_line(sweep_dir: Path, rows: Sequence[TrialRow], num: int | None = None) -> str | None:
    """``export it: python -m hpcsweep.export SWEEP_DIR --trial N --out SWEEP_DIR/export-N`` for trial
    ``num`` (None: the first row of the table), or None while that trial has no checkpoint."""
    chosen = [row for row in rows if row.num == num] if num is not None else list(rows[:1])
    if not chosen or not chosen[0].trial_dir:
        return None
    checkpoints = TrialFiles(Path(sweep_dir) / chosen[0].trial_dir).checkpoints
    if not checkpoints.is_dir() or not any(checkpoints.glob("step*.pt")):
        return None
    row = chosen[0]
    command = [*EXPORT_COMMAND.split(), str(sweep_dir), "--trial", str(row.num), "--out", f"{sweep_dir}/export-{row.num}"]
    return f"export trial #{row.num} in Hugging Face format: {shlex.join(command)}"


def sort_order(args: argparse.Namespace, search: SearchSummary | None, keys: Sequence[str]) -> tuple[str, bool]:
    """The key the table is sorted by and ``--plot`` draws, and whether largest first: ``--sort`` (best
    first), else ``--metric``, else a search's objective in its direction (where the rows hold it), else
    ``best_val_loss``."""
    if args.sort is not None:
        return args.sort, args.descending or (higher_is_better(args.sort) and not args.ascending)
    if args.metric is None and search is not None and search.objective in keys:
        return search.objective, search.direction == "maximize"
    return args.metric or "best_val_loss", args.descending


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hpcsweep.report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="the sweep's multirun dir (holds sweep.json)")
    parser.add_argument("--metric", choices=METRICS,
                        help="sort key (default: a search's objective, else best_val_loss)")
    parser.add_argument("--sort", metavar="KEY",
                        help="best first by KEY: a --metric, val_accuracy, val_reward_accuracy, val_reward_margin (objective=dpo), "
                             "or a task score tasks.NAME.METRIC "
                             "(accuracies and task scores largest first)")
    parser.add_argument("--descending", action="store_true", help="largest first (e.g. for mean_tokens_per_s)")
    parser.add_argument("--ascending", action="store_true", help="with --sort: smallest first")
    parser.add_argument("--csv", type=Path, metavar="FILE", help="also write the table as CSV")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table instead of text")
    parser.add_argument("--efficiency", action="store_true",
                        help="show how each trial used its hardware, and the outliers, instead of the results table")
    parser.add_argument("--plot", type=Path, metavar="FILE.png",
                        help="also plot the sort key (--sort, --metric or a search's objective) per parameter, "
                             "and its curves")
    parser.add_argument("--top", type=int, default=5, help="validation-loss curves of this many best trials")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top={args.top} is not allowed: at least 1 curve")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report; exit 0 (a report of failed trials is still a report)."""
    args = parse_args(argv)
    missing = missing_sweep_message(args.sweep_dir)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    sweep = load_sweep(args.sweep_dir)
    if sweep.slurm_error:
        print(f"no Slurm states (from metrics.json only): {sweep.slurm_error.splitlines()[0]}", file=sys.stderr)
        hint = this_shells_hint()
        if hint:
            print(hint, file=sys.stderr)
    if args.sort is not None and args.sort not in sort_keys(sweep.rows):
        print(f"--sort {args.sort} is not allowed: one of {', '.join(sort_keys(sweep.rows))}", file=sys.stderr)
        return 2
    search = load_search_summary(args.sweep_dir)
    metric, descending = sort_order(args, search, sort_keys(sweep.rows))
    rows = sort_rows(sweep.rows, metric, descending)
    keys = swept_keys(rows)
    hours = hours_word(rows, local=sweep.record.launcher != "slurm")
    total = total_line(sweep.usage, rows, hours)
    # Files first: a reader that stops early (| head) leaves them written.
    if args.csv:
        every_key = list(dict.fromkeys(k for row in rows for k in row.overrides))
        args.csv.write_text(render_csv(rows, every_key))
    if args.plot:
        from hpcsweep.results.plot import plot_sweep  # matplotlib is slow to import

        history = [functools.partial(plot_history, summary=search)] if search is not None else []
        plot_sweep(rows, sweep.scalars, keys, metric, args.top, args.plot, history)
        from hpcsweep.results.heatmap import heatmap_path, plot_heatmap

        heatmap = heatmap_path(args.plot)
        if plot_heatmap(sweep.scalars, heatmap):
            print(f"utilisation heat map: {heatmap}", file=sys.stderr)
        elif args.efficiency:  # the heat map is the efficiency view's; the results plot alone does not miss it
            print("no utilisation heat map: no trial has sys/gpu*/util or sys/cpu/util scalars", file=sys.stderr)
    if args.efficiency:
        sys.stdout.write(render_efficiency_markdown(rows, keys, hours) if args.markdown
                         else render_efficiency_text(rows, total, keys, hours))
    else:
        sys.stdout.write((render_markdown if args.markdown else render_text)(rows, keys, total, hours))
        if search is not None:
            sys.stdout.write(best_trial_text(search))
        best_num = search.best.num if search is not None and search.best is not None else None
        export = export_line(args.sweep_dir, rows, best_num) if search is None or best_num is not None else None
        if export:
            sys.stdout.write(export + "\n")
        if args.markdown:
            sys.stdout.write("\n" + render_efficiency_markdown(rows, keys, hours))
    sync = sync_line(args.sweep_dir)
    if sync:
        print(sync, file=sys.stderr)
    return 0


if __name__ == "__main__":
    from hpcsweep.results.closed_pipe import exit_code

    sys.exit(exit_code(main))
