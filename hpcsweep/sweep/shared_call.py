"""The function each array task runs: a launcher pickled once per sweep, not once per trial.

submitit pickles the submitted function with every array task. Hydra's submitit launcher
submits itself, and it carries the whole master config, the config loader and Hydra's global
state: tens of milliseconds of pickling per trial, most of a thousand-trial submission. Here the
launcher is written once into the sweep's submitit folder and each task pickles only its path
and its trials (one, or ``trials_per_task`` of them): their overrides, numbers and the configs the
login node checked.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from hpcsweep.files.atomic import atomic_write_bytes

LAUNCHER_FILE = "launcher.pkl"


def write_shared_launcher(folder: Path, launcher: Any, singleton_state: Any) -> Path:
    """Pickle the launcher and Hydra's global state once; return the file's path."""
    path = folder / LAUNCHER_FILE
    atomic_write_bytes(path, cloudpickle.dumps((launcher, singleton_state)))
    return path


def load_shared_launcher(path: Path) -> tuple[Any, Any]:
    """The launcher and Hydra's global state that ``write_shared_launcher`` stored at ``path``."""
    with open(path, "rb") as handle:
        return pickle.load(handle)


@dataclass(frozen=True)
class TaskTrial:
    """One trial of an array task: its overrides, its Hydra job number, and what the app's hook made of its
    config on the login node (``TrialHook.check_trial``), which the task runs instead of checking it again."""

    overrides: Sequence[str]
    num: int
    checked: Any = None


TaskTrials = Sequence[TaskTrial]
"""The trials of one array task, in order."""


@dataclass(frozen=True)
class SharedLauncherCall:
    """Runs an array task's trials through the launcher stored at ``launcher_path``."""

    launcher_path: str

    def __call__(self, trials: TaskTrials) -> Any:
        """The launcher's ``run_trials``: each trial's JobReturn by job number."""
        launcher, singleton_state = load_shared_launcher(Path(self.launcher_path))
        return launcher.run_trials(trials, singleton_state)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Resubmit the same call (submitit's hook for requeue after a timeout)."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
