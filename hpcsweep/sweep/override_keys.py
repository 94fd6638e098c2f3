"""Catch a misspelt config key on the command line and name the closest known one.

Hydra answers ``model.lrr=1e-3`` with "To append to your config use +model.lrr=1e-3", which is the
wrong advice for a typo. Every key a trial accepts is a field of a dataclass in
``hpcsweep.config``, so the check needs no composition: it runs before Hydra starts.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence

from hpcsweep.config import config_keys, mapping_keys

# Hydra's own namespace and config-group choices are Hydra's business.
_SKIPPED_PREFIXES = ("hydra.", "hydra/")


def unknown_key_message(key: str, keys: Mapping[str, Sequence[str]], free_mappings: Iterable[str]) -> str | None:
    """Why ``key`` (from ``key=value``) is not a config key, with the closest one; None when it is one.

    ``keys`` maps each group to its keys; under a key in ``free_mappings`` (``nccl.overrides``)
    any sub-key is left to Hydra.
    """
    if key == "hydra" or key.startswith(_SKIPPED_PREFIXES) or "/" in key:
        return None
    group, _, rest = key.partition(".")
    if not rest and group in keys:
        return None  # a config-group choice: model=llama_small
    if group in keys and rest.split(".")[0] in keys[group]:
        first = f"{group}.{rest.split('.')[0]}"
        if "." not in rest or first in free_mappings:
            return None
    dotted = [f"{g}.{name}" for g, names in keys.items() for name in names]
    last = key.rsplit(".", 1)[-1]
    guesses = [k for k in dotted if k.rsplit(".", 1)[-1] == last]
    if not guesses and group in keys:
        # Within a known group compare the names alone: a shared "model." would match anything.
        guesses = [f"{group}.{name}" for name in difflib.get_close_matches(rest, keys[group], n=1)]
    elif not guesses:
        guesses = difflib.get_close_matches(key, dotted, n=1)
    hint = f"; did you mean {guesses[0]}?" if guesses else ""
    scope = (
        f"keys of {group}: " + ", ".join(keys[group]) if group in keys else "config groups: " + ", ".join(keys)
    )
    return f"{key} is not a config key{hint} ({scope})"


def check_override_keys(args: Sequence[str]) -> None:
    """Raise ``ValueError`` for the first plain ``key=value`` override whose key no trial has.

    ``args`` are the command's arguments; flags and unparsable overrides are left to Hydra, and so
    are ``+key=``, ``++key=`` and ``~key`` (appending and deleting are deliberate).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from hpcsweep.sweep.hydra_private import parse_command_line

    parsed_args = parse_command_line(args)
    if parsed_args.shell_completion:
        return  # the "overrides" are completion queries
    parser = OverridesParser.create()
    keys, free = config_keys(), mapping_keys()
    for line in parsed_args.overrides or []:
        # Only the key is checked: parsing a thousand-value sweep's values takes Hydra's grammar 0.15 s.
        key_part = line.split("=", 1)[0] + "=" if "=" in line else line
        try:
            (override,) = parser.parse_overrides([key_part])
        except HydraException:
            continue
        if override.is_add() or override.is_force_add() or override.is_delete() or override.package is not None:
            continue
        message = unknown_key_message(override.key_or_group, keys, free)
        if message:
            raise ValueError(message)
