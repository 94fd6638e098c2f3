"""The sweeper: Hydra's basic grid sweeper, without composing every trial twice."""

from __future__ import annotations

from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper


class GridSweeper(BasicSweeper):
    """Hydra's basic sweeper (grid over comma lists, ranges, ``glob``), unchanged in behaviour.

    Hydra's sweeper composes every trial to check it before the launcher composes each one again.
    hpcsweep's launchers compose and validate every trial before anything runs, so with them
    the first pass is skipped; with any other launcher Hydra's check runs as usual.
    """

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        from hydra_plugins.hpcsweep_plugins.launchers import LocalLauncher, SlurmLauncher

        if isinstance(self.launcher, (LocalLauncher, SlurmLauncher)):
            return
        super().validate_batch_is_legal(batch)
