"""The archive of hpcsweep's packages in a code snapshot: which files go in, its folder entries (without
which zipimport misses a namespace package's portion), and the same bytes for the same files."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from hpcsweep.sweep.snapshot import in_archive
from hpcsweep.sweep.snapshot_archive import folders_of, write_archive

# A namespace package (no __init__.py at its top, like hydra_plugins) holding a regular package.
MEMBERS = {"nspkg/plugin/__init__.py": b"", "nspkg/plugin/mod.py": b"VALUE = 42\n", "top.py": b"X = 1\n"}


def test_hpcsweeps_packages_go_in_the_archive_the_working_tree_stays_loose():
    assert in_archive("hpcsweep/__init__.py") and in_archive("hpcsweep/configs/model/tiny.yaml")
    assert in_archive("hydra_plugins/hpcsweep_plugins/launchers.py")
    assert not in_archive("train.py") and not in_archive("hydra_plugins/their_plugin/x.py")
    assert not in_archive("hpcsweep_extras/x.py") and not in_archive("conf/hpcsweep/x.yaml")


def test_every_folder_gets_an_entry():
    assert folders_of(["a/b/c.py", "a/d.py", "e.py", "a/b/f/g.py"]) == ["a/", "a/b/", "a/b/f/"]
    assert folders_of(["e.py"]) == []


def import_value(archive: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(archive), "PYTHONSAFEPATH": "1"}
    return subprocess.run([sys.executable, "-c", "import nspkg.plugin.mod as m; print(m.VALUE, m.__file__)"],
                           env=env, cwd=archive.parent, capture_output=True, text=True, timeout=60)


def test_a_namespace_package_imports_from_the_archive_through_its_folder_entries(tmp_path):
    write_archive(tmp_path / "with.zip", MEMBERS)
    with zipfile.ZipFile(tmp_path / "with.zip") as archive:
        assert archive.namelist() == ["nspkg/", "nspkg/plugin/", *sorted(MEMBERS)]
        assert all(archive.read(name) == data for name, data in MEMBERS.items())
    found = import_value(tmp_path / "with.zip")
    assert found.stdout.split() == ["42", str(tmp_path / "with.zip" / "nspkg" / "plugin" / "mod.py")], found.stderr

    # The control: the same files without folder entries, and zipimport does not see the namespace.
    with zipfile.ZipFile(tmp_path / "without.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in MEMBERS.items():
            archive.writestr(name, data)
    missed = import_value(tmp_path / "without.zip")
    assert missed.returncode == 1 and "No module named 'nspkg'" in missed.stderr


def test_the_same_files_give_the_same_bytes(tmp_path):
    write_archive(tmp_path / "a.zip", MEMBERS)
    write_archive(tmp_path / "b.zip", dict(reversed(MEMBERS.items())))
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()
    write_archive(tmp_path / "c.zip", {**MEMBERS, "top.py": b"X = 2\n"})
    assert (tmp_path / "c.zip").read_bytes() != (tmp_path / "a.zip").read_bytes()
