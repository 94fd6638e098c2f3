"""Fine-tuning needs data: a model folder on the synthetic corpus is refused unless the user asked for it.

``data=synthetic`` is the root config's default, so a user who brings a pretrained folder
(``model=pretrained model.path=DIR``) and forgets ``data=`` would fine-tune real weights on random
tokens, with exit status 0. Such a trial is refused on the login node, naming ``data=text`` and
``data=file``; saying ``data=synthetic`` (or ``data.kind=synthetic``) on the command line keeps it,
as a smoke run of the folder. ``model.random_init=true`` builds the folder's architecture from
scratch, for which synthetic tokens are a fine corpus, so it stays allowed.

The decision needs the command line, which the composed config no longer holds: the sweep's trials
carry their overrides (``HpcsweepTrials.check_sweep``), a single run its arguments
(``hpcsweep.sweep.single_run``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcsweep.config import TrialConfig

EXPLICIT_SYNTHETIC = ("data=synthetic", "data.kind=synthetic")
"""The overrides that say, on the command line, that the synthetic corpus is meant."""


def asks_for_synthetic(overrides: Sequence[str]) -> bool:
    """True when ``overrides`` choose the synthetic corpus themselves (``data=synthetic``)."""
    return any(line.removeprefix("++").removeprefix("+") in EXPLICIT_SYNTHETIC for line in overrides)


def refuse_synthetic_fine_tuning(trial: TrialConfig, overrides: Sequence[str]) -> None:
    """Raise ``ValueError`` when ``trial`` would fine-tune its folder's weights on the synthetic corpus
    by default, i.e. without ``data=synthetic`` among ``overrides``."""
    model, data = trial.model, trial.data
    if model.path is None or model.random_init or data.kind != "synthetic" or asks_for_synthetic(overrides):
        return
    raise ValueError(
        f"data=synthetic (the default) is not allowed with model.path={model.path}: its pretrained weights would "
        "fine-tune on random tokens; give it your text (data=text data.files='corpus/*.txt') or a token file "
        "(data=file data.path=FILE.bin), or say data=synthetic on the command line for a smoke run"
    )
