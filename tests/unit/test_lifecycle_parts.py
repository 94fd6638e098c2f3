"""The pure parts of stopping and resuming: the resume command, key suggestions, sweep-dir cleanup."""

from __future__ import annotations

import pytest

from hpcsweep.config import config_keys, mapping_keys, unknown_key_message
from hpcsweep.sweep.override_keys import check_override_keys, unknown_launcher_key_message
from hpcsweep.sweep.resume_hint import resume_command, shown_dir
from hydra_plugins.hpcsweep_plugins.sweeper import missing_dirs, undo_sweep_dir


def test_the_resume_command_is_the_same_arguments_with_the_dir_pinned():
    argv = ["-m", "model.lr=1e-4,3e-4", "hydra.sweep.dir=old", "data.path=/a b"]
    assert resume_command(argv, "hydra.sweep.dir", "multirun/2026-01-01/10-00-00") == (
        "python -m hpcsweep -m model.lr=1e-4,3e-4 'data.path=/a b' hydra.sweep.dir=multirun/2026-01-01/10-00-00"
    )
    assert resume_command([], "hydra.run.dir", "outputs/x") == "python -m hpcsweep hydra.run.dir=outputs/x"


def test_a_dir_is_shown_relative_to_the_working_dir_only_below_it():
    assert shown_dir("multirun/a", "/home/u") == "multirun/a"
    assert shown_dir("/home/u/multirun/a", "/home/u") == "multirun/a"
    assert shown_dir("/scratch/a", "/home/u") == "/scratch/a"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("model.lrr", "model.lrr is not a config key; did you mean model.lr? (keys of model: arch, attn_implementation, dropout,"),
        ("trainer.max_step", "trainer.max_step is not a config key; did you mean trainer.max_steps?"),
        ("modle.lr", "modle.lr is not a config key; did you mean model.lr? (config groups: model, data,"),
        ("lr", "lr is not a config key; did you mean model.lr?"),
        ("model.zzzzzz", "model.zzzzzz is not a config key (keys of model: arch,"),
    ],
)
def test_an_unknown_key_names_the_closest_one(key, message):
    assert unknown_key_message(key, config_keys(), mapping_keys()).startswith(message)


@pytest.mark.parametrize("key", ["model.lr", "model", "resume.force", "nccl.overrides.NCCL_IB_HCA",
                                 "hydra.sweep.dir", "hydra/launcher"])
def test_known_keys_groups_and_hydras_own_pass(key):
    assert unknown_key_message(key, config_keys(), mapping_keys()) is None


def test_an_unknown_key_is_worded_the_same_on_the_command_line_and_in_a_composed_config():
    from hpcsweep.config import trial_config_from_dict

    with pytest.raises(ValueError) as on_the_command_line:
        check_override_keys(["-m", "model.lrr=1e-4"])
    with pytest.raises(ValueError) as composed:
        trial_config_from_dict({"model": {"lrr": 1e-4}})
    assert str(on_the_command_line.value) == str(composed.value) == unknown_key_message("model.lrr")


LAUNCHERS = {"auto": ["array_parallelism", "local_parallelism", "additional_parameters"],
             "local": ["local_parallelism", "_target_"]}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["hydra.launcher.array_paralellism=8"], "hydra.launcher.array_paralellism is not a key of the launcher; "
         "did you mean hydra.launcher.array_parallelism? (keys of the launcher: additional_parameters,"),
        (["hydra/launcher=local", "hydra.launcher.local_paralelism=2"], "hydra.launcher.local_paralelism is not a key "
         "of the local launcher; did you mean hydra.launcher.local_parallelism? (keys of the local launcher: "
         "local_parallelism)"),
        (["hydra.launcher.local_parallelism.x=2"], "hydra.launcher.local_parallelism.x is not a key of the launcher"),
    ],
)
def test_a_misspelt_launcher_key_names_the_closest_one_and_the_launcher_in_use(args, message):
    with pytest.raises(ValueError) as err:
        check_override_keys(["-m", *args], LAUNCHERS)
    assert str(err.value).startswith(message), str(err.value)


def test_known_launcher_keys_and_other_launchers_pass():
    check_override_keys(["-m", "hydra.launcher.array_parallelism=8", "hydra.launcher.additional_parameters.x=1",
                         "+hydra.launcher.nosuch=1"], LAUNCHERS)
    check_override_keys(["-m", "hydra/launcher=submitit_slurm", "hydra.launcher.anything=1"], LAUNCHERS)
    check_override_keys(["-m", "hydra.launcher.anything=1"])  # no launcher keys given: Hydra's business
    assert unknown_launcher_key_message("hydra.launcher.wait", "slurm", ["wait"]) is None


def test_hpcsweeps_launchers_are_named_by_their_option():
    from hydra_plugins.hpcsweep_plugins.config import launcher_keys

    keys = launcher_keys()
    assert set(keys) == {"auto", "slurm", "local", "hpcsweep_auto", "hpcsweep_slurm", "hpcsweep_local"}
    assert "array_parallelism" in keys["slurm"] and keys["local"] == ["_target_", "budget_gpu_hours", "local_parallelism", "start_method"]
    assert unknown_launcher_key_message("hydra.launcher.x", "hpcsweep_slurm", keys["slurm"]).startswith(
        "hydra.launcher.x is not a key of the Slurm launcher")


def test_only_plain_overrides_are_checked():
    check_override_keys(["-m", "+model.lrr=1", "~model.dropout", "++trainer.x=1", "model.lr=1e-4,3e-4", "--cfg", "job"])
    with pytest.raises(ValueError, match="did you mean model.lr"):
        check_override_keys(["-m", "model.lrr=1e-4,3e-4"])


def test_a_refused_sweep_takes_back_only_the_dirs_it_created(tmp_path):
    sweep_dir = tmp_path / "multirun" / "day" / "time"
    (tmp_path / "multirun").mkdir()
    created = missing_dirs(sweep_dir)
    assert created == [sweep_dir, sweep_dir.parent]
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "multirun.yaml").write_text("new")
    undo_sweep_dir(sweep_dir, created, None, refused=True)
    assert [p.name for p in tmp_path.iterdir()] == ["multirun"] and not list((tmp_path / "multirun").iterdir())


def test_a_refused_resume_puts_the_old_multirun_yaml_back_and_keeps_the_dir(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "multirun.yaml").write_text("new")
    undo_sweep_dir(tmp_path, [], b"old", refused=True)
    assert (tmp_path / "multirun.yaml").read_text() == "old" and (tmp_path / "0").is_dir()
    undo_sweep_dir(tmp_path, [], b"older", refused=False)
    assert (tmp_path / "multirun.yaml").read_text() == "old"
