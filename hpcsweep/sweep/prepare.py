"""Compose and validate every trial of a sweep before anything runs or is submitted.

A trial whose dir already holds a checkpoint is checked against the config it was trained with
(``hpcsweep.trial.identity``), every trial before any runs: a bad resume fails at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.utils import filter_overrides
from omegaconf import DictConfig, OmegaConf

from hpcsweep.config import (
    ResumeConfig,
    TrialConfig,
    resume_config_from_dict,
    trial_config_from_dict,
)
from hpcsweep.sweep.compose import SweepComposer
from hpcsweep.trial.identity import (
    ConfigMismatch,
    differences_text,
    mismatch_message,
    resume_differences,
)

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
    resume: ResumeConfig = field(default_factory=ResumeConfig)


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
    """Compose every trial from the launcher's master config, validate it, check it may resume its dir.

    Raises ``SweepConfigError`` naming the trial and the bad key on the first invalid trial, or on
    the first of the trials whose dirs were trained with another config.
    """
    composer = SweepComposer(launcher.hydra_context.config_loader, launcher.config)
    trials = []
    for offset, overrides in enumerate(job_overrides):
        num = initial_job_idx + offset
        try:
            composed = composer.compose_app(overrides)
            trial_config, resume = validate_composed(composed), resume_config_from_dict(composed)
        except ValueError as err:
            raise SweepConfigError(f"trial #{num} ({trial_label(overrides)}): {err}") from None
        trials.append(PreparedTrial(num, list(overrides), composer.trial_dir(overrides, num), trial_config, resume))
    check_resumes(trials)
    return trials


def check_resumes(trials: Sequence[PreparedTrial]) -> None:
    """Refuse the sweep if any trial dir was trained with another config (``resume.force`` allows it).

    Every trial is checked, so the error says how many differ, not only the first.
    """
    refused: list[str] = []
    for trial in trials:
        label = f"trial #{trial.num} ({trial_label(trial.overrides)})"
        try:
            differences = resume_differences(trial.trial_dir, trial.config)
        except ConfigMismatch as err:
            if not trial.resume.force:
                refused.append(f"{label}: {err}")
            continue
        if differences and trial.resume.force:
            log.warning("%s resumes with a different config: %s", label, differences_text(differences))
        elif differences:
            refused.append(f"{label}: {mismatch_message(trial.trial_dir, differences)}")
    if refused:
        more = f" ({len(refused) - 1} more of the {len(trials)} trials differ too)" if len(refused) > 1 else ""
        raise SweepConfigError(refused[0] + more)
