"""A Hydra app that is not hpcsweep (``tests/foreign_app``), installed the plain way, swept by our launchers.

Unit and cluster tests share this: the venv with both packages installed non-editable, running a
sweep as a user would (a subprocess), and the JobReturns Hydra's sweeper got from the launcher.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .venvs import venv_on_these_packages

REPO = Path(__file__).resolve().parents[1]
FOREIGN_APP = REPO / "tests" / "foreign_app"
_BUILD_LEFTOVERS = shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", ".venv")

# Sweeps and the JobReturns Hydra numbers for them: (hydra.job.num, task overrides, return value).
TWO_GROUPS = ["db=mysql,postgres", "server=apache,nginx"]
TWO_GROUPS_RETURNS = [
    (0, ["db=mysql", "server=apache"], "mysql:80"),
    (1, ["db=mysql", "server=nginx"], "mysql:8080"),
    (2, ["db=postgres", "server=apache"], "postgresql:80"),
    (3, ["db=postgres", "server=nginx"], "postgresql:8080"),
]
# ``db`` is a mandatory default (``- db: ???``) that only the sweep fills in.
MANDATORY_DEFAULT = ["db=mysql,postgres"]
MANDATORY_DEFAULT_RETURNS = [
    (0, ["db=mysql"], "mysql:80"),
    (1, ["db=postgres"], "postgresql:80"),
]

SWEEPS = {
    "two_groups": (TWO_GROUPS, TWO_GROUPS_RETURNS),
    "mandatory_default": (MANDATORY_DEFAULT, MANDATORY_DEFAULT_RETURNS),
}
"""Each sweep's overrides and its expected (num, overrides, value) returns, by test id."""


def install_foreign_app(tmp_path: Path) -> Path:
    """A fresh venv with hpcsweep and the foreign app, each from a copy by a plain ``pip install``; its python."""
    python = venv_on_these_packages(tmp_path / "venv")
    sources = []
    for name, tree in (("hpcsweep-source", REPO), ("foreign-app-source", FOREIGN_APP)):
        # A copy, so that the build leaves nothing in the work tree and no stale build/ leaks in.
        shutil.copytree(tree, tmp_path / name, ignore=_BUILD_LEFTOVERS)
        sources.append(str(tmp_path / name))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", *sources],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    where = subprocess.run(
        [str(python), "-c", "import foreign_app, hydra_plugins.hpcsweep_plugins as p; print(foreign_app.__file__, p.__file__)"],
        cwd=tmp_path, check=True, capture_output=True, text=True, timeout=60,
    ).stdout.split()
    assert all(path.startswith(str(tmp_path / "venv")) for path in where), where
    return python


def run_foreign_sweep(
    python: Path,
    cwd: Path,
    sweep_dir: Path,
    overrides: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]] | None]:
    """``foreign-app -m OVERRIDES hydra.sweep.dir=SWEEP_DIR`` from ``cwd``, through ``foreign_app.record_returns``.

    Returns the process and the JobReturns the launcher handed to Hydra's sweeper (all batches in
    order, as ``foreign_app.record_returns.describe`` writes them), or None when it wrote none.
    """
    returns_file = cwd / f"{sweep_dir.name}.returns.json"
    returns_file.unlink(missing_ok=True)
    proc = subprocess.run(
        [str(python), "-m", "foreign_app.record_returns", str(returns_file), "-m", *overrides,
         f"hydra.sweep.dir={sweep_dir}"],
        cwd=cwd, env=None if env is None else dict(env), capture_output=True, text=True, timeout=timeout,
    )
    if not returns_file.exists():
        return proc, None
    return proc, [r for batch in json.loads(returns_file.read_text()) for r in batch]


def assert_hydra_job_returns(
    returns: list[dict[str, Any]], sweep_dir: Path, expected: Sequence[tuple[int, list[str], str]]
) -> None:
    """The JobReturns are Hydra's usual ones: values, overrides, and dirs numbered ``SWEEP_DIR/NUM``."""
    assert [(r["num"], r["overrides"], r["return_value"]) for r in returns] == list(expected)
    for r, (num, overrides, value) in zip(returns, expected, strict=True):
        job_dir = sweep_dir / str(num)
        assert r["status"] == "COMPLETED", r
        assert r["task_name"] == "app", r
        # hydra.job.chdir is true in the app: the working dir is the job's numbered output dir.
        assert Path(r["working_dir"]) == job_dir, r
        assert Path(r["output_dir"]) == job_dir, r
        assert (job_dir / "result.txt").read_text() == value + "\n"
        job_end = json.loads((job_dir / "job_end.json").read_text())
        assert (job_end["num"], job_end["overrides"], job_end["return_value"]) == (num, overrides, value)
        assert Path(job_end["working_dir"]) == job_dir


def assert_sweep_record(sweep_dir: Path, launcher: str, expected: Sequence[tuple[int, list[str], str]]) -> dict:
    """``SWEEP_DIR/sweep.json`` lists every job with its overrides and numbered dir; returns it."""
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["launcher"] == launcher
    assert [(t["num"], t["overrides"], Path(t["trial_dir"])) for t in record["trials"]] == [
        (num, overrides, sweep_dir / str(num)) for num, overrides, _ in expected
    ]
    return record


def comparable(returns: list[dict[str, Any]], sweep_dir: Path) -> list[dict[str, Any]]:
    """The JobReturns with the sweep dir replaced, to compare two sweeps run into different dirs."""
    text = json.dumps(returns).replace(str(sweep_dir), "SWEEP_DIR")
    return json.loads(text)
