"""A model folder that cannot train is refused in one line before anything is queued, and a sweep whose
model folder changed since its trials trained is refused on resubmission, naming the change (#22)."""

from __future__ import annotations

import json
import shutil

import pytest

from hpcsweep.model.folder import model_identity, read_model_folder

from .conftest import SMALL_TRIAL, all_job_ids, read_json, run_hpcsweep, submitted_from, wait_until_ended
from .test_refused_requests import assert_refused, queued_job_ids


def edit_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    from tests.model_folders import make_model_folder

    return make_model_folder(tmp_path_factory.mktemp("models") / "tiny-deepseek")


@pytest.fixture(scope="module")
def bad_folders(model_folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-models")
    remote = shutil.copytree(model_folder, root / "remote-code")
    edit_config(remote, model_type="deepseek", auto_map={"AutoModelForCausalLM": "modeling_deepseek.DeepseekForCausalLM"})
    no_tokenizer = shutil.copytree(model_folder, root / "no-tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    return {"good": model_folder, "remote": remote, "no_tokenizer": no_tokenizer, "missing": root / "no-such-model"}


@pytest.mark.parametrize(
    ("folder", "overrides", "message"),
    [
        ("missing", [], "model.path={path} is not allowed: no such folder; nothing was submitted"),
        ("remote", [], "model.trust_remote_code=false is not allowed: model.path={path} ships its own model code"),
        ("no_tokenizer", [], "model.path={path} is not allowed: it has no tokenizer"),
        ("good", ["data.seq_len=300"],
         "data.seq_len=300 is not allowed: at most 256, the max_position_embeddings of model.path={path}; "
         "nothing was submitted"),
    ],
    ids=["missing", "remote_code", "no_tokenizer", "seq_len"],
)
def test_a_model_folder_that_cannot_train_is_refused_before_submit(tmp_path, slurm_env, bad_folders, folder, overrides,
                                                                  message):
    path = bad_folders[folder]
    before, queued = all_job_ids(slurm_env), queued_job_ids(slurm_env)
    result = run_hpcsweep(["-m", "model=pretrained", f"model.path={path}", "model.lr=1e-4,3e-4", *overrides],
                          tmp_path, slurm_env, timeout=120)
    assert_refused(result, message.format(path=path))
    output = result.stdout + result.stderr
    assert "launcher: slurm" in output and len([line for line in output.splitlines() if "is not allowed" in line]) == 1
    assert not submitted_from(slurm_env, tmp_path, before)
    assert queued_job_ids(slurm_env) <= queued  # nothing new; a job queued before may have ended since
    assert not (tmp_path / "multirun").exists()


def test_a_sweep_resubmitted_after_its_model_folder_changed_is_refused_naming_the_change(tmp_path, slurm_env,
                                                                                         model_folder):
    folder = shutil.copytree(model_folder, tmp_path / "model")
    sweep_dir = tmp_path / "sweep"
    command = ["-m", "model=pretrained", f"model.path={folder}", "data=synthetic", "model.lr=1e-4", *SMALL_TRIAL,
               "topology.mode=off",
               f"hydra.sweep.dir={sweep_dir}"]
    result = run_hpcsweep(command, tmp_path, slurm_env, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    record = read_json(sweep_dir / "sweep.json")
    identity = model_identity(read_model_folder(str(folder)))
    assert record["app"]["models"] == {str(folder): identity}
    (trial,) = record["trials"]
    assert wait_until_ended(slurm_env, trial["job_id"]) == "COMPLETED"
    assert read_json(sweep_dir / "0" / "environment.json")["model"] == identity
    assert read_json(sweep_dir / "0" / "metrics.json")["status"] == "completed"

    edit_config(folder, initializer_range=0.5)
    before, queued = all_job_ids(slurm_env), queued_job_ids(slurm_env)
    refused = run_hpcsweep(command, tmp_path, slurm_env, timeout=120)
    assert_refused(refused, f"model.path={folder} changed since the trial trained from it: "
                            "config.json initializer_range=0.02 (now 0.5)")
    assert "nothing was submitted" in refused.stdout + refused.stderr
    assert not submitted_from(slurm_env, tmp_path, before)
    assert queued_job_ids(slurm_env) <= queued
