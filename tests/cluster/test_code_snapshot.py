"""The code snapshot: trials run the code that was submitted, not the working tree they start beside.

A user's checkout with an editable install submits a held 2-trial sweep, then edits hpcsweep in
the checkout before the trials start. Released, both trials must run the submitted code (the edit
would leave a marker file on import) and say so in their environment.json.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from ..venvs import venv_on_these_packages
from .conftest import REPO, SMALL_TRIAL, read_json, slurm, wait_until_ended


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture()
def checkout(tmp_path) -> Path:
    """A git checkout of the repo with hpcsweep installed editable in a fresh venv."""
    repo = tmp_path / "hpcsweep"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "multirun", "outputs", "slurm-*.out"))
    # No pip of its own: this interpreter's pip and setuptools make a PEP 660 editable install
    # (a venv's bundled setuptools is too old for one) without a download.
    python = venv_on_these_packages(tmp_path / "venv")
    installed = run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."],
                    repo, dict(os.environ), timeout=300)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "submitted"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                       capture_output=True, timeout=60)
    return repo


def test_trials_run_the_submitted_code_after_the_tree_changes(checkout, slurm_env, tmp_path):
    python = str(tmp_path / "venv" / "bin" / "python")
    env = {k: v for k, v in slurm_env.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    swept = run([python, "-m", "hpcsweep", "-m", "model.lr=1e-4,3e-4", *SMALL_TRIAL,
                 "+hydra.launcher.additional_parameters.hold=true"], checkout, env, timeout=300)
    assert swept.returncode == 0, (swept.stdout + swept.stderr)[-4000:]
    assert "launcher: slurm" in swept.stdout + swept.stderr
    (sweep_dir,) = [p.parent for p in checkout.glob("multirun/*/*/sweep.json")]
    sweep = read_json(sweep_dir / "sweep.json")
    (array,) = sweep["arrays"]
    array_id = array["array_job_id"]
    held = slurm(env, "squeue", "--noheader", "--array", "--jobs", array_id, "--format=%T %r").split("\n")
    assert [line for line in held if line] == ["PENDING JobHeldUser"] * 2, held

    # The edit a user makes while the sweep waits in the queue: every import of it leaves a marker.
    marker = tmp_path / "live-tree-imported"
    init = checkout / "hpcsweep" / "__init__.py"
    submitted_init = init.read_text()
    init.write_text(submitted_init + f"\nopen({str(marker)!r}, 'a').write(__file__ + '\\n')\n")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True,
                            check=True, timeout=30).stdout.strip()

    slurm(env, "scontrol", "release", array_id)
    for trial in sweep["trials"]:
        assert wait_until_ended(env, trial["job_id"], timeout=400) == "COMPLETED"

    code_dir = sweep_dir / ".code"
    snapshot = read_json(code_dir / "SNAPSHOT.json")
    assert snapshot["commit"] == commit and len(snapshot["diff_sha256"]) == 64
    with zipfile.ZipFile(code_dir / "hpcsweep.zip") as archive:
        assert archive.read("hpcsweep/__init__.py").decode() == submitted_init
    assert not marker.exists(), marker.read_text()
    for trial in sweep["trials"]:
        trial_dir = checkout / trial["trial_dir"]
        assert read_json(trial_dir / "metrics.json")["status"] == "completed"
        record = read_json(trial_dir / "environment.json")
        assert record["code_snapshot"] == {"path": str(code_dir), "commit": commit,
                                           "diff_sha256": snapshot["diff_sha256"]}

    # The control: outside a sweep, this venv imports the edited tree, marker and all.
    # (From the venv's folder: in tmp_path, the checkout's folder "hpcsweep" would import as a namespace.)
    imported = run([python, "-c", "import hpcsweep"], tmp_path / "venv", env, timeout=60)
    assert imported.returncode == 0, imported.stderr
    assert marker.read_text() == f"{init}\n"
