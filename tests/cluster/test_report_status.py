"""report and status on a real 4-trial Slurm sweep where one trial fails at run time; what issue 41 found in a
first hour on it: a pipe closed by ``head``, a shell without ``SLURM_CONF``, the install a trial records when the
sweep runs from a data folder."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np

from .conftest import SMALL_TRIAL, only_sweep_dir, run_hpcsweep, sacct_states, wait_for

# Four token files; the last one's header understates its vocabulary (256, where its ids go to
# 4,999). Nothing before the run reads every token, so that trial passes every check before submit
# and fails at its first batch on the compute node (an id past the embedding: the trial's own
# data, not where it ran, so it is not retried).
CORPORA = ("a", "b", "c", "bad")


def write_corpora(folder) -> list[str]:
    paths = []
    for name in CORPORA:
        path = folder / f"{name}.bin"
        ids = np.arange(5_000, dtype=np.uint16) if name == "bad" else np.random.default_rng(len(name)).integers(
            0, 256, 20_000, dtype=np.uint16)
        ids.tofile(path)
        path.with_suffix(".json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 256, "num_tokens": len(ids)}))
        paths.append(str(path))
    return paths


def hpcsweep_tool(module: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_report_and_status_of_a_sweep_with_a_failed_trial(tmp_path, slurm_env):
    paths = write_corpora(tmp_path)
    result = run_hpcsweep(["-m", "data=file", f"data.path={','.join(paths)}", "model.vocab_size=256", *SMALL_TRIAL],
                          tmp_path, slurm_env, timeout=120)
    assert result.returncode == 0, result.stderr
    sweep_dir = only_sweep_dir(tmp_path)

    running = hpcsweep_tool("hpcsweep.status", [str(sweep_dir)], slurm_env)
    assert "4 trials" in running.stdout, running.stderr

    array_id = (sweep_dir / "sweep.json").read_text().split('"array_job_id": "')[1].split('"')[0]

    def finished():
        states = sacct_states(slurm_env, array_id)
        ended = [s for s in states.values() if s not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING")]
        return len(ended) == len(CORPORA)

    wait_for(finished, timeout=300, what=f"array {array_id} to finish", interval=2)

    out_csv, out_png = tmp_path / "report.csv", tmp_path / "report.png"
    report = hpcsweep_tool("hpcsweep.report", [str(sweep_dir), "--csv", str(out_csv), "--plot", str(out_png)], slurm_env)
    assert report.returncode == 0, report.stderr
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == len(CORPORA)
    by_path = {row["data.path"]: row for row in rows}
    assert [by_path[p]["status"] for p in paths] == ["completed", "completed", "completed", "failed"]
    assert rows[-1]["data.path"] == paths[-1]  # failed trials sort last
    assert "IndexError: index out of range in self" in by_path[paths[-1]]["error"]
    assert all(row["slurm_state"] for row in rows)
    assert all(float(by_path[p]["best_val_loss"]) > 0 for p in paths[:3])
    assert "#3 failed: IndexError: index out of range in self" in report.stdout
    assert out_png.stat().st_size > 1000

    status = hpcsweep_tool("hpcsweep.status", [str(sweep_dir), "--logs", "3"], slurm_env)
    assert status.returncode == 1, status.stdout + status.stderr
    assert "3 completed, 1 failed" in status.stdout
    assert "error: IndexError: index out of range in self" in status.stdout

    # report | head -1: the pipe closes after one line; report exits 0, quietly, with its CSV written.
    piped_csv = tmp_path / "piped.csv"
    piped = subprocess.run(f"set -o pipefail; {sys.executable} -m hpcsweep.report {sweep_dir} --markdown --csv {piped_csv} "
                           "| head -1", shell=True, executable="/bin/bash", env=slurm_env, capture_output=True,
                           text=True, timeout=120)
    assert piped.returncode == 0 and "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr, piped.stderr
    assert len(piped.stdout.splitlines()) == 1 and len(list(csv.DictReader(piped_csv.open()))) == len(CORPORA)

    # A shell without the cluster's environment: status says the Slurm configuration is not found, and how to set it.
    # (SLURM_CONF names a missing file here, not unset: a machine may have a default /etc/slurm/slurm.conf.)
    lost = {**slurm_env, "SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}
    confused = hpcsweep_tool("hpcsweep.status", [str(sweep_dir)], lost)
    assert (f"Slurm's configuration was not found: SLURM_CONF={tmp_path}/no-such-slurm.conf is no file"
            in confused.stdout + confused.stderr), confused.stdout + confused.stderr
    assert "scripts/slurm-cluster env" in confused.stdout + confused.stderr

    # Run from a data folder (tmp_path), each trial still records the hpcsweep it ran: version and commit.
    import hpcsweep

    recorded = json.loads((sweep_dir / "0" / "environment.json").read_text())["hpcsweep"]
    assert recorded["version"] == hpcsweep.__version__ and len(recorded["commit"]) == 40, recorded
