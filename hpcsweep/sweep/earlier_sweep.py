"""The same sweep command run again after a Ctrl-C: say that an earlier sweep dir holds its stopped trials.

Hydra gives every sweep a new dir (``multirun/DATE/TIME``), so the command typed again after a Ctrl-C
starts its trials from step 0 in a new dir, while the earlier one holds checkpoints of the same
trials. Before a local sweep runs, the newest earlier sweep dirs beside its own (the same
``multirun/`` folder) are read; the newest whose trials have the same overrides and where some trial
stopped with a checkpoint, or never started, is named with the line that resumes it (the same
command with ``hydra.sweep.dir`` pinned to it). hpcsweep prints the line and runs the new sweep as
asked: resuming is the user's choice, never a guess.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcsweep.files.metrics_file import NOT_STARTED, read_metrics
from hpcsweep.files.sweep_record import SWEEP_FILE, SweepRecord, read_sweep_record, resolve_trial_dir
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.sweep.resume_hint import SWEEP_DIR_KEY, resume_command, shown_dir

log = logging.getLogger(__name__)

LOOK_BACK = 20
"""How many of the newest earlier sweep dirs are read: the Ctrl-C'd one is among the last few."""
UNFINISHED = ("stopped", NOT_STARTED)
"""Trial statuses that running the earlier sweep's command again with its dir would pick up."""


@dataclass(frozen=True)
class EarlierSweep:
    """An earlier sweep dir of the same trials, and where its unfinished trials stand."""

    sweep_dir: Path
    unfinished: list[tuple[int, str, int]]
    """``(trial number, status, step)`` of each trial that stopped with a checkpoint or never started."""


def sweep_dirs_beside(sweep_dir: Path, look_back: int = LOOK_BACK) -> list[Path]:
    """The newest ``look_back`` sweep dirs in the ``multirun/DATE/TIME`` layout that holds ``sweep_dir``, newest first."""
    found = sorted((p.parent for p in sweep_dir.parent.parent.glob(f"*/*/{SWEEP_FILE}")), reverse=True)
    return [p for p in found if p.resolve() != sweep_dir.resolve()][:look_back]


def unfinished_trials(sweep_dir: Path, record: SweepRecord) -> list[tuple[int, str, int]]:
    """The trials of an earlier sweep that its command, run again in its dir, would resume or start."""
    unfinished = []
    for trial in record.trials:
        metrics = read_metrics(TrialFiles(resolve_trial_dir(sweep_dir, trial)).metrics) or {}
        if metrics.get("status") in UNFINISHED:
            unfinished.append((trial.num, metrics["status"], int(metrics.get("step") or 0)))
    return unfinished


def earlier_sweep_of(sweep_dir: Path, overrides: Sequence[Sequence[str]], look_back: int = LOOK_BACK) -> EarlierSweep | None:
    """The newest earlier sweep dir beside ``sweep_dir`` whose trials have ``overrides`` (in order) and some of
    which are unfinished; None when there is none."""
    wanted = [list(o) for o in overrides]
    for candidate in sweep_dirs_beside(sweep_dir, look_back):
        try:
            record = read_sweep_record(candidate)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a sweep.json being written, or of another version: not this command's
        if [t.overrides for t in record.trials] != wanted:
            continue
        unfinished = unfinished_trials(candidate, record)
        if unfinished:
            return EarlierSweep(candidate, unfinished)
    return None


def earlier_sweep_line(earlier: EarlierSweep, argv: Sequence[str], cwd: str) -> str:
    """The line that names the earlier sweep, its unfinished trials, and the command that resumes it."""
    shown = shown_dir(str(earlier.sweep_dir), cwd)
    trials = ", ".join(f"#{num} {status} at step {step}" for num, status, step in earlier.unfinished)
    return (f"an earlier sweep of this command, {shown}, holds unfinished trials ({trials}); this command starts a new "
            f"sweep from step 0. To resume that one instead: {resume_command(argv, SWEEP_DIR_KEY, shown)}")


def say_if_an_earlier_sweep_stopped(sweep_dir: Path, overrides: Sequence[Sequence[str]]) -> None:
    """Log ``earlier_sweep_line`` when this sweep's command has an unfinished earlier sweep, unless the
    command pins its sweep dir itself (then it resumes that one)."""
    argv = sys.argv[1:]
    if any(arg.startswith(f"{SWEEP_DIR_KEY}=") for arg in argv):
        return
    earlier = earlier_sweep_of(sweep_dir, overrides)
    if earlier is not None:
        log.warning("%s", earlier_sweep_line(earlier, argv, os.getcwd()))
