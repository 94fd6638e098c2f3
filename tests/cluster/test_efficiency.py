"""report --efficiency on a real 4-trial Slurm sweep where one trial reads its data slowly."""

from __future__ import annotations

import re
import subprocess
import sys

from .conftest import SMALL_TRIAL, only_sweep_dir, read_json, run_hpcsweep, sacct_states, wait_for

SLOW_READ_MS = 200
"""Each training batch of the slow trial waits this long: ten times a tiny model's step on a loaded core."""


def test_report_efficiency_flags_the_trial_that_waits_on_data(tmp_path, slurm_env):
    delays = f"0,0,0,{SLOW_READ_MS}"
    result = run_hpcsweep(["-m", f"data.read_delay_ms={delays}", *SMALL_TRIAL], tmp_path, slurm_env, timeout=120)
    assert result.returncode == 0, result.stderr
    sweep_dir = only_sweep_dir(tmp_path)
    record = read_json(sweep_dir / "sweep.json")
    slow, = [t["num"] for t in record["trials"] if f"data.read_delay_ms={SLOW_READ_MS}" in t["overrides"]]
    array_id = record["arrays"][0]["array_job_id"]

    def finished():
        states = sacct_states(slurm_env, array_id)
        return len(states) == 4 and all(s == "COMPLETED" for s in states.values()) or any(
            s in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY") for s in states.values())

    wait_for(finished, timeout=300, what=f"array {array_id} to finish", interval=1)
    report = subprocess.run([sys.executable, "-m", "hpcsweep.report", str(sweep_dir), "--efficiency"],
                            env=slurm_env, capture_output=True, text=True, timeout=120, check=False)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    header, *cells = [line.split() for line in lines[:5]]
    rows = {int(cell[0]): dict(zip(header, cell)) for cell in cells}
    assert {row["status"] for row in rows.values()} == {"completed"}, report.stdout
    data = {num: float(row["data%"]) for num, row in rows.items()}
    assert data[slow] > 30, report.stdout  # 200 ms against some 90 ms of step on a loaded core
    assert all(share < 20 for num, share in data.items() if num != slow), report.stdout
    # On CPU there is no MFU: the rule says it compares tokens/s per worker instead.
    assert "throughput compared by tokens/s per worker (4 trials measured)" in report.stdout
    flagged = {int(m.group(1)): line for line in lines if (m := re.match(r"#(\d+): ", line))}
    assert slow in flagged, report.stdout
    assert re.search(r"\d+% of step time waits on data \(sweep median \d+%\)$", flagged[slow]), flagged[slow]
    assert not [line for num, line in flagged.items() if num != slow and "waits on data" in line], report.stdout
