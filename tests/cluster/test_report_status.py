"""report and status on a real 4-trial Slurm sweep where one trial fails at run time."""

from __future__ import annotations

import csv
import subprocess
import sys

from .conftest import SMALL_TRIAL, only_sweep_dir, run_hpcsweep, sacct_states, wait_for

# A corpus of 100 tokens is a valid config but too short for seq_len 32: that trial fails when it
# loads its data, on the compute node, after submission.
TOKENS = ("20000", "40000", "60000", "100")


def hpcsweep_tool(module: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_report_and_status_of_a_sweep_with_a_failed_trial(tmp_path, slurm_env):
    result = run_hpcsweep(["-m", f"data.synthetic_tokens={','.join(TOKENS)}", *SMALL_TRIAL], tmp_path, slurm_env, timeout=120)
    assert result.returncode == 0, result.stderr
    sweep_dir = only_sweep_dir(tmp_path)

    running = hpcsweep_tool("hpcsweep.status", [str(sweep_dir)], slurm_env)
    assert "4 trials" in running.stdout, running.stderr

    array_id = (sweep_dir / "sweep.json").read_text().split('"array_job_id": "')[1].split('"')[0]

    def finished():
        states = sacct_states(slurm_env, array_id)
        ended = [s for s in states.values() if s not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING")]
        return len(ended) == len(TOKENS)

    wait_for(finished, timeout=300, what=f"array {array_id} to finish", interval=2)

    out_csv, out_png = tmp_path / "report.csv", tmp_path / "report.png"
    report = hpcsweep_tool("hpcsweep.report", [str(sweep_dir), "--csv", str(out_csv), "--plot", str(out_png)], slurm_env)
    assert report.returncode == 0, report.stderr
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == len(TOKENS)
    by_tokens = {row["data.synthetic_tokens"]: row for row in rows}
    assert [by_tokens[t]["status"] for t in TOKENS] == ["completed", "completed", "completed", "failed"]
    assert rows[-1]["data.synthetic_tokens"] == "100"  # failed trials sort last
    assert "longer than a split of the corpus" in by_tokens["100"]["error"]
    assert all(row["slurm_state"] for row in rows)
    assert all(float(by_tokens[t]["best_val_loss"]) > 0 for t in TOKENS[:3])
    assert "#3 failed: ValueError: data.seq_len=32 is not allowed" in report.stdout
    assert out_png.stat().st_size > 1000

    status = hpcsweep_tool("hpcsweep.status", [str(sweep_dir), "--logs", "3"], slurm_env)
    assert status.returncode == 1, status.stdout + status.stderr
    assert "3 completed, 1 failed" in status.stdout
    assert "error: ValueError: data.seq_len=32 is not allowed" in status.stdout
