"""The dataclasses hold every default; the YAML files of ``configs/`` hold presets only.

A YAML value equal to the default it stands on repeats it (and would silently contradict it once
the default changes): it is refused here. A preset that changes a default on purpose differs, and
that is allowed. The config a bare ``python -m hpcsweep`` runs is the dataclass defaults, exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

import hpcsweep.app  # noqa: F401  (stores the launcher configs)
import hpcsweep.configs
from hpcsweep.config import config_defaults, config_keys, trial_config_from_dict

CONFIGS = Path(hpcsweep.configs.__file__).parent
TRIAL_GROUPS = ("model", "data", "trainer", "nccl", "topology", "tasks", "objective")


def repeated_defaults(values: Mapping[str, Any], base: Mapping[str, Any], where: str) -> list[str]:
    """Every ``key: value`` of ``values`` (but ``defaults``) equal to what ``base`` already gives."""
    return [
        f"{where}: {key}: {value!r} repeats the default"
        for key, value in values.items()
        if key != "defaults" and key in base and base[key] == value
    ]


def test_the_check_catches_a_repeat_and_allows_a_change():
    assert repeated_defaults({"lr": 3e-3, "arch": "llama"}, {"lr": 3e-3, "arch": "deepseek_v3"}, "m.yaml") == [
        "m.yaml: lr: 0.003 repeats the default"
    ]
    assert repeated_defaults({"defaults": ["x"], "lr": 1e-4}, {"lr": 3e-3}, "m.yaml") == []


def yaml_values(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("group", TRIAL_GROUPS)
def test_trial_presets_only_change_dataclass_defaults(group):
    defaults, keys = config_defaults()[group], config_keys()[group]
    presets = sorted((CONFIGS / group).glob("*.yaml"))
    assert presets
    for path in presets:
        values = yaml_values(path)
        assert set(values) <= set(keys), f"{path.name}: keys {sorted(set(values) - set(keys))} are no {group} keys"
        assert repeated_defaults(values, defaults, f"{group}/{path.name}") == []


def launcher_node(name: str) -> dict[str, Any]:
    """A launcher option as Hydra composes it: its defaults list, then its own values."""
    store = ConfigStore.instance()
    stored = store.repo["hydra"]["launcher"].get(f"{name}.yaml")
    if stored is not None:
        return OmegaConf.to_container(OmegaConf.create(stored.node))
    values = yaml_values(CONFIGS / "hydra" / "launcher" / f"{name}.yaml")
    node: dict[str, Any] = {}
    for parent in values.get("defaults", []):
        if parent != "_self_":
            node.update(launcher_node(parent))
    node.update({key: value for key, value in values.items() if key != "defaults"})
    return node


@pytest.mark.parametrize("option", ["auto", "slurm", "local"])
def test_launcher_presets_only_change_what_they_stand_on(option):
    values = yaml_values(CONFIGS / "hydra" / "launcher" / f"{option}.yaml")
    base: dict[str, Any] = {}
    for parent in values["defaults"]:
        if parent != "_self_":
            base.update(launcher_node(parent))
    assert set(values) - {"defaults"} <= set(base), f"{option}.yaml sets keys its launcher does not have"
    assert repeated_defaults(values, base, f"hydra/launcher/{option}.yaml") == []


def test_the_root_config_holds_no_trial_values():
    assert set(yaml_values(CONFIGS / "config.yaml")) == {"defaults", "hydra"}


def compose(*overrides: str) -> dict[str, Any]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module(config_module="hpcsweep.configs", version_base="1.3"):
        return OmegaConf.to_container(hydra_compose(config_name="config", overrides=list(overrides)))


def test_a_bare_command_runs_exactly_the_dataclass_defaults():
    composed = compose()
    assert composed == config_defaults()
    assert trial_config_from_dict(composed) == trial_config_from_dict({})


@pytest.mark.parametrize(
    "choice",
    [f"{group}={path.stem}" for group in TRIAL_GROUPS for path in sorted((CONFIGS / group).glob("*.yaml"))],
)
def test_every_preset_composes_into_a_valid_trial(choice):
    group, option = choice.split("=")
    path = {
        "data=file": {"path": "corpus.bin"},
        "data=text": {"files": "corpus/*.txt", "tokenizer": "tokenizer"},
        "data=chat": {"files": "sft/*.jsonl", "tokenizer": "tokenizer"},
        "data=preference": {"files": "pairs/*.jsonl", "tokenizer": "tokenizer"},
        "model=pretrained": {"path": "/shared/models/x"},
    }.get(choice, {})
    # Presets that only make a trial together: DPO trains on preference pairs, and those only with DPO.
    partner = {
        "data=preference": ["objective=dpo"],
        "objective=dpo": ["data=preference", "data.files=pairs/*.jsonl", "data.tokenizer=tokenizer"],
    }.get(choice, [])
    composed = compose(choice, *(f"{group}.{key}={value}" for key, value in path.items()), *partner)
    assert composed[group] == {**config_defaults()[group], **yaml_values(CONFIGS / group / f"{option}.yaml"), **path}
    trial_config_from_dict(composed)



@pytest.mark.parametrize("kind", ["file", "text", "chat", "preference"])
def test_a_data_preset_packs_as_its_kind_resolves_a_null_data_packing(kind):
    """The composed defaults carry data.packing as the synthetic default resolved it (false), so a preset whose kind
    packs must say so: data=preference trained one padded sequence a row from the command line, though the docs
    (and DataConfig's null) said packed."""
    from hpcsweep.config import DataConfig

    source = {"path": "corpus.bin"} if kind == "file" else {"files": "x/*.jsonl", "tokenizer": "tokenizer"}
    partner = ["objective=dpo"] if kind == "preference" else []
    composed = compose(f"data={kind}", *(f"data.{key}={value}" for key, value in source.items()), *partner)
    assert trial_config_from_dict(composed).data.packing == DataConfig(kind=kind, **source).packing
    assert trial_config_from_dict(composed).data.packing is (kind in ("chat", "preference"))


def test_the_slurm_launcher_config_extends_submitits_and_redeclares_only_what_it_changes():
    from dataclasses import fields

    from hydra_plugins.hpcsweep_plugins.config import AutoLauncherConf, SlurmLauncherConf

    # By name: Hydra's plugin scan executes submitit's config module again, making a new class.
    SlurmQueueConf = SlurmLauncherConf.__mro__[1]
    assert (SlurmQueueConf.__module__, SlurmQueueConf.__name__) == (
        "hydra_plugins.hydra_submitit_launcher.config", "SlurmQueueConf")
    assert issubclass(AutoLauncherConf, SlurmLauncherConf)
    submitits = {f.name: f.default for f in fields(SlurmQueueConf)}
    redeclared = sorted(name for name in vars(SlurmLauncherConf)["__annotations__"] if name in submitits)
    assert redeclared == ["_target_", "max_num_timeout", "timeout_min"]
    ours = {f.name: f.default for f in fields(SlurmLauncherConf)}
    assert all(ours[name] != submitits[name] for name in redeclared)
