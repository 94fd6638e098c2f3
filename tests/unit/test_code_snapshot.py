"""The sweep's code snapshot: which files, the atomic copy, SNAPSHOT.json, and imports from the copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import hpcsweep
from hpcsweep.files.code_snapshot import ARCHIVE_FILE, SNAPSHOT_FILE, read_snapshot_record, snapshot_dir_of
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
    # The working tree's code loose, hpcsweep's packages (configs and plugins included) in the archive.
    assert sorted(p.name for p in code.iterdir()) == sorted([ARCHIVE_FILE, SNAPSHOT_FILE, "mymodel.py"])
    assert (code / "mymodel.py").read_text() == "WIDTH = 8\n"
    with zipfile.ZipFile(code / ARCHIVE_FILE) as archive:
        assert archive.read("hpcsweep/sweep/snapshot.py") == Path(snapshot.__file__).read_bytes()
        assert archive.read("hpcsweep/configs/config.yaml") == (REPO / "configs" / "config.yaml").read_bytes()
        assert "hydra_plugins/hpcsweep_plugins/config.py" in archive.namelist()
        archived = {info.filename: info.file_size for info in archive.infolist() if not info.is_dir()}
        assert all(info.compress_type == zipfile.ZIP_DEFLATED for info in archive.infolist() if not info.is_dir())
    assert not any(name.endswith((".pyc", "/__pycache__/")) or "/__pycache__/" in name for name in archived)
    assert [p.name for p in sweep_dir.iterdir()] == [".code"]  # no temporary folder left

    written = json.loads((code / SNAPSHOT_FILE).read_text())
    assert written == record.as_dict()
    assert written["path"] == str(code)
    assert written["source"] == str(user_repo.resolve())
    assert written["commit"] == git(user_repo, "rev-parse", "HEAD")
    assert len(written["diff_sha256"]) == len(written["files_sha256"]) == 64
    assert written["files"] == len(archived) + 1
    assert written["bytes"] == sum(archived.values()) + len("WIDTH = 8\n")
    assert written["stored_bytes"] == (code / ARCHIVE_FILE).stat().st_size + len("WIDTH = 8\n")
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
    archive = (sweep_dir / ".code" / ARCHIVE_FILE).read_bytes()
    write(user_repo / "mymodel.py", "WIDTH = 16\n")
    assert take_snapshot(sweep_dir, user_repo) == first
    assert (sweep_dir / ".code" / "mymodel.py").read_text() == "WIDTH = 8\n"
    assert (sweep_dir / ".code" / ARCHIVE_FILE).read_bytes() == archive


def test_the_same_code_gives_the_same_hash_and_archive(user_repo):
    first = take_snapshot(user_repo / "multirun" / "a", user_repo)
    second = take_snapshot(user_repo / "multirun" / "b", user_repo)
    assert first.files_sha256 == second.files_sha256
    assert (Path(first.path) / ARCHIVE_FILE).read_bytes() == (Path(second.path) / ARCHIVE_FILE).read_bytes()
    write(user_repo / "mymodel.py", "WIDTH = 16\n")
    assert take_snapshot(user_repo / "multirun" / "c", user_repo).files_sha256 != first.files_sha256


def test_a_snapshot_taken_before_the_archive_is_kept(user_repo):
    # A sweep dir whose snapshot is loose files (taken before the archive): a later batch keeps it, and
    # its setup lines still find hpcsweep there (the folder is on the path too).
    code = user_repo / "multirun" / "s1" / ".code"
    write(code / "hpcsweep" / "__init__.py")
    old = {"path": str(code), "source": None, "commit": None, "diff_sha256": None, "files_sha256": "0" * 64,
           "files": 1, "bytes": 6}
    write(code / SNAPSHOT_FILE, json.dumps(old))
    record = take_snapshot(code.parent, user_repo)
    assert record.as_dict() == {**old, "stored_bytes": None, "hpcsweep": None}
    assert not (code / ARCHIVE_FILE).exists()


def test_a_failed_copy_leaves_no_snapshot(user_repo, monkeypatch):
    def failing_archive(path, members):
        path.write_bytes(b"PK\3\4")  # half an archive
        raise OSError("disk full")

    monkeypatch.setattr(snapshot, "write_archive", failing_archive)
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
    assert lines == [f"export PYTHONPATH='{code}/{ARCHIVE_FILE}':'{code}'${{PYTHONPATH:+:$PYTHONPATH}}",
                     "export PYTHONSAFEPATH=1"]
    script = "\n".join([*lines, 'printf "%s|%s" "$PYTHONPATH" "$PYTHONSAFEPATH"'])
    both = f"{code}/{ARCHIVE_FILE}:{code}"
    for before, after in ((None, both), ("/opt/lib", f"{both}:/opt/lib")):
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
import json, os, sys
import hpcsweep, hpcsweep.configs, hydra_plugins.hpcsweep_plugins.config as plugins
from hydra import compose, initialize_config_module
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from omegaconf import OmegaConf
from hpcsweep.trial.records import environment_record
from hpcsweep.trial.rendezvous import Rendezvous
record = environment_record(Rendezvous("localhost", 29500, 1, 0, 1, "probe"), "none", {}, None)
# Hydra's own plugin scan (pkgutil over the hydra_plugins namespace), and its pkg:// config source.
launchers = {cls.__name__: sys.modules[cls.__module__].__file__ for cls in Plugins.instance().discover(Launcher)
             if cls.__module__.startswith("hydra_plugins.hpcsweep_plugins")}
with initialize_config_module("hpcsweep.configs", version_base="1.3"):
    config = OmegaConf.to_container(compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True))
print(json.dumps({"hpcsweep": hpcsweep.__file__, "configs": list(hpcsweep.configs.__path__),
                  "plugins": plugins.__file__, "code_snapshot": record["code_snapshot"],
                  "git_commit": record["git_commit"], "install": record["hpcsweep"], "launchers": launchers,
                  "config": {key: config[key] for key in ("model", "data", "trainer")},
                  "launcher": config["hydra"]["launcher"]["_target_"]}))
"""


def probe(env_lines: list[str], cwd: Path) -> dict:
    """Run PROBE with this venv's python after ``env_lines``, as an array task's batch script does.

    The task inherits the submitting shell's ``PYTHONPATH`` (sbatch exports it), so the probe keeps
    this process's: where it names the live checkout, the snapshot must still win.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
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
    archive = code / ARCHIVE_FILE
    assert Path(inside["hpcsweep"]) == archive / "hpcsweep" / "__init__.py"
    assert [Path(p) for p in inside["configs"]] == [archive / "hpcsweep" / "configs"]
    assert Path(inside["plugins"]) == archive / "hydra_plugins" / "hpcsweep_plugins" / "config.py"
    assert inside["launchers"] == {name: str(archive / "hydra_plugins" / "hpcsweep_plugins" / "launchers.py")
                                   for name in ("AutoLauncher", "LocalLauncher", "SlurmLauncher")}
    assert inside["launcher"] == "hydra_plugins.hpcsweep_plugins.launchers.SlurmLauncher"
    # environment.json says which snapshot ran; the archive is no git checkout (the commit is the snapshot's).
    assert inside["code_snapshot"] == {"path": str(code), "commit": record.commit,
                                       "diff_sha256": record.diff_sha256}
    assert inside["git_commit"] is None
    # From a data folder (not a checkout) too, the trial names the hpcsweep it ran: the one the snapshot
    # recorded when it was taken, this editable checkout's version and commit.
    assert inside["install"] == record.hpcsweep
    assert inside["install"]["version"] == hpcsweep.__version__
    assert inside["install"]["source"] == f"git checkout {REPO}"
    assert subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", inside["install"]["commit"] + "^{commit}"],
                          timeout=30).returncode == 0

    # Without PYTHONSAFEPATH the checkout the job started in would win: why the line is there.
    unsafe = probe(snapshot_setup_lines(code)[:1], REPO)
    assert Path(unsafe["hpcsweep"]).resolve() == REPO / "hpcsweep" / "__init__.py"

    installed = probe([], tmp_path)
    assert Path(installed["hpcsweep"]).resolve() == REPO / "hpcsweep" / "__init__.py"
    assert installed["code_snapshot"] is None
    assert installed["install"]["version"] == hpcsweep.__version__ and installed["install"]["commit"]
    assert installed["install"]["source"] == f"git checkout {REPO}"
    # The configs Hydra composes from the archive are the checkout's.
    assert inside["config"] == installed["config"]


def test_snapshot_dir_of_needs_the_record(tmp_path):
    write(tmp_path / ".code" / "hpcsweep" / "__init__.py")
    in_archive = tmp_path / ".code" / ARCHIVE_FILE / "hpcsweep" / "trial" / "records.py"  # a zipimported __file__
    assert snapshot_dir_of(tmp_path / ".code" / "hpcsweep" / "__init__.py") is None
    assert snapshot_dir_of(in_archive) is None
    write(tmp_path / ".code" / SNAPSHOT_FILE, "{}")
    assert snapshot_dir_of(tmp_path / ".code" / "hpcsweep" / "__init__.py") == tmp_path / ".code"
    assert snapshot_dir_of(in_archive) == tmp_path / ".code"


def fake_git(answers):
    """``git -C FOLDER ARGS`` answered from ``{(folder, first arg): output}`` (None: git fails there)."""
    return lambda folder, *args: answers.get((str(folder), args[0] if args[0] != "rev-parse" else args[1]))


def test_the_install_record_finds_the_commit_of_an_editable_a_repository_or_no_install():
    from hpcsweep.trial.install import install_record

    checkout = {("/src/hpcsweep/hpcsweep", "--show-toplevel"): "/src/hpcsweep",
                ("/src/hpcsweep/hpcsweep", "HEAD"): "abc123", ("/src/hpcsweep/hpcsweep", "status"): " M x.py"}
    assert install_record("0.1.0", Path("/src/hpcsweep/hpcsweep"), None, fake_git(checkout)) == {
        "version": "0.1.0", "commit": "abc123", "dirty": True, "source": "git checkout /src/hpcsweep"}
    # Imported from a zip: the editable install's folder, from direct_url.json.
    editable = '{"dir_info": {"editable": true}, "url": "file:///src/hpcsweep"}'
    at_top = {("/src/hpcsweep", "--show-toplevel"): "/src/hpcsweep", ("/src/hpcsweep", "HEAD"): "abc123",
              ("/src/hpcsweep", "status"): ""}
    assert install_record("0.1.0", None, editable, fake_git(at_top))["commit"] == "abc123"
    from_git = ('{"url": "https://github.com/o/hpcsweep", "vcs_info": {"vcs": "git", "commit_id": "def456"}}')
    assert install_record("0.1.0", Path("/site-packages/hpcsweep"), from_git, fake_git({})) == {
        "version": "0.1.0", "commit": "def456", "dirty": False, "source": "pip install from https://github.com/o/hpcsweep"}
    assert install_record("0.1.0", Path("/site-packages/hpcsweep"), None, fake_git({}))["commit"] is None
