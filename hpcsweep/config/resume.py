"""The ``resume`` group: how a run treats a trial dir that already holds a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class ResumeConfig:
    """How a run treats a trial dir that already holds a checkpoint (see ``hpcsweep.trial.identity``).

    Not part of a trial's config: it says how to start the trial, not how it trains.
    """

    force: bool = False
    """Resume even if the trial dir was trained with another training config (``model.lr``,
    ``trainer.max_steps``, ...); the differences are logged and the old config is kept aside."""
