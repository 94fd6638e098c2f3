"""hpcsweep's own checks of its trials: the trial schema, and resuming a trial dir.

A trial whose dir already holds a checkpoint is checked against the config it was trained with
(``hpcsweep.trial.identity``), every trial before any runs: a bad resume fails at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpcsweep.config import ResumeConfig, TrialConfig, check_corpus_fits, trial_config_from_dict
from hpcsweep.files.token_file import TokenFileError, read_token_header
from hpcsweep.sweep.sweep_trials import SweepConfigError, trial_label
from hpcsweep.trial.identity import (
    ConfigMismatch,
    differences_text,
    mismatch_message,
    resume_differences,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedTrial:
    """One composed trial of hpcsweep's, validated."""

    num: int
    overrides: list[str]
    trial_dir: Path
    config: TrialConfig
    resume: ResumeConfig = field(default_factory=ResumeConfig)


def validate_composed(config: DictConfig | Mapping[str, Any]) -> TrialConfig:
    """Validate one composed Hydra config (the ``hydra`` node, resolved only at run time, is skipped),
    its token file included."""
    values: dict[str, Any] = {
        key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        for key, value in config.items()
        if key != "hydra"
    }
    trial = trial_config_from_dict(values)
    check_token_file(trial)
    return trial


def check_token_file(trial: TrialConfig) -> None:
    """Raise ``ValueError`` naming ``data.path`` as typed when the trial's token file is missing or
    unreadable, or when its corpus does not fit ``model.vocab_size`` and ``data.seq_len``."""
    data = trial.data
    if data.kind != "file":
        return
    assert data.path is not None
    try:
        header = read_token_header(Path(data.path))
    except TokenFileError as err:
        raise ValueError(f"data.path={data.path!r} is not allowed: {err}") from None
    check_corpus_fits(
        data,
        trial.model.vocab_size,
        num_tokens=header.num_tokens,
        corpus_vocab_size=header.vocab_size,
        source=data.path,
    )


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
