"""On the real cluster: a sweep submitted from a folder that holds a 50 MB corpus of 5,000 ``.txt`` files and
a model folder snapshots only its code, under 1 MB in all, and its trial runs hpcsweep from the snapshot's
archive (#31 item 8); a snapshot too large to be code is refused with nothing submitted; and ``export``
refuses the sweep while its trial is pending, then exports it once it has ended (#31 item 6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import SMALL_TRIAL, all_job_ids, only_sweep_dir, read_json, run_hpcsweep, slurm, submitted_from, \
    wait_until_ended


def sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that costs no disk writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)


def export(sweep_dir: Path, env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcsweep.export", str(sweep_dir), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_sweep_from_a_folder_of_data_snapshots_its_code_and_exports_once_ended(tmp_path, slurm_env):
    project = tmp_path / "project"
    (project / "helpers.py").parent.mkdir(parents=True)
    (project / "helpers.py").write_text("WIDTH = 8\n")
    for i in range(5000):
        sparse(project / "corpus" / f"doc-{i:05d}.txt", 10_000)
    for name, size in (("config.json", 1_500), ("model.safetensors", 20_000_000), ("tokenizer.json", 30_000),
                       ("tokenizer_config.json", 400)):
        sparse(project / "models" / "tiny-deepseek" / name, size)

    swept = run_hpcsweep(["-m", "model.lr=1e-4", *SMALL_TRIAL, "+hydra.launcher.additional_parameters.hold=true"],
                         project, slurm_env, timeout=300)
    assert swept.returncode == 0, (swept.stdout + swept.stderr)[-4000:]
    sweep_dir = only_sweep_dir(project)
    (trial,) = read_json(sweep_dir / "sweep.json")["trials"]
    code = sweep_dir / ".code"
    written = {p.relative_to(code).as_posix(): p.stat().st_size for p in code.rglob("*") if p.is_file()}
    # Of the project, helpers.py; hpcsweep's own packages in one archive; every file under .code: < 1 MB.
    assert sorted(written) == ["SNAPSHOT.json", "helpers.py", "hpcsweep.zip"]
    assert sum(written.values()) < 1_000_000, written
    snapshot = read_json(code / "SNAPSHOT.json")

    # Held in the queue: the sweep is still running, and export says so, naming the trial.
    held = export(sweep_dir, slurm_env, tmp_path, "--best", "--out", "early")
    assert held.returncode == 2, held.stdout + held.stderr
    assert "the sweep has not finished (trials #0 pending)" in held.stderr and "--allow-running" in held.stderr
    assert not (tmp_path / "early").exists()

    slurm(slurm_env, "scontrol", "release", trial["job_id"].split("_")[0])
    assert wait_until_ended(slurm_env, trial["job_id"], timeout=400) == "COMPLETED"
    # The trial's records module was imported from the snapshot (only its archive holds hpcsweep).
    environment = read_json(project / trial["trial_dir"] / "environment.json")
    assert environment["code_snapshot"] == {"path": str(code), "commit": snapshot["commit"],
                                            "diff_sha256": snapshot["diff_sha256"]}
    done = export(sweep_dir, slurm_env, tmp_path, "--best", "--out", "adapter")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exported trial #0 (step00000008" in done.stdout


def test_a_snapshot_too_large_to_be_code_is_refused_before_anything_is_submitted(tmp_path, slurm_env):
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "train_helpers.py").write_text("X = 1\n")
    for i in range(40):  # package data, each file under the 1 MiB limit, 36 MB in all
        sparse(project / "pkg" / f"table{i:02d}.dat", 900_000)
    before = all_job_ids(slurm_env)
    refused = run_hpcsweep(["-m", "model.lr=1e-4", *SMALL_TRIAL], project, slurm_env, timeout=300)
    output = refused.stdout + refused.stderr
    assert refused.returncode == 2, output
    assert "the code snapshot (hydra.launcher.code_snapshot) of" in output and "would copy" in output, output
    assert "nothing was submitted" in output and "Traceback" not in output, output
    assert not submitted_from(slurm_env, project, before)
    assert not list(project.glob("multirun/*/*/.code"))
