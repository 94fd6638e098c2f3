"""Compose and check every trial of a sweep, through the app's hook, before anything runs or is submitted."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NoReturn

from hydra.core.utils import filter_overrides

from hpcsweep.sweep.compose import SweepComposer
from hpcsweep.sweep.hooks import SweepTrial, TrialHook

log = logging.getLogger(__name__)


class SweepConfigError(ValueError):
    """A trial of the sweep has a bad config; nothing was run or submitted."""


def trial_label(overrides: Sequence[str]) -> str:
    """How a trial is named in messages: its overrides, or ``(defaults)``."""
    shown = filter_overrides(list(overrides))
    return " ".join(shown) if shown else "(defaults)"


def exit_with_config_error(err: ValueError, what: str) -> NoReturn:
    """Report a bad config in one line and exit with status 2, without a traceback."""
    log.error("%s; %s", err, what)
    raise SystemExit(2)


def check_trials(
    launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, hook: TrialHook
) -> list[SweepTrial]:
    """Compose every trial from the launcher's master config and check it with ``hook``, then the sweep
    (``hook.begin_sweep(launcher)`` first: a launcher it has not seen starts a new sweep).

    Raises ``SweepConfigError`` naming the trial on the first trial that does not compose or that
    ``hook.check_trial`` refuses, or the error of ``hook.check_sweep``.
    """
    hook.begin_sweep(launcher)
    composer = SweepComposer(launcher.hydra_context.config_loader, launcher.config)
    compose = composer.compose_values if hook.plain_values else composer.compose_app
    trials = []
    for offset, overrides in enumerate(job_overrides):
        num = initial_job_idx + offset
        try:
            checked = hook.check_trial(compose(overrides), launcher.params)
        except ValueError as err:
            raise SweepConfigError(f"trial #{num} ({trial_label(overrides)}): {err}") from None
        trial_dir = composer.trial_dir(overrides, num)
        trials.append(SweepTrial(num, list(overrides), trial_dir, checked.allocation, checked.app_config))
    hook.check_sweep(trials)
    return trials
