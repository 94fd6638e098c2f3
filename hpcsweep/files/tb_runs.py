"""Where a trial's TensorBoard events go: ``tb/<its overrides>``, so the run list names each trial.

``tensorboard --logdir SWEEP_DIR`` names a run by its directory under the logdir: events directly in
a trial's ``tb/`` show as ``3/tb``, events in ``tb/<run name>`` as ``3/tb/model.lr=1e-4,trainer.nodes=2``.
The run name is Hydra's ``hydra.job.override_dirname`` (its separators and excluded keys are set in
``configs/config.yaml``) as the trial's ``.hydra/hydra.yaml`` recorded it, made into one safe
directory name by :func:`run_name`. The trial number in front keeps runs apart even when two names
come out the same.

A trial keeps the run dir it started with: a resume writes where the first attempt wrote, and a
trial from before run names (events directly in ``tb/``) goes on writing there.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import yaml

from hpcsweep.files.trial_files import TB_DIR

HYDRA_FILE = Path(".hydra") / "hydra.yaml"
MAX_RUN_NAME = 200
"""Longest run name in characters (ASCII, so bytes): room for a dozen overrides, below the 255 a name may have."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._,=+\-]")
_HASH_CHARS = 8


def event_files(run_dir: Path) -> list[Path]:
    """The event files directly in ``run_dir``, in the order TensorBoard reads them (none when it is missing).

    An event file is any file whose name holds ``tfevents``, as TensorBoard has it.
    """
    try:
        with os.scandir(run_dir) as entries:
            return sorted(Path(entry.path) for entry in entries if "tfevents" in entry.name and entry.is_file())
    except (FileNotFoundError, NotADirectoryError):
        return []


def run_name(override_dirname: str) -> str:
    """``override_dirname`` as one directory name.

    Every character but letters, digits and ``._,=+-`` becomes ``_``: no ``/``, no space, no
    character a shell would expand or a Windows copy would refuse. A name over ``MAX_RUN_NAME``
    characters is cut and ends with ``~`` and a hash of the whole, so two long names that share a
    beginning stay apart.
    """
    safe = _UNSAFE.sub("_", override_dirname)
    if safe in (".", ".."):
        return "_" * len(safe)
    if len(safe) <= MAX_RUN_NAME:
        return safe
    digest = hashlib.sha256(override_dirname.encode()).hexdigest()[:_HASH_CHARS]
    return f"{safe[: MAX_RUN_NAME - _HASH_CHARS - 1]}~{digest}"


def recorded_override_dirname(trial_dir: Path) -> str:
    """``hydra.job.override_dirname`` of the trial's Hydra record; "" for a trial run outside Hydra."""
    try:
        record = yaml.safe_load((trial_dir / HYDRA_FILE).read_text()) or {}
    except FileNotFoundError:
        return ""
    return str(((record.get("hydra") or {}).get("job") or {}).get("override_dirname") or "")


def _first_run(trial_dir: Path) -> tuple[Path, list[Path]] | None:
    """The first run dir of the trial holding event files, with its files (see ``existing_run_dir``)."""
    tb_dir = trial_dir / TB_DIR
    files = event_files(tb_dir)
    if files:
        return tb_dir, files
    if not tb_dir.is_dir():
        return None
    for run_dir in sorted(tb_dir.iterdir()):
        files = event_files(run_dir)
        if files:
            return run_dir, files
    return None


def existing_run_dir(trial_dir: Path) -> Path | None:
    """The directory already holding the trial's event files: ``tb/`` itself, else the first
    subdirectory of ``tb/`` (by name) that has some; None before the trial logged anything."""
    found = _first_run(trial_dir)
    return found[0] if found else None


def run_event_files(trial_dir: Path) -> list[Path]:
    """The event files of the trial's run (those in ``existing_run_dir``), in reading order; [] before any."""
    found = _first_run(trial_dir)
    return found[1] if found else []


def trial_run_dir(trial_dir: Path) -> Path:
    """Where the trial writes its events: where it wrote before, else ``tb/<run name>``
    (``tb/`` itself for a trial without overrides: there is nothing to name it by)."""
    existing = existing_run_dir(trial_dir)
    if existing is not None:
        return existing
    name = run_name(recorded_override_dirname(trial_dir))
    return trial_dir / TB_DIR / name if name else trial_dir / TB_DIR
