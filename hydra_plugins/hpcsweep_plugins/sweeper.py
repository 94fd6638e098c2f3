"""The sweeper: Hydra's basic grid sweeper, without composing every trial twice or leaving litter."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.errors import HydraException

from hpcsweep.sweep.hydra_private import basic_sweeper_class

MULTIRUN_FILE = "multirun.yaml"
CONFIG_ERROR_EXIT = 2
"""The exit status of a sweep refused for its config (``hpcsweep.sweep.prepare``)."""


def missing_dirs(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def holds_only(directory: Path, name: str) -> bool:
    """True when ``directory`` holds exactly one entry, called ``name``."""
    return directory.is_dir() and [entry.name for entry in directory.iterdir()] == [name]


def undo_sweep_dir(sweep_dir: Path, created: Sequence[Path], old_multirun: bytes | None, refused: bool) -> None:
    """Take back what a sweep that ended before running anything wrote into ``sweep_dir``.

    A dir this command created goes (with the parents it created) when it holds only
    ``multirun.yaml``; in a dir that existed, a refused sweep puts the old ``multirun.yaml`` back.
    """
    if created and holds_only(sweep_dir, MULTIRUN_FILE):
        (sweep_dir / MULTIRUN_FILE).unlink()
        for directory in created:
            try:
                os.rmdir(directory)
            except OSError:  # not empty: something else lives there now
                break
    elif refused and old_multirun is not None:
        (sweep_dir / MULTIRUN_FILE).write_bytes(old_multirun)


def is_refusal(err: BaseException) -> bool:
    """True for the errors that stop a sweep before any trial runs: config and composition errors."""
    return isinstance(err, HydraException) or (isinstance(err, SystemExit) and err.code == CONFIG_ERROR_EXIT)


class GridSweeper(basic_sweeper_class()):  # type: ignore[misc]
    """Hydra's basic sweeper (grid over comma lists, ranges, ``glob``), unchanged in behaviour.

    Hydra's sweeper composes every trial to check it before the launcher composes each one again.
    hpcsweep's launchers compose and validate every trial before anything runs, so with them
    the first pass is skipped; with any other launcher Hydra's check runs as usual.

    Hydra writes ``SWEEP_DIR/multirun.yaml`` before the launcher validates the trials: a refused
    sweep would leave a dir holding only that file, so it is taken back (``undo_sweep_dir``).
    """

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        created = missing_dirs(sweep_dir)
        multirun = sweep_dir / MULTIRUN_FILE
        old_multirun = multirun.read_bytes() if multirun.exists() else None
        try:
            return super().sweep(arguments)
        except BaseException as err:
            undo_sweep_dir(sweep_dir, created, old_multirun, is_refusal(err))
            raise

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        from hydra_plugins.hpcsweep_plugins.launchers import (
            LocalLauncher,
            SlurmLauncher,
        )

        if isinstance(self.launcher, (LocalLauncher, SlurmLauncher)):
            return
        super().validate_batch_is_legal(batch)
