"""Which trial of a sweep to export, and which of its checkpoints: decisions on a sweep dir's files.

``--best`` is the trial with the lowest ``best_val_loss`` in its metrics.json among the trials that
have a checkpoint (``--by KEY``: the best by another key, the largest for an accuracy or task score); ``--trial N`` is trial N. Of the trial's checkpoints, ``best`` is the one with the
lowest validation loss in its name (``hpcsweep.train.checkpoint.manager`` keeps the top-k by it, weights
only), ``last`` the newest. Only checkpoints whose weights are complete count. Every refusal is an
``ExportRefused`` with the one line to print.

A sweep that is still running (a trial pending or running, as ``report`` says from metrics.json and
Slurm) is refused: its best trial may change, and a running trial's newest checkpoint is an
intermediate one. ``--trial N`` of a finished trial is allowed; ``--allow-running`` takes what is there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hpcsweep.files.sweep_record import missing_sweep_message
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.files.metric_keys import finite_metric
from hpcsweep.results.table import JobQuery, higher_is_better, load_sweep, read_record, resolve_trial_dir
from hpcsweep.slurm.job_states import query_job_states
from hpcsweep.train.checkpoint.manager import CheckpointError, checkpoint_paths, inspect_checkpoint, parse_name


UNFINISHED_STATUSES = ("running", "pending")
"""Statuses (``report``'s) of a trial that may still write a better checkpoint."""


class ExportRefused(ValueError):
    """Nothing can be exported as asked; the message is the one line that says why."""


@dataclass(frozen=True)
class TrialChoice:
    """A trial of the sweep: its number, overrides and directory."""

    num: int
    overrides: list[str]
    trial_dir: Path


@dataclass(frozen=True)
class ExportSource:
    """What an export reads: the trial, its metrics.json, and the checkpoint chosen."""

    trial: TrialChoice
    metrics: dict[str, Any]
    checkpoint: Path


def sweep_trials(sweep_dir: Path) -> list[TrialChoice]:
    """The trials of ``sweep_dir`` (from sweep.json), or a trial dir itself as trial 0 (as the report reads them)."""
    missing = missing_sweep_message(sweep_dir)
    if missing:
        raise ExportRefused(missing)
    record = read_record(sweep_dir)
    return [TrialChoice(t.num, list(t.overrides), resolve_trial_dir(sweep_dir, t)) for t in record.trials]


def usable_checkpoints(trial_dir: Path) -> list[Path]:
    """The trial's checkpoints whose weights can be read, newest first."""
    usable = []
    for path in checkpoint_paths(TrialFiles(trial_dir).checkpoints):
        try:
            inspect_checkpoint(path)
        except CheckpointError:
            continue
        if path.is_dir():  # the one-file format of old trial dirs is not exported
            usable.append(path)
    return usable


def choose_checkpoint(names: Sequence[str], which: Literal["best", "last"]) -> str:
    """``best``: the lowest validation loss (the newest among equals, and when none has one); ``last``:
    the newest. ``names`` are checkpoint names, at least one."""
    parsed = {name: parse_name(name) for name in names}
    newest = max(names, key=lambda n: parsed[n][0])
    if which == "last":
        return newest
    finite = [n for n in names if math.isfinite(parsed[n][1])]
    if not finite:
        return newest
    return min(finite, key=lambda n: (parsed[n][1], -parsed[n][0]))


def read_trial_metrics(trial_dir: Path) -> dict[str, Any]:
    """The trial's metrics.json ({} before it has started)."""
    path = TrialFiles(trial_dir).metrics
    return json.loads(path.read_text()) if path.exists() else {}


def choose_source(
    sweep_dir: Path, trial_num: int | None, which: Literal["best", "last"], by: str = "best_val_loss"
) -> ExportSource:
    """The trial (``trial_num``; None: the best by metrics.json's ``by``, :func:`best_trial`) and the
    checkpoint to export, or ``ExportRefused``."""
    trials = sweep_trials(sweep_dir)
    if trial_num is not None:
        chosen = [t for t in trials if t.num == trial_num]
        if not chosen:
            raise ExportRefused(f"--trial {trial_num}: {sweep_dir} has trials {', '.join(str(t.num) for t in trials)}")
        trial = chosen[0]
        checkpoints = usable_checkpoints(trial.trial_dir)
        if not checkpoints:
            raise ExportRefused(
                f"trial #{trial.num} has no checkpoint to export in {TrialFiles(trial.trial_dir).checkpoints}"
            )
    else:
        candidates = [(t, read_trial_metrics(t.trial_dir)) for t in trials if usable_checkpoints(t.trial_dir)]
        if not candidates:
            raise ExportRefused(f"no trial of {sweep_dir} has a checkpoint to export")
        trial = best_trial(candidates, by)
        checkpoints = usable_checkpoints(trial.trial_dir)
    by_name = {p.name: p for p in checkpoints}
    return ExportSource(trial, read_trial_metrics(trial.trial_dir), by_name[choose_checkpoint(list(by_name), which)])


def trial_statuses(sweep_dir: Path, query: JobQuery = query_job_states) -> dict[int, str]:
    """Each trial's status as ``report`` shows it (metrics.json, and Slurm's state on a Slurm sweep)."""
    return {row.num: row.status for row in load_sweep(sweep_dir, query=query, with_scalars=False).rows}


def running_refusal(statuses: Mapping[int, str], trial_num: int | None, sweep_dir: Path) -> str | None:
    """Why the export must wait, or None: ``--best`` (``trial_num`` None) waits for every trial,
    ``--trial N`` for trial N only."""
    unfinished = {num: status for num, status in sorted(statuses.items()) if status in UNFINISHED_STATUSES}
    if trial_num is not None:
        unfinished = {num: status for num, status in unfinished.items() if num == trial_num}
    if not unfinished:
        return None
    named = ", ".join(f"#{num} {status}" for num, status in unfinished.items())
    what = f"trial #{trial_num} has not finished ({named})" if trial_num is not None else (
        f"the sweep has not finished (trials {named}): its best trial may change")
    return (f"{what}; wait (python -m hpcsweep.status {sweep_dir} --follow), export a finished trial with "
            "--trial N, or export the checkpoints written so far with --allow-running")


def running_note(source: ExportSource, statuses: Mapping[int, str]) -> str | None:
    """With ``--allow-running``: which checkpoint of an unfinished trial was taken, or None when it finished."""
    status = statuses.get(source.trial.num)
    if status not in UNFINISHED_STATUSES:
        return None
    step = (parse_name(source.checkpoint.name) or (None, None))[0]
    of = f" of {source.metrics['max_steps']}" if source.metrics.get("max_steps") else ""
    return (f"trial #{source.trial.num} is {status}: exported its checkpoint {source.checkpoint.name} "
            f"(step {step}{of}), not its final weights")




def best_trial(candidates: Sequence[tuple[TrialChoice, dict[str, Any]]], by: str) -> TrialChoice:
    """The candidate whose metrics.json is best by dotted key ``by``: the largest for accuracies and
    task scores (``tasks.NAME.acc``), else the smallest; a failed trial only when no other has a number,
    and the lowest number among equals, as ``report`` ranks its rows (``results.table.sort_rows``).
    ``ExportRefused`` when no candidate has a finite number there."""
    valued = [(trial, value, metrics.get("status") == "failed")
              for trial, metrics in candidates if (value := finite_metric(metrics, by)) is not None]
    if not valued:
        raise ExportRefused(f"--by {by}: no trial with a checkpoint has a number {by} in its metrics.json")
    sign = -1.0 if higher_is_better(by) else 1.0
    return min(valued, key=lambda tvf: (tvf[2], sign * tvf[1], tvf[0].num))[0]


def out_dir_refusal(out: Path) -> str | None:
    """Why ``--out`` cannot be written, or None: it must not exist, or be an empty directory."""
    if not out.exists():
        return None
    if not out.is_dir():
        return f"--out {out} exists and is not a directory: choose a new folder"
    if any(out.iterdir()):
        return f"--out {out} exists and is not empty: choose a new folder (an export never overwrites one)"
    return None
