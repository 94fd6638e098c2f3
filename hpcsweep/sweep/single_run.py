"""Check a single run's config (``python -m hpcsweep [overrides]``, no ``-m``) before Hydra starts it.

Hydra makes a run's dir and its log before the task function sees the config, so a refusal there
leaves ``outputs/<date>/<time>/`` behind and costs the whole start-up. The config is composed
here the way the run composes it, and checked the way the trial checks it, first: a refused run is
as quick as a refused sweep and leaves nothing. The run then takes the checked config
(``HpcsweepTrials.running_checked``) instead of validating Hydra's composition again.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcsweep.config import ResumeConfig, TrialConfig, resume_config_from_dict
from hpcsweep.sweep.fine_tune_data import refuse_synthetic_fine_tuning
from hpcsweep.sweep.hydra_private import parse_command_line
from hpcsweep.sweep.prepare import validate_composed

CONFIG_MODULE = "hpcsweep.configs"
CONFIG_NAME = "config"


def is_plain_single_run(args: Sequence[str]) -> bool:
    """True for a command that runs one trial with the app's own configs: no ``-m``, no ``--help``,
    ``--cfg``, ``--info`` or completion, no other config dir or name."""
    parsed = parse_command_line(args)
    asks_something_else = (
        parsed.multirun, parsed.help, parsed.hydra_help, parsed.cfg, parsed.info, parsed.shell_completion,
        parsed.experimental_rerun, parsed.config_path, parsed.config_name, parsed.config_dir,
    )
    return not any(asks_something_else)


def check_single_run(args: Sequence[str]) -> tuple[TrialConfig, ResumeConfig] | None:
    """The single run's trial and resume settings, checked; ``ValueError`` when the trial would refuse its config.

    Anything else (a sweep, ``--cfg job``, an override Hydra cannot apply, ``hydra.mode=MULTIRUN``)
    is left to Hydra, which says what it says today: None. The app's plugins must be registered
    (``hpcsweep.app`` imported) first.
    """
    if not is_plain_single_run(args):
        return None
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from hydra.types import RunMode

    overrides = parse_command_line(args).overrides or []
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            config = compose(config_name=CONFIG_NAME, overrides=overrides, return_hydra_config=True)
    except HydraException:
        return None
    if config.hydra.mode == RunMode.MULTIRUN:
        return None
    trial = validate_composed(config)
    refuse_synthetic_fine_tuning(trial, overrides)
    return trial, resume_config_from_dict(config)
