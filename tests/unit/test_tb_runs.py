"""TensorBoard run dirs: named by the trial's overrides, safe as one directory, stable across resumes."""

from __future__ import annotations

from hpcsweep.files.tb_runs import (
    MAX_RUN_NAME,
    existing_run_dir,
    recorded_override_dirname,
    run_name,
    trial_run_dir,
)

from .tb_fixtures import log_scalars, write_hydra_record


def test_run_name_keeps_a_plain_override_dirname():
    assert run_name("model.lr=1e-4,trainer.nodes=2") == "model.lr=1e-4,trainer.nodes=2"
    assert run_name("model=llama_small,+trainer.seed=-3") == "model=llama_small,+trainer.seed=-3"
    assert run_name("") == ""


def test_run_name_is_one_safe_directory_name():
    assert run_name("data.path=/scratch/me/tokens.bin") == "data.path=_scratch_me_tokens.bin"
    assert run_name("model.betas=[0.9,0.95],x='a b'") == "model.betas=_0.9,0.95_,x=_a_b_"
    assert run_name("..") == "__"


def test_long_run_names_are_bounded_and_stay_apart():
    common = ",".join(f"model.key_{i}=value" for i in range(30))
    first, second = run_name(common + ",z=1"), run_name(common + ",z=2")
    assert len(first) == len(second) == MAX_RUN_NAME
    assert first != second and first.startswith("model.key_0=value,model.key_1=value")
    assert "/" not in first and run_name(common + ",z=1") == first


def test_recorded_override_dirname(tmp_path):
    assert recorded_override_dirname(tmp_path) == ""  # run outside Hydra
    write_hydra_record(tmp_path, "model.lr=1e-4")
    assert recorded_override_dirname(tmp_path) == "model.lr=1e-4"


def test_a_new_trial_writes_into_its_named_run_and_keeps_it_on_resume(tmp_path):
    write_hydra_record(tmp_path, "data.path=/d/x.bin,model.lr=1e-4")
    run_dir = trial_run_dir(tmp_path)
    assert run_dir == tmp_path / "tb" / "data.path=_d_x.bin,model.lr=1e-4"
    log_scalars(run_dir, "train/loss", [(1, 2.0)])
    # A requeue that records the overrides differently still writes where the trial started.
    write_hydra_record(tmp_path, "model.lr=1e-4")
    assert trial_run_dir(tmp_path) == run_dir == existing_run_dir(tmp_path)


def test_an_old_trial_keeps_writing_directly_into_tb(tmp_path):
    log_scalars(tmp_path / "tb", "train/loss", [(1, 2.0)])
    write_hydra_record(tmp_path, "model.lr=1e-4")
    assert trial_run_dir(tmp_path) == tmp_path / "tb" == existing_run_dir(tmp_path)


def test_a_trial_without_overrides_writes_into_tb(tmp_path):
    assert trial_run_dir(tmp_path) == tmp_path / "tb"
    write_hydra_record(tmp_path, "")
    assert trial_run_dir(tmp_path) == tmp_path / "tb"
    assert existing_run_dir(tmp_path) is None  # nothing logged yet
