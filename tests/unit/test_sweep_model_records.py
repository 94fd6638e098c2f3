"""The login node reads a sweep's model folder once (issue 30, item 7): the pretrained-model check of
every trial, the resume check, the memory plan at submit and ``sweep.json``'s identities all read one
record, made on the first trial that needs it (``hpcsweep.sweep.model_records``). A second sweep in the
same process reads the folder again, since it may have changed in between.

Opens are counted by Python's ``open`` audit event (``tests/folder_reads.py``): a fingerprint of the
weights opens ``model.safetensors`` twice (its header, then its data samples).
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import yaml

import hpcsweep.app
from hpcsweep.config import trial_config_to_dict
from hpcsweep.model.record import read_model_record
from hpcsweep.sweep import plan_preview
from hpcsweep.sweep.hooks import hook_of
from hpcsweep.sweep.sweep_trials import SweepConfigError, check_trials

from ..folder_reads import opens_in
from .test_launcher_hooks import SLURM, launcher

ONE_READ = {"config.json": 1, "model.safetensors": 2}
"""config.json read once, the weights fingerprinted once: the whole of a sweep's reads of its folder."""
GRES = ["gpu:a100:8(S:0-1)"]


def trial_overrides(folder) -> list[list[str]]:
    """Three trials of one pretrained folder, the same as ``python -m hpcsweep -m model=pretrained
    model.path=FOLDER data=synthetic model.lr=1e-4,2e-4,3e-4`` expands to."""
    return [["model=pretrained", f"model.path={folder}", "data=synthetic", f"model.lr={lr}"]
            for lr in ("1e-4", "2e-4", "3e-4")]


def login_node_checks(folder, sweep_dir):
    """What ``launch_on_slurm`` does before it submits, in its order, through hpcsweep's own hook (the one
    ``python -m hpcsweep`` uses, which lives as long as the process): every trial composed and checked,
    the sweep checked (its resumes), each trial's memory plan against the partition's GPUs, and the
    facts ``sweep.json`` records. Returns the trials, the facts and the opens in ``folder``."""
    app = launcher("pkg://hpcsweep.configs", [f"hydra.sweep.dir={sweep_dir}"], **{**SLURM, "gpus_per_node": 1})
    hook = hook_of(hpcsweep.app.hydra_main)
    with opens_in(folder) as opened:
        trials = check_trials(app, trial_overrides(folder), 0, hook)
        hook.check_cluster(trials, app.params, GRES)
        facts = hook.sweep_facts(trials)
    return trials, facts, dict(opened)


def trained(trials, identity) -> None:
    """Each trial dir as an attempt leaves it: its config, a checkpoint, and the folder it trained from."""
    for trial in trials:
        (trial.trial_dir / "checkpoints").mkdir(parents=True)
        (trial.trial_dir / "checkpoints" / "step00000002-valinf.pt").write_bytes(b"")
        (trial.trial_dir / "config.yaml").write_text(yaml.safe_dump(trial_config_to_dict(trial.app_config[0])))
        (trial.trial_dir / "environment.json").write_text(json.dumps({"model": identity}))


def test_a_sweep_reads_its_model_folder_once_for_every_trial_and_the_next_sweep_reads_it_again(
    model_folders, tmp_path, caplog
):
    folder = shutil.copytree(model_folders["single"], tmp_path / "model")
    identity = read_model_record(str(folder)).identity
    with caplog.at_level(logging.INFO, logger="hpcsweep.sweep.memory_check"):
        trials, facts, opened = login_node_checks(folder, tmp_path / "sweep")
    # Before the sweep's record: config.json 7 times (each trial's check and plan, and sweep.json's identity).
    assert opened == ONE_READ
    assert len(trials) == 3 and facts == {"models": {str(folder): identity}}
    # Every trial was planned from the record: one plan line for the three.
    assert "memory plan: trials #0-2: " in caplog.text and "not checked" not in caplog.text

    # The next sweep in this process, over the same dirs, now trained: it resumes them, and its resume
    # check compares each dir with the folder as this sweep reads it, again once.
    trained(trials, identity)
    resumed, facts, opened = login_node_checks(folder, tmp_path / "sweep")
    # Before: config.json 8 times, and 2 fingerprints (the resume check's and sweep.json's).
    assert opened == ONE_READ
    assert [t.trial_dir for t in resumed] == [t.trial_dir for t in trials] and facts == {"models": {str(folder): identity}}

    # Changed since: the third sweep sees it (a record kept from the last sweep would not), in every trial.
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "initializer_range": 0.5}))
    with pytest.raises(SweepConfigError) as refused:
        login_node_checks(folder, tmp_path / "sweep")
    assert "config.json initializer_range=0.02 (now 0.5)" in str(refused.value)
    assert str(refused.value).endswith("(2 more of the 3 trials differ too)")


def test_python_m_hpcsweep_plan_reads_the_folder_once_for_every_trial(model_folders, tmp_path, monkeypatch):
    folder = shutil.copytree(model_folders["single"], tmp_path / "model")
    monkeypatch.setattr(plan_preview, "partition_gres", lambda params: GRES)  # sinfo's answer
    arguments = ["-m", "model=pretrained", f"model.path={folder}", "data=synthetic", "model.lr=1e-4,2e-4,3e-4",
                 "hydra.launcher.gpus_per_node=1"]
    with opens_in(folder) as opened:
        lines = plan_preview.plan_preview(arguments)
    # Before: config.json 6 times (each trial's check, then its plan) and no fingerprint.
    assert dict(opened) == ONE_READ
    assert lines[0].startswith("trials #0-2: ") and lines[-1].endswith("fits"), lines
    with opens_in(folder) as opened:
        plan_preview.plan_preview(arguments)
    assert dict(opened) == ONE_READ  # a second command in this process reads the folder again


def test_the_same_launcher_checking_more_trials_is_the_same_sweep(model_folders, tmp_path):
    # A search checks its space, then each batch; a retry checks its trials one by one: one launcher, one read.
    folder = shutil.copytree(model_folders["single"], tmp_path / "model")
    app = launcher("pkg://hpcsweep.configs", [f"hydra.sweep.dir={tmp_path / 'sweep'}"], **{**SLURM, "gpus_per_node": 1})
    hook = hook_of(hpcsweep.app.hydra_main)
    first, second, third = trial_overrides(folder)
    with opens_in(folder) as opened:
        check_trials(app, [first], 0, hook)
        later = check_trials(app, [second, third], 1, hook)
        hook.check_cluster(later, app.params, GRES)
        facts = hook.sweep_facts(later)
    assert dict(opened) == ONE_READ
    assert [t.num for t in later] == [1, 2] and list(facts["models"]) == [str(folder)]
