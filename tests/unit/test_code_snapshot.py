"""The sweep's code snapshot: which files, the atomic copy, SNAPSHOT.json, and imports from the copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hpcsweep
from hpcsweep.files.code_snapshot import SNAPSHOT_FILE, read_snapshot_record, snapshot_dir_of
from hpcsweep.sweep import snapshot
from hpcsweep.sweep.snapshot import (
    MAX_FILE_BYTES,
    SourceTree,
    choose_files,
    excluded,
    snapshot_setup_lines,
    source_trees,
    take_snapshot,
    with_snapshot,
)

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str = "x = 1\n", size: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if size is None:
        path.write_text(text)
    else:
        path.write_bytes(b"#" * size)
    return path


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(cwd), *args],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout.strip()


@pytest.mark.parametrize("name", [
    ".git", ".venv", "__pycache__", "multirun", "outputs", ".code", ".code.tmp-12", "hpcsweep.egg-info",
    "model.pt", "weights.safetensors", "x.pyc", "events.out.tfevents.1.host", "slurm-5.out", "train.log",
])
def test_excluded_names(name):
    assert excluded(name)


@pytest.mark.parametrize("name", ["train.py", "config.yaml", "README.md", "setup.cfg", "data.py", "codes"])
def test_source_names_are_kept(name):
    assert not excluded(name)


def test_choose_files_applies_patterns_size_limit_skips_and_links(tmp_path):
    write(tmp_path / "train.py")
    write(tmp_path / "conf" / "config.yaml")
    write(tmp_path / "pkg" / "__pycache__" / "m.cpython-311.pyc")
    write(tmp_path / "multirun" / "2026" / "x.py")
    write(tmp_path / ".git" / "HEAD")
    write(tmp_path / "ckpt" / "model.pt")
    write(tmp_path / "exactly_limit.py", size=MAX_FILE_BYTES)
    write(tmp_path / "too_big.py", size=MAX_FILE_BYTES + 1)
    write(tmp_path / "hpcsweep" / "stale.py")
    write(tmp_path / "pkg" / "keep.py")
    (tmp_path / "link.py").symlink_to(tmp_path / "train.py")
    (tmp_path / "data_link").symlink_to(tmp_path / "conf", target_is_directory=True)

    chosen = choose_files(SourceTree(tmp_path, "", frozenset({"hpcsweep"})))
    assert chosen == ["conf/config.yaml", "exactly_limit.py", "pkg/keep.py", "train.py"]


def test_source_trees_of_an_editable_checkout(tmp_path):
    cwd = tmp_path / "project"
    write(cwd / "train.py")
    repo = tmp_path / "repo"
    packages = {"hpcsweep": repo / "hpcsweep", "hpcsweep.configs": repo / "configs",
                "hydra_plugins.hpcsweep_plugins": repo / "hydra_plugins" / "hpcsweep_plugins"}
    trees = source_trees(cwd, packages, cwd / "sweeps" / "s1")
    assert trees == [
        SourceTree(cwd, "", frozenset({"hpcsweep", "hpcsweep/configs", "hydra_plugins/hpcsweep_plugins",
                                      "sweeps/s1"}), code_only=True),
        SourceTree(repo / "hpcsweep", "hpcsweep", frozenset({"configs"})),
        SourceTree(repo / "configs", "hpcsweep/configs"),
        SourceTree(repo / "hydra_plugins" / "hpcsweep_plugins", "hydra_plugins/hpcsweep_plugins"),
    ]


def test_source_trees_of_an_installed_package_outside_any_working_tree(tmp_path):
    site = tmp_path / "site-packages"
    packages = {"hpcsweep": site / "hpcsweep", "hpcsweep.configs": site / "hpcsweep" / "configs",
                "hydra_plugins.hpcsweep_plugins": site / "hydra_plugins" / "hpcsweep_plugins"}
    (tmp_path / "empty").mkdir()
    trees = source_trees(tmp_path / "empty", packages, tmp_path / "empty" / "multirun")
    assert trees == [
        SourceTree(site / "hpcsweep", "hpcsweep"),
        SourceTree(site / "hydra_plugins" / "hpcsweep_plugins", "hydra_plugins/hpcsweep_plugins"),
    ]
    write(site / "hpcsweep" / "__init__.py")
    write(site / "hpcsweep" / "configs" / "config.yaml")
    assert choose_files(trees[0]) == ["__init__.py", "configs/config.yaml"]


@pytest.fixture()
def user_repo(tmp_path) -> Path:
    """A user's git checkout with one committed module."""
    repo = tmp_path / "user"
    write(repo / "mymodel.py", "WIDTH = 8\n")
    write(repo / ".gitignore", "multirun/\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    return repo


def test_take_snapshot_copies_code_and_records_it(user_repo):
    sweep_dir = user_repo / "multirun" / "s1"
    record = take_snapshot(sweep_dir, user_repo)
    code = sweep_dir / ".code"
    assert (code / "mymodel.py").read_text() == "WIDTH = 8\n"
    assert (code / "hpcsweep" / "sweep" / "snapshot.py").read_bytes() == Path(snapshot.__file__).read_bytes()
    assert (code / "hpcsweep" / "configs" / "config.yaml").is_file()
    assert (code / "hydra_plugins" / "hpcsweep_plugins" / "config.py").is_file()
    assert not (code / "multirun").exists()
    assert [p.name for p in sweep_dir.iterdir()] == [".code"]  # no temporary folder left

    written = json.loads((code / SNAPSHOT_FILE).read_text())
    assert written == record.as_dict()
    assert written["path"] == str(code)
    assert written["source"] == str(user_repo.resolve())
    assert written["commit"] == git(user_repo, "rev-parse", "HEAD")
    assert len(written["diff_sha256"]) == len(written["files_sha256"]) == 64
    assert written["files"] == sum(1 for p in code.rglob("*") if p.is_file()) - 1
    assert read_snapshot_record(code) == {"path": str(code), "commit": written["commit"],
                                          "diff_sha256": written["diff_sha256"]}


def test_diff_hash_follows_uncommitted_changes_and_untracked_files(user_repo):
    clean = take_snapshot(user_repo / "multirun" / "a", user_repo).diff_sha256
    write(user_repo / "outputs" / "run" / "model.pt")  # untracked, not ignored, never copied
    assert take_snapshot(user_repo / "multirun" / "b", user_repo).diff_sha256 == clean
    write(user_repo / "mymodel.py", "WIDTH = 16\n")
    edited = take_snapshot(user_repo / "multirun" / "c", user_repo).diff_sha256
    write(user_repo / "extra.py", "Y = 2\n")
    untracked = take_snapshot(user_repo / "multirun" / "d", user_repo).diff_sha256
    assert len({clean, edited, untracked}) == 3


def test_an_existing_snapshot_is_kept(user_repo):
    sweep_dir = user_repo / "multirun" / "s1"
    first = take_snapshot(sweep_dir, user_repo)
    write(user_repo / "mymodel.py", "WIDTH = 16\n")
    assert take_snapshot(sweep_dir, user_repo) == first
    assert (sweep_dir / ".code" / "mymodel.py").read_text() == "WIDTH = 8\n"


def test_a_failed_copy_leaves_no_snapshot(user_repo, monkeypatch):
    copies = []

    def failing_copy(src, dst):
        copies.append(src)
        if len(copies) == 3:
            raise OSError("disk full")
        return Path(dst).write_bytes(Path(src).read_bytes())

    monkeypatch.setattr(snapshot.shutil, "copy2", failing_copy)
    sweep_dir = user_repo / "multirun" / "s1"
    with pytest.raises(OSError, match="disk full"):
        take_snapshot(sweep_dir, user_repo)
    assert list(sweep_dir.iterdir()) == []


def test_outside_git_the_commit_and_diff_are_null(tmp_path):
    cwd = tmp_path / "plain"
    write(cwd / "train.py")
    record = take_snapshot(tmp_path / "sweep", cwd)
    if record.source is None:  # hpcsweep itself outside git (an installed package): all null
        assert record.commit is None and record.diff_sha256 is None
    assert (tmp_path / "sweep" / ".code" / "train.py").is_file()


def test_setup_lines_quote_the_path_and_keep_an_existing_pythonpath(tmp_path):
    code = tmp_path / "a b$(x)" / ".code"
    lines = snapshot_setup_lines(code)
    assert lines == [f"export PYTHONPATH='{code}'${{PYTHONPATH:+:$PYTHONPATH}}", "export PYTHONSAFEPATH=1"]
    script = "\n".join([*lines, 'printf "%s|%s" "$PYTHONPATH" "$PYTHONSAFEPATH"'])
    for before, after in ((None, str(code)), ("/opt/lib", f"{code}:/opt/lib")):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if before:
            env["PYTHONPATH"] = before
        out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=10).stdout
        assert out == f"{after}|1"


def test_with_snapshot_drops_the_key_and_appends_to_the_users_setup(tmp_path):
    params = {"code_snapshot": True, "setup": ["module load cuda"], "partition": "gpu"}
    out = with_snapshot(params, tmp_path / ".code")
    assert out == {"setup": ["module load cuda", *snapshot_setup_lines(tmp_path / ".code")], "partition": "gpu"}
    assert with_snapshot({"code_snapshot": False, "setup": None}, None) == {"setup": None}
    assert params["setup"] == ["module load cuda"]


def test_the_launcher_key_defaults_to_on():
    from hydra_plugins.hpcsweep_plugins.config import AutoLauncherConf, LocalLauncherConf, SlurmLauncherConf

    assert SlurmLauncherConf().code_snapshot is True
    assert AutoLauncherConf().code_snapshot is True
    assert not hasattr(LocalLauncherConf(), "code_snapshot")


PROBE = """
import json, os
import hpcsweep, hpcsweep.configs, hydra_plugins.hpcsweep_plugins.config as plugins
from hpcsweep.trial.records import environment_record
from hpcsweep.trial.rendezvous import Rendezvous
record = environment_record(Rendezvous("localhost", 29500, 1, 0, 1, "probe"), "none", {}, None)
print(json.dumps({"hpcsweep": hpcsweep.__file__, "configs": list(hpcsweep.configs.__path__),
                  "plugins": plugins.__file__, "code_snapshot": record["code_snapshot"]}))
"""


def probe(env_lines: list[str], cwd: Path) -> dict:
    """Run PROBE with this venv's python after ``env_lines``, as an array task's batch script does."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    script = "\n".join([*env_lines, 'exec "$0" -c "$1"'])
    proc = subprocess.run(["bash", "-c", script, sys.executable, PROBE], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_tasks_import_the_snapshot_even_from_an_editable_checkout(tmp_path):
    # This interpreter's hpcsweep is the editable install of this checkout; run from the checkout
    # itself, where `python -c` would otherwise put the live tree first on sys.path.
    assert Path(hpcsweep.__file__).resolve().is_relative_to(REPO)
    record = take_snapshot(tmp_path / "sweep", tmp_path)
    code = Path(record.path)

    inside = probe(snapshot_setup_lines(code), REPO)
    assert Path(inside["hpcsweep"]) == code / "hpcsweep" / "__init__.py"
    assert [Path(p) for p in inside["configs"]] == [code / "hpcsweep" / "configs"]
    assert Path(inside["plugins"]) == code / "hydra_plugins" / "hpcsweep_plugins" / "config.py"
    assert inside["code_snapshot"] == {"path": str(code), "commit": record.commit,
                                       "diff_sha256": record.diff_sha256}

    # Without PYTHONSAFEPATH the checkout the job started in would win: why the line is there.
    unsafe = probe(snapshot_setup_lines(code)[:1], REPO)
    assert Path(unsafe["hpcsweep"]).resolve() == REPO / "hpcsweep" / "__init__.py"

    installed = probe([], tmp_path)
    assert Path(installed["hpcsweep"]).resolve() == REPO / "hpcsweep" / "__init__.py"
    assert installed["code_snapshot"] is None


def test_snapshot_dir_of_needs_the_record(tmp_path):
    write(tmp_path / ".code" / "hpcsweep" / "__init__.py")
    assert snapshot_dir_of(tmp_path / ".code" / "hpcsweep" / "__init__.py") is None
    write(tmp_path / ".code" / SNAPSHOT_FILE, "{}")
    assert snapshot_dir_of(tmp_path / ".code" / "hpcsweep" / "__init__.py") == tmp_path / ".code"
