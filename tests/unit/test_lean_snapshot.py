"""The code snapshot takes the user's code, not their data (#31 item 8): Python sources, YAML configs and
package data, git's files in a checkout; never a corpus, tokenizer, weights, model folder, export or
multirun/; hpcsweep's own packages in one archive, the whole under 1 MB; a snapshot too large to be code
is refused before anything is submitted."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from hpcsweep.files.code_snapshot import ARCHIVE_FILE
from hpcsweep.sweep import snapshot
from hpcsweep.sweep.snapshot import (
    MAX_SNAPSHOT_BYTES,
    SourceTree,
    choose_files,
    is_code,
    is_model_folder,
    size_refusal,
    source_trees,
    take_snapshot,
)
from tests.model_folders import make_model_folder


def write(path: Path, text: str = "x = 1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(cwd), *args],
                   check=True, capture_output=True, timeout=30)


def users_folder(root: Path) -> Path:
    """A project as a user's is: code, configs, a package with data, and beside them their data, a model
    folder with remote code, an export and earlier sweeps."""
    write(root / "train.py")
    write(root / "conf" / "config.yaml", "lr: 1\n")
    write(root / "mypkg" / "__init__.py")
    write(root / "mypkg" / "labels.json", "[]")  # package data: kept
    write(root / "mypkg" / "notes.txt")  # text, even in a package: left out
    write(root / "mypkg" / "head.pt")  # a checkpoint kept in a package: left out, and the package kept
    write(root / "README.md", "# mine\n")
    write(root / "corpus" / "doc-000.txt", "some text\n")
    write(root / "corpus" / "extra.jsonl", '{"text": "x"}\n')
    write(root / "tokenizer.json", "{}")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "modeling_mine.py"):
        write(root / "models" / "mine" / name, "{}")
    # A LoRA export as hpcsweep.export writes one: no config.json, the base's tokenizer and its remote code.
    for name in ("adapter_config.json", "adapter_model.safetensors", "README.md", "tokenizer.json",
                 "tokenizer_config.json", "tokenization_mine.py"):
        write(root / "exports" / "adapter" / name, "{}")
    for name in ("tokenizer.model", "tokenizer_config.json", "tokenization_other.py"):  # a tokenizer alone
        write(root / "tokenizers" / "other" / name, "{}")
    write(root / "gguf" / "model-q4.gguf")
    write(root / "gguf" / "convert_helper.py")
    write(root / "exports" / "merged" / "config.json", "{}")
    write(root / "exports" / "merged" / "model.safetensors", "{}")
    write(root / "multirun" / "2026-12-03" / "10-00-00" / "0" / "metrics.json", "{}")
    return root


CODE = ["conf/config.yaml", "mypkg/__init__.py", "mypkg/labels.json", "train.py"]


def test_only_the_code_of_a_working_tree_is_chosen(tmp_path):
    root = users_folder(tmp_path / "project")
    assert choose_files(SourceTree(root, "", code_only=True)) == CODE
    assert is_model_folder(["config.json", "model-00001-of-00002.safetensors"])
    assert is_model_folder(["config.json", "tokenizer.json"]) and not is_model_folder(["config.json", "x.py"])
    assert is_model_folder(["adapter_config.json", "README.md", "tokenization_x.py"])  # no config.json
    assert is_model_folder(["pytorch_model.bin", "x.py"]) and is_model_folder(["tokenizer.model", "x.py"])
    assert not is_model_folder(["__init__.py", "model.py", "weights.pt"])  # a package is code
    assert is_code("x.py", False) and is_code("c.yml", False) and not is_code("README.md", False)
    assert is_code("schema.json", True) and not is_code("tokenizer_config.json", True)
    assert not is_code("vocab.txt", True) and not is_code("w.bin", True)


def test_in_a_git_checkout_only_what_git_tracks_or_would_track(tmp_path):
    root = users_folder(tmp_path / "project")
    write(root / ".gitignore", "multirun/\nscratch.py\n")
    git(root, "init", "-q")
    git(root, "add", "train.py", "conf", "mypkg", ".gitignore")
    git(root, "commit", "-q", "-m", "first")
    write(root / "new_module.py")  # not committed yet, not ignored: the trials may import it
    write(root / "scratch.py")  # ignored
    record = take_snapshot(tmp_path / "sweep", root)
    code = Path(record.path)
    user_files = sorted(p.relative_to(code).as_posix() for p in code.rglob("*")
                        if p.is_file() and p.name not in ("SNAPSHOT.json", ARCHIVE_FILE))
    assert user_files == sorted([*CODE, "new_module.py"])


REMOTE_TOKENIZER = '''from transformers import PreTrainedTokenizerFast


class TinyRemoteTokenizer(PreTrainedTokenizerFast):
    """The base's own tokenizer class: its export carries this module."""
'''


def test_a_lora_export_beside_the_code_stays_out_with_its_remote_code(tmp_path):
    # The export as `python -m hpcsweep.export` writes it for a LoRA trial of a base whose tokenizer is
    # remote code: adapter_config.json, adapter_model.safetensors, README.md, the tokenizer files and the
    # tokenizer's *.py, and no config.json.
    import json

    import torch

    from hpcsweep.export import cli
    from hpcsweep.files.sweep_record import SweepRecord, TrialRecord, now_iso, write_sweep_record
    from hpcsweep.train import worker
    from tests.export_folders import make_remote_code_folder

    from .trial_dirs import make_trial_dir

    torch.set_num_threads(1)
    base = make_remote_code_folder(tmp_path / "models" / "remote")
    (base / "tokenization_tiny_remote.py").write_text(REMOTE_TOKENIZER)
    tokenizer_config = json.loads((base / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = {"AutoTokenizer": [None, "tokenization_tiny_remote.TinyRemoteTokenizer"]}
    (base / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    sweep_dir = tmp_path / "sweep"
    trial_dir = make_trial_dir(sweep_dir / "0", {
        "model.path": str(base), "model.trust_remote_code": True, "model.peft": "lora", "model.lora.r": 2,
        "data.batch_size": 2, "data.seq_len": 16, "data.synthetic_tokens": 5000, "trainer.device": "cpu",
        "trainer.max_steps": 2, "trainer.warmup_steps": 1, "trainer.eval_every": 2, "trainer.eval_batches": 1,
        "trainer.log_every": 1, "trainer.ckpt_every": 0})
    assert worker.run_trial(trial_dir) == 0
    write_sweep_record(SweepRecord(str(sweep_dir), "local", now_iso(), [TrialRecord(0, [], str(trial_dir), None,
                                                                                    now_iso())]))
    root = tmp_path / "project"
    write(root / "train.py")
    write(root / "mypkg" / "__init__.py")
    assert cli.main([str(sweep_dir), "--trial", "0", "--out", str(root / "exports" / "adapter")]) == 0
    exported = sorted(p.name for p in (root / "exports" / "adapter").iterdir())
    assert exported == ["README.md", "adapter_config.json", "adapter_model.safetensors", "tokenization_tiny_remote.py",
                        "tokenizer.json", "tokenizer_config.json"]

    code = Path(take_snapshot(tmp_path / "snapshot-sweep", root).path)
    loose = sorted(p.relative_to(code).as_posix() for p in code.rglob("*")
                   if p.is_file() and p.name not in ("SNAPSHOT.json", ARCHIVE_FILE))
    assert loose == ["mypkg/__init__.py", "train.py"]


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that costs no disk writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


def test_a_5000_file_corpus_and_a_model_folder_beside_the_code_stay_out(tmp_path):
    # The acceptance: 50 MB of 5,000 small .txt files and a model folder (the files save_pretrained and a
    # tokenizer write, sparse: what is chosen depends on names and sizes only).
    root = tmp_path / "project"
    write(root / "train.py")
    for i in range(5000):
        sparse(root / "corpus" / f"doc-{i:05d}.txt", 10_000)
    model = root / "models" / "tiny-deepseek"
    for name, size in (("config.json", 1_500), ("generation_config.json", 150), ("model.safetensors", 20_000_000),
                       ("tokenizer.json", 30_000), ("tokenizer_config.json", 400)):
        sparse(model / name, size)
    assert sum(p.stat().st_size for p in (root / "corpus").iterdir()) == 50_000_000
    record = take_snapshot(root / "multirun" / "s1", root)
    code = Path(record.path)
    written = {p.relative_to(code).as_posix(): p.stat().st_size for p in code.rglob("*") if p.is_file()}
    # Of the user's folder, only train.py; beside it hpcsweep's own code (about 1.2 MB of sources), in one
    # archive: the whole snapshot, every file under .code, is under 1 MB.
    assert sorted(written) == sorted(["SNAPSHOT.json", ARCHIVE_FILE, "train.py"])
    assert sum(written.values()) < 1_000_000, written
    with zipfile.ZipFile(code / ARCHIVE_FILE) as archive:
        own = {info.filename: info.file_size for info in archive.infolist() if not info.is_dir()}
    assert all(name.startswith(("hpcsweep/", "hydra_plugins/hpcsweep_plugins/")) for name in own)
    assert record.files == len(own) + 1
    assert record.bytes == sum(own.values()) + written["train.py"]
    assert record.stored_bytes == written[ARCHIVE_FILE] + written["train.py"]


def test_a_snapshot_too_large_to_be_code_is_refused_naming_the_largest_files(tmp_path, monkeypatch):
    root = tmp_path / "project"
    message = size_refusal({root / "a.py": MAX_SNAPSHOT_BYTES, root / "b.py": 1}, root)
    assert message.startswith(f"the code snapshot (hydra.launcher.code_snapshot) of {root} would copy 2 files, "
                              "32.0 MiB (at most 10000 files, 32 MiB); the largest: ")
    assert message.endswith("set hydra.launcher.code_snapshot=false")
    assert size_refusal({root / "a.py": 10}, root) is None
    assert "would copy 3 files" in size_refusal({root / f"{i}.py": 1 for i in range(3)}, root, max_files=2)

    write(root / "train.py")
    write(root / "pkg" / "__init__.py")
    for i in range(3):
        with open(root / "pkg" / f"table{i}.dat", "wb") as handle:  # package data, each under the file limit
            handle.truncate(900_000)
    monkeypatch.setattr(snapshot, "MAX_SNAPSHOT_BYTES", 2_000_000)
    with pytest.raises(ValueError, match=r"would copy \d+ files, .*the largest: .*table\d\.dat \(0\.9 MiB\)"):
        take_snapshot(tmp_path / "sweep", root)
    assert not (tmp_path / "sweep").exists()


def test_tests_benchmarks_and_docs_stay_out_unless_the_swept_app_runs_from_one(tmp_path):
    """A sweep from hpcsweep's own checkout copied tests/ (456 files, 2.5 MB): no package imports it at run time."""
    root = users_folder(tmp_path / "project")
    write(root / "tests" / "__init__.py")
    write(root / "tests" / "test_train.py")
    write(root / "tests" / "foreign_app" / "__init__.py")
    write(root / "tests" / "foreign_app" / "app.py")
    write(root / "benchmarks" / "speed.py")
    write(root / "docs" / "examples" / "tasks.yaml", "task: x\n")
    write(root / "mypkg" / "tests" / "test_inner.py")  # a package's own tests folder is the package's

    def chosen(app_file):
        (tree,) = source_trees(root, {}, tmp_path / "sweep", app_file=app_file)
        return choose_files(tree)

    assert chosen(None) == sorted([*CODE, "mypkg/tests/test_inner.py"])
    assert chosen(root / "train.py") == chosen(None)
    with_app = chosen(root / "tests" / "foreign_app" / "app.py")
    assert [n for n in with_app if n.startswith("tests/")] == [
        "tests/__init__.py", "tests/foreign_app/__init__.py", "tests/foreign_app/app.py", "tests/test_train.py"]
    assert not any(n.startswith(("benchmarks/", "docs/")) for n in with_app)


def test_a_snapshot_of_hpcsweeps_own_checkout_stays_under_1_mb():
    repo = Path(__file__).resolve().parents[2]
    record = take_snapshot_in(repo)
    assert record.stored_bytes < 1 << 20, record
    assert not any(name.startswith("tests/") for name in record_names(repo))


def take_snapshot_in(repo: Path):
    import tempfile

    with tempfile.TemporaryDirectory() as sweep:
        return snapshot.take_snapshot(Path(sweep), repo)


def record_names(repo: Path) -> list[str]:
    return [name for tree, names in snapshot.chosen_files(repo / "multirun" / "x", repo) for name in names
            if tree.root == repo]
