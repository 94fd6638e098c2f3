"""The fast sweep composer gives exactly what Hydra's own per-trial composition gives."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import setup_globals
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict

import hpcsweep.app  # noqa: F401  (registers the launchers and sweeper)
from hpcsweep.sweep.compose import SweepComposer, plain_override


def loader_and_master(*overrides: str):
    setup_globals()  # Hydra's resolvers, such as ${now:...}
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path("pkg://hpcsweep.configs"))
    master = loader.load_configuration("config", ["trainer.max_steps=5", *overrides], RunMode.MULTIRUN)
    return loader, master


def app_part(config):
    return {key: OmegaConf.to_container(value, resolve=True) for key, value in config.items() if key != "hydra"}


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.lr=0.001"],
        ["model=llama_small", "model.lr=0.002"],
        ["model.lr=0.003", "model=llama_small"],
        ["+model.extra=1"],
        ["model.lr=0.003", "trainer.nodes=2", "topology.exclude=[node1,node2]"],
        ["nccl=ethernet", "nccl.debug=true", "+nccl.overrides.NCCL_ALGO=Ring"],
        ["~topology.exclude"],
    ],
)
def test_same_config_as_hydra(overrides):
    loader, master = loader_and_master()
    composer = SweepComposer(loader, master)
    composer.compose_app(["model.lr=0.5"])  # a cached template must not leak into later trials
    assert app_part(composer.compose_app(overrides)) == app_part(loader.load_sweep_config(master, overrides))


def test_bad_override_raises_hydras_error():
    loader, master = loader_and_master()
    with pytest.raises(ConfigCompositionException, match="Could not override 'model.nosuch'"):
        SweepComposer(loader, master).compose_app(["model.nosuch=1"])


def test_trial_dirs_match_run_job():
    for subdir in ("${hydra.job.num}", "${hydra.job.override_dirname}"):
        loader, master = loader_and_master(f"hydra.sweep.subdir={subdir}", "hydra.sweep.dir=/sweeps/s1")
        composer = SweepComposer(loader, master)
        overrides = ["model.lr=0.25", "trainer.nodes=2"]
        full = loader.load_sweep_config(master, overrides)
        with open_dict(full.hydra.job):
            full.hydra.job.num = 7
        expected = Path("/sweeps/s1") / str(full.hydra.sweep.subdir)
        assert composer.trial_dir(overrides, 7) == expected
    assert SweepComposer(*loader_and_master("hydra.sweep.dir=/s")).trial_dir(["model.lr=1"], 3) == Path("/s/3")


@pytest.mark.parametrize(
    "value",
    ["1", "-3", "+0", "0", "007", "1_000", "1e-05", "3E4", "-1.5e+3", ".5", "1.", "2.50", "inf", "-inf", "NaN",
     "true", "False", "TRUE", "null", "NULL", "adamw", "llama_small", "a1_b2", "x-y", "a/b", "'q'", "[1,2]",
     "1,2", "${model.lr}", "", " 1", "1 "],
)
def test_plain_override_reads_values_as_hydra_does(value):
    line = f"model.lr={value}"
    found = plain_override(line)
    if found is not None:
        (override,) = OverridesParser.create().parse_overrides([line])
        assert found == ("model.lr", override.value())
        assert type(found[1]) is type(override.value())


def test_plain_override_leaves_every_other_kind_to_hydra():
    for line in ["+model.extra=1", "~model.lr", "++model.lr=1", "model=llama_small,llama_tiny", "model.lr=1,2",
                 "model.lr=range(1,3)", "hydra/launcher=slurm", "db@x.y=1", "model.lr='1'"]:
        assert plain_override(line) is None


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.lr=0.001"],
        ["model.lr=1e-05", "trainer.max_steps=7", "trainer.deterministic=true", "trainer.precision=fp32"],
        ["model=llama_small", "model.lr=0.002"],
        ["+model.extra=1"],
        ["topology.exclude=[node1,node2]"],
        ["model.lr=0.003", "model.lr=0.004"],
    ],
)
def test_values_fast_way_equal_hydras(overrides):
    loader, master = loader_and_master()
    composer = SweepComposer(loader, master)
    composer.compose_values(["model.lr=0.5"])  # a cached template must not leak into later trials
    assert composer.compose_values(overrides) == app_part(loader.load_sweep_config(master, overrides))


def test_values_of_an_unknown_key_raise_hydras_error():
    loader, master = loader_and_master()
    with pytest.raises(ConfigCompositionException, match="Could not override 'model.nosuch'"):
        SweepComposer(loader, master).compose_values(["model.nosuch=1"])
