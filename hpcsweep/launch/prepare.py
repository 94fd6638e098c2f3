"""Compose and validate every trial of a sweep before anything runs or is submitted."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.utils import filter_overrides
from omegaconf import DictConfig, OmegaConf

from hpcsweep.config import TrialConfig, trial_config_from_dict
from hpcsweep.launch.compose import SweepComposer

log = logging.getLogger(__name__)


class SweepConfigError(ValueError):
    """A trial of the sweep has a bad config; nothing was run or submitted."""


@dataclass(frozen=True)
class PreparedTrial:
    """One composed, validated trial."""

    num: int
    overrides: list[str]
    trial_dir: Path
    config: TrialConfig


def trial_label(overrides: Sequence[str]) -> str:
    """How a trial is named in messages: its overrides, or ``(defaults)``."""
    shown = filter_overrides(list(overrides))
    return " ".join(shown) if shown else "(defaults)"


def validate_composed(config: DictConfig) -> TrialConfig:
    """Validate one composed Hydra config (the ``hydra`` node, resolved only at run time, is skipped)."""
    values: dict[str, Any] = {
        key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        for key, value in config.items()
        if key != "hydra"
    }
    return trial_config_from_dict(values)


def exit_with_config_error(err: ValueError, what: str) -> NoReturn:
    """Report a bad config in one line and exit with status 2, without a traceback."""
    log.error("%s; %s", err, what)
    raise SystemExit(2)


def prepare_trials(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[PreparedTrial]:
    """Compose every trial from the launcher's master config and validate it.

    Raises ``SweepConfigError`` naming the trial and the bad key on the first invalid trial.
    """
    composer = SweepComposer(launcher.hydra_context.config_loader, launcher.config)
    trials = []
    for offset, overrides in enumerate(job_overrides):
        num = initial_job_idx + offset
        try:
            trial_config = validate_composed(composer.compose_app(overrides))
        except ValueError as err:
            raise SweepConfigError(f"trial #{num} ({trial_label(overrides)}): {err}") from None
        trials.append(PreparedTrial(num, list(overrides), composer.trial_dir(overrides, num), trial_config))
    return trials
