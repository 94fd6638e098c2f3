"""Catch a misspelt config key on the command line and name the closest known one.

Hydra answers ``model.lrr=1e-3`` with "To append to your config use +model.lrr=1e-3", which is the
wrong advice for a typo, and ``hydra.launcher.array_paralellism=8`` with the name of a dataclass.
Every key a trial accepts is a field of a dataclass in ``hpcsweep.config``, and every key of
hpcsweep's launchers one of theirs, so the check needs no composition: it runs before Hydra starts.
The wording of an unknown trial key is ``hpcsweep.config.unknown_key_message``'s, the same as
for a key found in a composed config.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from hpcsweep.config import FOLDER_ARCHITECTURE_KEYS, config_keys, unknown_key_message

LAUNCHER_PREFIX = "hydra.launcher."
LAUNCHER_GROUP = "hydra/launcher"
DEFAULT_LAUNCHER = "auto"
"""The ``hydra/launcher`` option of ``configs/config.yaml``."""
_LAUNCHER_NAMES = {"slurm": "the Slurm launcher", "local": "the local launcher"}
# Launcher keys whose value is a mapping or list with entries of its own.
_FREE_LAUNCHER_KEYS = {"additional_parameters", "setup"}


def launcher_name(option: str) -> str:
    """How messages name a launcher option; ``auto`` runs on Slurm or locally, so it is "the launcher"."""
    return _LAUNCHER_NAMES.get(option.removeprefix("hpcsweep_"), "the launcher")


def unknown_launcher_key_message(key: str, option: str, keys: Sequence[str]) -> str | None:
    """Why ``hydra.launcher.KEY`` is not a key of launcher ``option`` (whose keys are ``keys``, a nested
    config's as ``KEY.SUB``: ``container.runtime``), with the closest one; None when it is one."""
    dotted = key.removeprefix(LAUNCHER_PREFIX)
    name = dotted.split(".")[0]
    if dotted in keys or (name in keys and name in _FREE_LAUNCHER_KEYS):
        return None
    guesses = difflib.get_close_matches(dotted if "." in dotted else name, keys, n=1)
    hint = f"; did you mean {LAUNCHER_PREFIX}{guesses[0]}?" if guesses else ""
    launcher = launcher_name(option)
    # _target_ names the class; a nested config's keys show as the config's own name.
    shown = ", ".join(sorted(k for k in keys if not k.startswith("_") and "." not in k))
    return f"{key} is not a key of {launcher}{hint} (keys of {launcher}: {shown})"


def names_a_folder(overrides: Sequence[str]) -> bool:
    """Whether the command trains a model folder (``model=pretrained``, or a non-empty ``model.path=``)."""
    return any(line == "model=pretrained" or (line.startswith("model.path=") and line not in ("model.path=",
               "model.path=null")) for line in overrides)


def trial_keys(overrides: Sequence[str]) -> dict[str, list[str]]:
    """Every trial key a command may set: with a model folder, not the built-in model's size keys, which
    the folder's ``config.json`` sets (setting one is refused), so no typo hint offers one."""
    keys = config_keys()
    if names_a_folder(overrides):
        keys["model"] = [k for k in keys["model"] if k not in FOLDER_ARCHITECTURE_KEYS]
    return keys


def check_override_keys(args: Sequence[str], launcher_keys: Mapping[str, Sequence[str]] | None = None) -> None:
    """Raise ``ValueError`` for the first plain ``key=value`` override whose key no trial, or the
    launcher chosen, has.

    ``args`` are the command's arguments; flags and unparsable overrides are left to Hydra, and so
    are ``+key=``, ``++key=`` and ``~key`` (appending and deleting are deliberate).
    ``launcher_keys`` maps each of hpcsweep's ``hydra/launcher`` options to its keys; the
    ``hydra.launcher.*`` keys of any other launcher are left to Hydra.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from hpcsweep.sweep.hydra_private import parse_command_line

    parsed_args = parse_command_line(args)
    if parsed_args.shell_completion:
        return  # the "overrides" are completion queries
    parser = OverridesParser.create()
    checked = []
    launcher = DEFAULT_LAUNCHER
    for line in parsed_args.overrides or []:
        # Only the key is checked: parsing a thousand-value sweep's values takes Hydra's grammar 0.15 s.
        key_part = line.split("=", 1)[0] + "=" if "=" in line else line
        try:
            (override,) = parser.parse_overrides([key_part])
        except HydraException:
            continue
        if override.key_or_group == LAUNCHER_GROUP and "=" in line:
            launcher = line.split("=", 1)[1]
        if override.is_add() or override.is_force_add() or override.is_delete() or override.package is not None:
            continue
        checked.append(override.key_or_group)
    keys = trial_keys(parsed_args.overrides or [])
    for key in checked:
        message = unknown_key_message(key, keys)
        if message is None and key.startswith(LAUNCHER_PREFIX) and launcher_keys and launcher in launcher_keys:
            message = unknown_launcher_key_message(key, launcher, launcher_keys[launcher])
        if message:
            raise ValueError(message)
