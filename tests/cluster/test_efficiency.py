"""report --efficiency on real Slurm sweeps: a 4-trial sweep where one trial reads its data slowly, and a
2-trial sweep of two MoE folders, one whose routers are pinned to two of their experts."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.model_folders import make_model_folder
from tests.moe_models import make_collapsed_moe_folder

from .conftest import SMALL_TRIAL, only_sweep_dir, read_json, run_hpcsweep, sacct_states, wait_for

SLOW_READ_MS = 200
"""Each training batch of the slow trial waits this long: ten times a tiny model's step on a loaded core."""


def swept_efficiency_report(tmp_path, slurm_env, overrides, trials):
    """Submit the sweep of ``overrides`` (``trials`` trials), wait until its array has ended, and
    return its sweep.json record, ``report --efficiency``'s lines and its table as ``{num: {column: cell}}``."""
    result = run_hpcsweep(["-m", *overrides], tmp_path, slurm_env, timeout=120)
    assert result.returncode == 0, result.stderr
    sweep_dir = only_sweep_dir(tmp_path)
    record = read_json(sweep_dir / "sweep.json")
    array_id = record["arrays"][0]["array_job_id"]

    def finished():
        states = sacct_states(slurm_env, array_id)
        return len(states) == trials and all(s == "COMPLETED" for s in states.values()) or any(
            s in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY") for s in states.values())

    wait_for(finished, timeout=300, what=f"array {array_id} to finish", interval=1)
    report = subprocess.run([sys.executable, "-m", "hpcsweep.report", str(sweep_dir), "--efficiency"],
                            env=slurm_env, capture_output=True, text=True, timeout=120, check=False)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    header, *cells = [line.split() for line in lines[: trials + 1]]
    rows = {int(cell[0]): dict(zip(header, cell)) for cell in cells}
    assert {row["status"] for row in rows.values()} == {"completed"}, report.stdout
    return record, lines, rows


def test_report_efficiency_flags_the_trial_that_waits_on_data(tmp_path, slurm_env):
    record, lines, rows = swept_efficiency_report(
        tmp_path, slurm_env, [f"data.read_delay_ms=0,0,0,{SLOW_READ_MS}", *SMALL_TRIAL], trials=4)
    slow, = [t["num"] for t in record["trials"] if f"data.read_delay_ms={SLOW_READ_MS}" in t["overrides"]]
    data = {num: float(row["data%"]) for num, row in rows.items()}
    assert data[slow] > 30, "\n".join(lines)  # 200 ms against some 90 ms of step on a loaded core
    assert all(share < 20 for num, share in data.items() if num != slow), "\n".join(lines)
    # On CPU there is no MFU: the rule says it compares tokens/s per worker instead.
    assert "throughput compared by tokens/s per worker (4 trials measured)" in "\n".join(lines)
    flagged = {int(m.group(1)): line for line in lines if (m := re.match(r"#(\d+): ", line))}
    assert slow in flagged, "\n".join(lines)
    assert re.search(r"\d+% of step time waits on data \(sweep median \d+%\)$", flagged[slow]), flagged[slow]
    assert not [line for num, line in flagged.items() if num != slow and "waits on data" in line], "\n".join(lines)


def test_report_efficiency_flags_the_moe_trial_whose_routing_collapsed(tmp_path, slurm_env):
    # 8 experts, top-2: the pinned folder routes every token to experts 0 and 1, 6 of 8 idle.
    healthy = make_model_folder(tmp_path / "healthy", n_routed_experts=8)
    pinned = make_collapsed_moe_folder(tmp_path / "pinned", n_routed_experts=8)
    record, lines, rows = swept_efficiency_report(
        tmp_path, slurm_env, ["model=pretrained", f"model.path={healthy},{pinned}", "data=synthetic", *SMALL_TRIAL], trials=2)
    collapsed, = [t["num"] for t in record["trials"] if f"model.path={pinned}" in t["overrides"]]
    loads = {num: float(row["load(max/mean)"]) for num, row in rows.items()}
    assert loads[collapsed] == 4.0 and all(load < 4.0 for num, load in loads.items() if num != collapsed), loads
    flagged = {int(m.group(1)): line for line in lines if (m := re.match(r"#(\d+): ", line))}
    assert list(flagged) == [collapsed], "\n".join(lines)
    assert flagged[collapsed] == (f"#{collapsed}: routing collapsed: layer 1: 6 of 8 experts got under 10% of the "
                                  "mean load, the most loaded expert got 4.00x the mean (ceiling 4)")
