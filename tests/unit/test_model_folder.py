"""A pretrained model folder is checked on the login node without torch: each refusal is one line naming the key,
and its identity changes with its weights, not with an mtime (#22)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from hpcsweep.config import trial_config_from_dict, trial_config_to_dict
from hpcsweep.model.folder import (
    identity_changes,
    known_causal_lm_types,
    model_identity,
    read_model_folder,
    safetensors_header,
)
from hpcsweep.sweep.prepare import validate_composed
from hpcsweep.train.data.corpora import write_token_file
from hpcsweep.trial.identity import ConfigMismatch, ModelChange, check_resume, mismatch_message, resume_differences

REPO = Path(__file__).resolve().parents[2]


def copy_of(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def validate(path: Path | str, model: dict | None = None, data: dict | None = None):
    return validate_composed({"model": {"path": str(path), **(model or {})}, "data": data or {}})


def refusal(path: Path | str, model: dict | None = None, data: dict | None = None) -> str:
    with pytest.raises(ValueError) as info:
        validate(path, model, data)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_folder_as_save_pretrained_writes_it_passes_and_the_folders_vocabulary_counts(model_folders, tmp_path):
    for folder in model_folders.values():
        trial = validate(folder)
        assert trial.model.path == str(folder)
    # The built-in model.vocab_size (256) does not bound a token file of the folder's tokenizer (384 ids).
    write_token_file(tmp_path / "t.bin", np.arange(5000) % 300, 300, "tokenizer.json")
    validate(model_folders["single"], data={"kind": "file", "path": str(tmp_path / "t.bin")})
    write_token_file(tmp_path / "big.bin", np.arange(5000) % 500, 500, "other")
    message = refusal(model_folders["single"], data={"kind": "file", "path": str(tmp_path / "big.bin")})
    assert message.startswith(f"model.path={model_folders['single']}: vocab_size=384 is not allowed: ")
    assert "needs at least 500" in message


def test_a_missing_path_no_config_and_no_tokenizer_are_refused(model_folders, tmp_path):
    assert refusal(tmp_path / "nope") == f"model.path={tmp_path / 'nope'} is not allowed: no such folder"
    no_config = copy_of(model_folders["single"], tmp_path / "no-config")
    (no_config / "config.json").unlink()
    assert refusal(no_config).startswith(f"model.path={no_config} is not allowed: it holds no config.json")
    no_tokenizer = copy_of(model_folders["single"], tmp_path / "no-tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    assert refusal(no_tokenizer).startswith(f"model.path={no_tokenizer} is not allowed: it has no tokenizer")


def test_weights_a_config_only_folder_a_missing_shard_and_pickles(model_folders, tmp_path):
    config_only = copy_of(model_folders["single"], tmp_path / "config-only")
    (config_only / "model.safetensors").unlink()
    message = refusal(config_only)
    assert message.startswith(f"model.path={config_only} is not allowed: it has no weights")
    assert "model.random_init=true" in message
    assert validate(config_only, {"random_init": True}).model.random_init

    sharded = copy_of(model_folders["sharded"], tmp_path / "sharded")
    (sharded / "model-00002-of-00006.safetensors").unlink()
    assert refusal(sharded) == (
        f"model.path={sharded} is not allowed: its model.safetensors.index.json names 1 shard(s) that are not "
        "there: model-00002-of-00006.safetensors; finish the download"
    )

    pickled = copy_of(config_only, tmp_path / "pickled")
    (pickled / "pytorch_model.bin").write_bytes(b"a pickle")
    assert "pytorch_model.bin pickles, not safetensors" in refusal(pickled)


def test_unknown_architectures_and_remote_code(model_folders, tmp_path):
    unknown = copy_of(model_folders["single"], tmp_path / "unknown")
    edit_config(unknown, model_type="not_a_model")
    assert refusal(unknown).startswith(
        f"model.path={unknown} is not allowed: its config.json model_type='not_a_model' is not a causal LM architecture"
    )
    remote = copy_of(model_folders["single"], tmp_path / "remote")
    edit_config(remote, model_type="deepseek", auto_map={"AutoModelForCausalLM": "modeling_deepseek.DeepseekForCausalLM"})
    assert refusal(remote) == (
        f"model.trust_remote_code=false is not allowed: model.path={remote} ships its own model code (config.json "
        "auto_map: AutoModelForCausalLM -> modeling_deepseek.DeepseekForCausalLM); add model.trust_remote_code=true "
        "to run it on the compute nodes"
    )
    assert validate(remote, {"trust_remote_code": True}).model.trust_remote_code


def test_model_pretrained_without_a_path_is_refused():
    from hpcsweep.sweep.single_run import check_single_run

    with pytest.raises(ValueError) as info:
        check_single_run(["model=pretrained"])
    assert str(info.value) == (
        "model.path='' is not allowed: a Hugging Face model folder (model=pretrained "
        "model.path=/shared/models/NAME), or null for the built-in model"
    )


def test_seq_len_beyond_the_folders_positions_and_a_size_key_beside_the_path(model_folders):
    folder = model_folders["single"]
    assert refusal(folder, data={"seq_len": 300}) == (
        f"data.seq_len=300 is not allowed: at most 256, the max_position_embeddings of model.path={folder}"
    )
    # The built-in default is 512: with a path only the folder's 256 counts, either way.
    assert validate(folder, data={"seq_len": 256}).data.seq_len == 256
    assert refusal(folder, {"hidden_size": 512}).startswith(
        f"model.hidden_size=512 is not allowed: its default (128) with model.path={folder}: the architecture comes "
        "from the folder's config.json"
    )


def test_the_known_architectures_are_transformers_own_and_the_checks_import_no_torch(model_folders):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert known_causal_lm_types() == set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert {"deepseek_v3", "deepseek_v2", "llama"} <= known_causal_lm_types()
    probe = (
        "import sys, time; start = time.perf_counter()\n"
        "from hpcsweep.sweep.prepare import validate_composed\n"
        f"validate_composed({{'model': {{'path': {str(model_folders['sharded'])!r}}}}})\n"
        "from hpcsweep.trial.identity import trial_model_identity\n"
        f"trial_model_identity(validate_composed({{'model': {{'path': {str(model_folders['sharded'])!r}}}}}))\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'transformers'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_identity_follows_the_weights_not_the_path_or_the_mtime(model_folders, tmp_path):
    original = model_identity(read_model_folder(str(model_folders["single"])))
    assert set(original) == {"path", "config", "weights", "fingerprint_sha256"}
    assert original["weights"] == {"model.safetensors": (model_folders["single"] / "model.safetensors").stat().st_size}
    copy = copy_of(model_folders["single"], tmp_path / "copy")
    os.utime(copy / "model.safetensors", (1, 1))
    assert identity_changes(original, model_identity(read_model_folder(str(copy)))) == []

    # Retrained weights of the same shapes: the same header and size, other tensor data.
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    weights = copy / "model.safetensors"
    with safe_open(str(weights), "pt") as handle:
        metadata = handle.metadata()
    header = safetensors_header(weights)
    save_file({name: t + 1 for name, t in load_file(str(weights)).items()}, str(weights), metadata=metadata)
    assert safetensors_header(weights) == header
    changes = identity_changes(original, model_identity(read_model_folder(str(copy))))
    assert len(changes) == 1 and changes[0].startswith("safetensors fingerprint ")

    with weights.open("ab") as handle:
        handle.write(b"\0" * 8)
    edit_config(copy, initializer_range=0.5)
    changes = identity_changes(original, model_identity(read_model_folder(str(copy))))
    size = original["weights"]["model.safetensors"]
    assert changes[:2] == ["config.json initializer_range=0.02 (now 0.5)",
                           f"model.safetensors {size} bytes (now {size + 8} bytes)"]

    sharded = model_identity(read_model_folder(str(model_folders["sharded"])))
    assert len(sharded["weights"]) == 6 and sharded["fingerprint_sha256"] != original["fingerprint_sha256"]


def trained_trial_dir(trial_dir: Path, folder: Path) -> Path:
    """A trial dir as a run from ``folder`` leaves it: config.yaml, environment.json with the folder's
    identity, a checkpoint."""
    config = trial_config_to_dict(trial_config_from_dict({"model": {"path": str(folder)}}))
    (trial_dir / "checkpoints").mkdir(parents=True)
    (trial_dir / "checkpoints" / "step00000002-valinf.pt").write_bytes(b"")
    (trial_dir / "config.yaml").write_text(yaml.safe_dump(config))
    identity = model_identity(read_model_folder(str(folder)))
    (trial_dir / "environment.json").write_text(json.dumps({"model": identity}))
    return trial_dir


def test_resuming_from_a_changed_folder_is_refused_naming_the_change_and_a_moved_one_is_not(model_folders, tmp_path):
    folder = copy_of(model_folders["single"], tmp_path / "model")
    trial_dir = trained_trial_dir(tmp_path / "trial", folder)
    same = validate(folder)
    assert resume_differences(trial_dir, same) == []
    assert resume_differences(trial_dir, validate(copy_of(folder, tmp_path / "moved"))) == []

    edit_config(folder, initializer_range=0.5)
    (differences,) = resume_differences(trial_dir, same)
    assert isinstance(differences, ModelChange)
    with pytest.raises(ConfigMismatch) as info:
        check_resume(trial_dir, same, force=False)
    assert str(info.value) == mismatch_message(trial_dir, [differences]) == (
        f"trial dir {trial_dir} was trained with a different config: model.path={folder} changed since the trial "
        "trained from it: config.json initializer_range=0.02 (now 0.5); put the model folder back as it was, rerun "
        "with the same overrides, or add resume.force=true to resume it with the new config"
    )
    assert check_resume(trial_dir, same, force=True) == [differences]

    # From the built-in model to a folder: the path itself differs.
    builtin = tmp_path / "builtin"
    trained_trial_dir(builtin, folder)
    (builtin / "config.yaml").write_text(yaml.safe_dump(trial_config_to_dict(trial_config_from_dict({}))))
    assert [str(d) for d in resume_differences(builtin, same)] == [f"model.path=null (now {folder})"]


@pytest.mark.parametrize("module", ["hpcsweep.app", "hpcsweep.train.__main__"])
def test_the_entry_modules_keep_the_hub_offline_before_transformers_loads(module):
    probe = (
        f"import os, {module}\n"
        "import huggingface_hub.constants as hub\n"
        "print(os.environ['HF_HUB_OFFLINE'], os.environ['TRANSFORMERS_OFFLINE'], hub.HF_HUB_OFFLINE)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env=env, check=True)
    assert out.stdout.split() == ["1", "1", "True"], out.stderr
