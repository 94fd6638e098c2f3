"""Which config changes a trial dir refuses on resume, and how the refusal reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpcsweep.config import ResumeConfig, trial_config_from_dict, trial_config_to_dict
from hpcsweep.sweep.prepare import PreparedTrial, SweepConfigError, check_resumes
from hpcsweep.trial.identity import ConfigMismatch, check_resume, config_differences

from .trial_dirs import trial_config


def differing_keys(stored: dict, now: dict) -> list[str]:
    return [d.key for d in config_differences(trial_config(stored), trial_config(now))]


@pytest.mark.parametrize("key", ["model.lr", "trainer.max_steps", "trainer.seed", "data.batch_size",
                                 "trainer.nproc_per_node", "trainer.early_stop_patience", "data.val_fraction"])
def test_what_changes_the_weights_or_the_data_order_is_refused(key):
    stored = trial_config({"trainer.nproc_per_node": 1})
    group, name = key.split(".")
    changed = {"trainer.nproc_per_node": 1, key: stored[group][name] * 2 + 1}
    assert differing_keys({"trainer.nproc_per_node": 1}, changed) == [key]


@pytest.mark.parametrize("key", ["trainer.log_every", "trainer.ckpt_every", "trainer.keep_top_k",
                                 "trainer.eval_every", "trainer.eval_batches", "nccl.pg_timeout_s",
                                 "topology.max_wait_min", "trainer.telemetry_every_s"])
def test_logging_checkpointing_transport_and_placement_may_change(key):
    assert differing_keys({}, {key: 7}) == []


def test_evaluation_settings_count_once_early_stopping_decides_the_end():
    assert differing_keys({"trainer.early_stop_patience": 2}, {"trainer.early_stop_patience": 2,
                                                               "trainer.eval_every": 7}) == ["trainer.eval_every"]


def test_auto_workers_match_any_count_until_a_node_resolves_them():
    assert differing_keys({"trainer.nproc_per_node": 4}, {"trainer.nproc_per_node": "auto"}) == []
    assert differing_keys({"trainer.nproc_per_node": 4}, {"trainer.nproc_per_node": 2}) == ["trainer.nproc_per_node"]


def trained_dir(path: Path, settings: dict) -> Path:
    (path / "checkpoints").mkdir(parents=True)
    (path / "checkpoints" / "step00000002-valinf.pt").write_bytes(b"")
    (path / "config.yaml").write_text(yaml.safe_dump(trial_config(settings)))
    return path


def test_the_refusal_lists_every_differing_key_with_both_values(tmp_path):
    trial_dir = trained_dir(tmp_path / "t", {"model.lr": 1e-4, "trainer.max_steps": 400})
    now = trial_config_from_dict({})
    with pytest.raises(ConfigMismatch) as err:
        check_resume(trial_dir, now, force=False)
    assert str(err.value) == (
        f"trial dir {trial_dir} was trained with a different config: model.lr=0.0001 (now 0.003), "
        "trainer.max_steps=400 (now 200); rerun with the same overrides, or add resume.force=true to "
        "resume it with the new config"
    )
    assert [d.key for d in check_resume(trial_dir, now, force=True)] == ["model.lr", "trainer.max_steps"]


def test_a_dir_without_a_checkpoint_has_nothing_to_resume(tmp_path):
    trial_dir = trained_dir(tmp_path / "t", {"model.lr": 1e-4})
    (trial_dir / "checkpoints" / "step00000002-valinf.pt").unlink()
    assert check_resume(trial_dir, trial_config_from_dict({}), force=False) == []
    assert check_resume(tmp_path / "new", trial_config_from_dict({}), force=False) == []


def test_a_sweep_is_checked_trial_by_trial_before_anything_runs(tmp_path):
    now = trial_config_from_dict({})
    trials = [
        PreparedTrial(0, ["model.lr=0.003"], trained_dir(tmp_path / "0", {}), now),
        PreparedTrial(1, ["model.lr=0.003"], trained_dir(tmp_path / "1", {"model.lr": 1e-4}), now),
        PreparedTrial(2, ["model.lr=0.003"], trained_dir(tmp_path / "2", {"model.lr": 1e-4}), now),
        PreparedTrial(3, ["model.lr=0.003"], tmp_path / "3", now),
    ]
    with pytest.raises(SweepConfigError) as err:
        check_resumes(trials)
    message = str(err.value)
    assert message.startswith(f"trial #1 (model.lr=0.003): trial dir {tmp_path / '1'} was trained with")
    assert message.endswith("(1 more of the 4 trials differ too)")
    forced = [PreparedTrial(t.num, t.overrides, t.trial_dir, t.config, ResumeConfig(force=True)) for t in trials]
    check_resumes(forced)
    assert trial_config_to_dict(now)["model"]["lr"] == 3e-3
