"""A plain, non-editable ``pip install .`` carries the configs and the launchers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from ..venvs import venv_on_these_packages

REPO = Path(__file__).resolve().parents[2]


def test_plain_install_runs_cfg_job_from_another_folder(tmp_path):
    python = venv_on_these_packages(tmp_path / "venv")
    env_dir = tmp_path / "venv"
    # A copy, so that the build leaves nothing in the work tree and no stale build/ leaks in.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", ".venv"))
    # With build isolation pip brings the build requirements (setuptools, wheel) itself: the test
    # assumes nothing about what the interpreter running it has.
    build = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(source)],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run(
        [str(python), "-c", "import hpcsweep.configs, hydra_plugins.hpcsweep_plugins as l; "
         "print(hpcsweep.configs.__file__); print(l.__file__)"],
        cwd=elsewhere, check=True, capture_output=True, text=True, timeout=60,
    ).stdout.split()
    assert all(str(env_dir) in path for path in where), where

    result = subprocess.run(
        [str(python), "-m", "hpcsweep", "--cfg", "job", "model.lr=5e-4"],
        cwd=elsewhere, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "lr: 0.0005" in result.stdout
    assert "arch: deepseek_v3" in result.stdout
    launcher = subprocess.run(
        [str(python), "-m", "hpcsweep", "--cfg", "hydra", "hydra/launcher=slurm"],
        cwd=elsewhere, capture_output=True, text=True, timeout=120,
    )
    assert launcher.returncode == 0, launcher.stderr
    assert "_target_: hydra_plugins.hpcsweep_plugins.launchers.SlurmLauncher" in launcher.stdout
    assert "gpus_per_node: 8" in launcher.stdout
