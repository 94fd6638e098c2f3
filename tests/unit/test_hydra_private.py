"""What hpcsweep relies on in Hydra's private API (``hpcsweep.sweep.hydra_private``), pinned.

A Hydra upgrade that changes any of it fails here first.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.errors import ConfigCompositionException
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import RunMode
from omegaconf import OmegaConf

import hpcsweep.app  # noqa: F401  (registers the launchers and sweeper)
from hpcsweep.sweep.hydra_private import (
    apply_value_overrides,
    basic_launcher,
    basic_sweeper_class,
    is_config_group,
    parse_command_line,
)


def test_the_command_line_is_parsed_as_hydra_parses_it():
    parsed = parse_command_line(["-m", "--cfg", "job", "--unknown-flag", "model.lr=1,2", "hydra/launcher=local"])
    assert parsed.multirun and parsed.cfg == "job" and parsed.overrides == ["model.lr=1,2", "hydra/launcher=local"]
    plain = parse_command_line(["model.lr=1"])
    assert not any([plain.multirun, plain.cfg, plain.help, plain.hydra_help, plain.info, plain.shell_completion,
                    plain.experimental_rerun, plain.config_path, plain.config_name, plain.config_dir])
    assert parse_command_line(["-sc", "query=bash"]).shell_completion
    assert parse_command_line(["-cd", "/x", "-cn", "y"]).config_dir == "/x"


def loader():
    return ConfigLoaderImpl(config_search_path=create_config_search_path("pkg://hpcsweep.configs"))


def test_config_groups_are_told_from_keys():
    config_loader = loader()
    assert is_config_group(config_loader, "model") and is_config_group(config_loader, "hydra/launcher")
    assert not is_config_group(config_loader, "model.lr") and not is_config_group(config_loader, "resume")


def test_value_overrides_set_add_and_delete_as_after_composition():
    config = OmegaConf.create({"model": {"lr": 1.0, "arch": "llama"}, "topology": {"exclude": []}})
    OmegaConf.set_struct(config, True)  # as Hydra leaves a composed config
    overrides = OverridesParser.create().parse_overrides(
        ["model.lr=0.5", "+model.extra=1", "++model.arch=deepseek_v3", "~topology.exclude"]
    )
    apply_value_overrides(overrides, config)
    assert OmegaConf.to_container(config) == {"model": {"lr": 0.5, "arch": "deepseek_v3", "extra": 1}, "topology": {}}
    with pytest.raises(ConfigCompositionException, match="Could not override 'model.nosuch'"):
        apply_value_overrides(OverridesParser.create().parse_overrides(["model.nosuch=1"]), config)


def test_value_overrides_applied_to_a_composed_config_give_hydras_composition():
    config_loader = loader()
    master = config_loader.load_configuration("config", [], RunMode.MULTIRUN)
    composed = config_loader.load_sweep_config(master, [])
    apply_value_overrides(OverridesParser.create().parse_overrides(["model.lr=0.25", "trainer.nodes=2"]), composed)
    expected = config_loader.load_sweep_config(master, ["model.lr=0.25", "trainer.nodes=2"])
    assert OmegaConf.to_container(composed.model) == OmegaConf.to_container(expected.model)
    assert composed.trainer.nodes == expected.trainer.nodes == 2


def test_the_basic_sweeper_and_launcher_are_hydras_plugins_with_the_methods_used():
    sweeper = basic_sweeper_class()
    assert issubclass(sweeper, Sweeper) and callable(sweeper.sweep) and callable(sweeper.validate_batch_is_legal)
    launcher = basic_launcher()
    assert isinstance(launcher, Launcher) and callable(launcher.setup) and callable(launcher.launch)


def test_the_grid_sweeper_derives_from_the_basic_sweeper_hydras_scan_leaves():
    from hydra_plugins.hpcsweep_plugins.sweeper import GridSweeper

    Plugins.instance()  # the scan, which executes the core plugins' modules again
    assert issubclass(GridSweeper, basic_sweeper_class())


def test_no_other_module_uses_hydras_private_api():
    found = subprocess.run(
        ["grep", "-rln", "--include=*.py", r"hydra\._internal\|_apply_overrides_to_config", "hpcsweep", "hydra_plugins"],
        capture_output=True, text=True, cwd=__import__("pathlib").Path(__file__).resolve().parents[2],
    ).stdout.split()
    assert sorted(found) == ["hpcsweep/sweep/hydra_private.py"]
