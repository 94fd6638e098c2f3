"""Every use of Hydra's private API (``hydra._internal``), in one place.

Hydra's public API has no way to parse its command line without running it, to apply value
overrides to an already composed config, to ask whether a name is a config group, or to reuse
its basic sweeper and launcher. hpcsweep needs each of these, so they are wrapped here, and
``tests/unit/test_hydra_private.py`` pins the behaviour relied on: a Hydra upgrade that changes
it fails there, not in a user's sweep.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig

def parse_command_line(args: Sequence[str]) -> argparse.Namespace:
    """The arguments of a Hydra app's command line as Hydra reads them (``overrides``, ``multirun``,
    ``cfg``, ``help``, ``shell_completion``, ``config_dir``, ...); unknown flags are left to Hydra."""
    from hydra._internal.utils import get_args_parser

    parsed, _ = get_args_parser().parse_known_args(list(args))
    return parsed


def is_config_group(config_loader: ConfigLoader, name: str) -> bool:
    """Whether ``name`` is a config group of the app (``model``, ``hydra/launcher``), as Hydra's
    defaults list decides which overrides choose an option of a group."""
    assert isinstance(config_loader, ConfigLoaderImpl)
    return config_loader.repository.group_exists(name)


def apply_value_overrides(overrides: Sequence[Override], config: DictConfig) -> None:
    """Apply value overrides (``key=v``, ``+key=v``, ``++key=v``, ``~key``) to a composed config in
    place, exactly as Hydra does after composing; raises Hydra's ``ConfigCompositionException``."""
    ConfigLoaderImpl._apply_overrides_to_config(list(overrides), config)


def basic_sweeper_class() -> type:
    """Hydra's basic sweeper class, to subclass.

    Looked up when called: Hydra's plugin scan executes its core plugins' modules again, and a
    subclass must derive from the class that the scan left (``hpcsweep.app.register_plugins``).
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper


BASIC_LAUNCHER_MODULE = "hydra._internal.core_plugins.basic_launcher"
"""The module of Hydra's basic launcher, for a process that imports it ahead (the local fork server)."""


def basic_launcher() -> Any:
    """Hydra's basic launcher (one job at a time, in this process), not yet set up."""
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    return BasicLauncher()
