"""The README's own commands, verbatim, from a fresh venv on a copy of the repo: a newcomer's first hour.

The commands are read out of README.md, so the test follows the README and the README cannot drift
from what works. The local sweep runs where no Slurm answers; the Slurm commands run on the local
cluster with the launcher defaults a user gets, and every trial must complete.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from ..venvs import venv_on_these_packages
from .conftest import REPO, read_json, sacct_states, wait_until_ended

README = REPO / "README.md"
# Enough for every command at once on 2 cores: 3 two-node trials, one two-node sbatch trial and a
# sweep driver with 3 trials, 200 steps each.
TOUR_TIMEOUT_S = 1200


def readme_commands(text: str) -> list[str]:
    """Every command in the README's indented code blocks, continuation lines joined."""
    lines = [line[4:] for line in text.splitlines() if line.startswith("    ") and line.strip()]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [re.sub(r"\s+", " ", line).strip() for line in joined.splitlines()]


def readme_command(prefix: str) -> str:
    """The first README command that starts with ``prefix``, up to a comment."""
    for command in readme_commands(README.read_text()):
        if command.startswith(prefix):
            return command.split("  #")[0].strip()
    raise AssertionError(f"README.md shows no command starting with {prefix!r}")


def test_readme_commands_are_found():
    assert readme_commands("x\n\n    a b \\\n        c  # note\n    d\n") == ["a b c # note", "d"]
    assert readme_command("pip install") == "pip install torch==2.13.0 -e . && python -m hpcsweep -m model.lr=1e-4,3e-4"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the repo as a clone has it, with a fresh venv whose bin/ comes first on PATH."""
    root = tmp_path_factory.mktemp("tour")
    repo = root / "hpcsweep"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "multirun", "outputs", "slurm-*.out"))
    venv_on_these_packages(root / "venv", with_pip=True)
    return repo


def user_env(checkout: Path, slurm_env: dict[str, str] | None) -> dict[str, str]:
    """A shell's environment with the venv activated; without Slurm unless ``slurm_env`` is given."""
    base = dict(slurm_env if slurm_env is not None else os.environ)
    if slurm_env is None:
        base.pop("SLURM_CONF", None)
    venv_bin = checkout.parent / "venv" / "bin"
    base.update(VIRTUAL_ENV=str(venv_bin.parent), PATH=f"{venv_bin}{os.pathsep}{base.get('PATH', '')}")
    base.pop("PYTHONPATH", None)
    return base


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def sweep_dirs(cwd: Path) -> list[Path]:
    return sorted(p.parent for p in cwd.glob("multirun/*/*/sweep.json"))


def assert_completed(trial_dir: Path) -> dict:
    metrics = read_json(trial_dir / "metrics.json")
    assert metrics["status"] == "completed", (trial_dir, metrics.get("error"))
    assert metrics["step"] == metrics["max_steps"] == 200
    assert len(metrics["weights_sha256"]) == 64
    return metrics


def test_first_command_installs_and_runs_a_local_sweep(checkout):
    install, sweep = readme_command("pip install").split(" && ")
    env = user_env(checkout, None)
    installed = run(shlex.split(install), checkout, env, timeout=900)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    ran = run(shlex.split(sweep), checkout, env, timeout=900)
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out[-4000:]
    assert ": running locally" in out
    (sweep_dir,) = sweep_dirs(checkout)
    trials = read_json(sweep_dir / "sweep.json")["trials"]
    assert len(trials) == 2
    hashes = {assert_completed(checkout / t["trial_dir"])["weights_sha256"] for t in trials}
    assert len(hashes) == 2
    shutil.rmtree(checkout / "multirun")


def submitted_job_id(stdout: str) -> str:
    match = re.search(r"Submitted batch job (\d+)", stdout)
    assert match, stdout
    return match.group(1)


def test_readme_slurm_commands_run_verbatim_to_completion(checkout, slurm_env):
    env = user_env(checkout, slurm_env)
    # The venv's hpcsweep is installed by the first command; install it here too when run alone.
    if not (checkout.parent / "venv" / "bin" / "hpcsweep").exists():
        assert run(["pip", "install", "-e", "."], checkout, env, timeout=900).returncode == 0

    sweep = readme_command("python -m hpcsweep -m model.lr=1e-4,3e-4,1e-3 trainer.nodes=2")
    train = readme_command("sbatch --nodes=2 slurm/train.sbatch")
    driver = readme_command("sbatch slurm/sweep.sbatch")

    swept = run(shlex.split(sweep), checkout, env, timeout=300)
    assert swept.returncode == 0, (swept.stdout + swept.stderr)[-4000:]
    assert "launcher: slurm" in swept.stdout + swept.stderr
    (sweep_dir,) = sweep_dirs(checkout)
    train_job = submitted_job_id(run(shlex.split(train), checkout, env, timeout=60).stdout)
    driver_job = submitted_job_id(run(shlex.split(driver), checkout, env, timeout=60).stdout)

    trials = read_json(sweep_dir / "sweep.json")["trials"]
    assert len(trials) == 3 and len({t["job_id"].split("_")[0] for t in trials}) == 1
    for trial in trials:
        assert wait_until_ended(slurm_env, trial["job_id"], timeout=TOUR_TIMEOUT_S) == "COMPLETED"
        assert_completed(checkout / trial["trial_dir"])
        nodes = read_json(checkout / trial["trial_dir"] / "environment.json")["slurm"]["nodelist"]
        assert nodes.startswith("node"), nodes

    assert wait_until_ended(slurm_env, train_job, timeout=TOUR_TIMEOUT_S) == "COMPLETED"
    metrics = assert_completed(checkout / "outputs" / f"sbatch-{train_job}")
    assert metrics["world_size"] == 2 and len({r["node"] for r in metrics["ranks"]}) == 2

    assert wait_until_ended(slurm_env, driver_job, timeout=300) == "COMPLETED"
    driven = [d for d in sweep_dirs(checkout) if d != sweep_dir]
    assert len(driven) == 1, driven
    driven_trials = read_json(driven[0] / "sweep.json")["trials"]
    assert len(driven_trials) == 3
    for trial in driven_trials:
        assert wait_until_ended(slurm_env, trial["job_id"], timeout=TOUR_TIMEOUT_S) == "COMPLETED"
        assert_completed(checkout / trial["trial_dir"])
    # Every array task is in accounting under its ARRAYID_TASK id.
    array_id = trials[0]["job_id"].split("_")[0]
    assert sorted(sacct_states(slurm_env, array_id)) == sorted(t["job_id"] for t in trials)
