"""Fine-tuning needs data: a model folder on the default synthetic corpus is refused before anything runs,
naming data=text and data=file; an explicit data=synthetic (a smoke run) or model.random_init=true keeps it
(issue 31, item 1)."""

from __future__ import annotations

import pytest

from hpcsweep.sweep.fine_tune_data import asks_for_synthetic
from hpcsweep.sweep.hpcsweep_hook import HpcsweepTrials
from hpcsweep.sweep.single_run import check_single_run
from hpcsweep.sweep.sweep_trials import SweepConfigError, check_trials

from .test_launcher_hooks import SLURM, launcher


def refusal(folder) -> str:
    return (f"data=synthetic (the default) is not allowed with model.path={folder}: its pretrained weights would "
            "fine-tune on random tokens; give it your text (data=text data.files='corpus/*.txt') or a token file "
            "(data=file data.path=FILE.bin), or say data=synthetic on the command line for a smoke run")


def test_a_single_run_of_a_folder_without_data_is_refused_and_an_explicit_smoke_run_is_not(model_folders):
    folder = model_folders["single"]
    with pytest.raises(ValueError) as info:
        check_single_run(["model=pretrained", f"model.path={folder}"])
    assert str(info.value) == refusal(folder)
    trial, _ = check_single_run(["model=pretrained", f"model.path={folder}", "data=synthetic"])
    assert (trial.data.kind, trial.model.path) == ("synthetic", str(folder))
    trial, _ = check_single_run(["model=pretrained", f"model.path={folder}", "model.random_init=true"])
    assert trial.model.random_init
    assert check_single_run(["model.lr=0.01"])[0].data.kind == "synthetic"  # the built-in model: no folder, no refusal


def test_a_sweep_of_a_folder_without_data_is_refused_before_any_trial(model_folders):
    folder = model_folders["single"]
    app = launcher("pkg://hpcsweep.configs", **SLURM)
    base = ["model=pretrained", f"model.path={folder}"]
    with pytest.raises(SweepConfigError) as info:
        check_trials(app, [[*base, "model.lr=1e-4"], [*base, "model.lr=3e-4"]], 0, HpcsweepTrials())
    assert str(info.value) == f"trial #0 (model=pretrained model.path={folder} model.lr=1e-4): {refusal(folder)}"
    trials = check_trials(app, [[*base, "data=synthetic", "model.lr=1e-4"]], 0, HpcsweepTrials())
    assert trials[0].app_config[0].data.kind == "synthetic"


@pytest.mark.parametrize("overrides, asked", [
    (["data=synthetic"], True), (["data.kind=synthetic"], True), (["+data=synthetic"], True),
    (["data=text"], False), (["model.lr=1"], False), ([], False), (["data.synthetic_tokens=9"], False),
])
def test_what_counts_as_asking_for_the_synthetic_corpus(overrides, asked):
    assert asks_for_synthetic(overrides) is asked


def test_the_typo_hint_of_a_folder_command_offers_no_size_key_the_folder_refuses():
    from hpcsweep.sweep.override_keys import check_override_keys

    with pytest.raises(ValueError) as built_in:
        check_override_keys(["-m", "model.hiden_size=512"])
    assert str(built_in.value).startswith("model.hiden_size is not a config key; did you mean model.hidden_size?")
    with pytest.raises(ValueError) as folder:
        check_override_keys(["-m", "model=pretrained", "model.path=/m", "model.hiden_size=512"])
    message = str(folder.value)
    assert message.startswith("model.hiden_size is not a config key") and "did you mean model.hidden_size" not in message
    listed = message.split("(keys of model: ", 1)[1]
    assert "lr" in listed.split(", ") and "path" in listed.split(", ")
    assert not {"hidden_size", "vocab_size", "num_layers", "arch"} & set(listed.rstrip(")").split(", "))
