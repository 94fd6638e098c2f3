"""One GPU-hour figure on the real local cluster: a packed sweep's worst case, status and report agree with sacct.

Four trials packed two per task (``trials_per_task=2``) run as two array tasks of one node and 8
GPUs each. The test sums accounting itself (``sacct -X --duplicates``: elapsed x ``gres/gpu`` of
``AllocTRES``, time limit x GPUs for the worst case) and checks every figure the tools print
against it: the worst case said at submit, ``status``'s spent, ``report``'s total and its
``GPU-h`` column, which adds up to the total.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .conftest import SMALL_TRIAL, only_sweep_dir, read_json, run_hpcsweep, slurm, wait_until_ended

DISPLAY_REL = 5e-3
"""The tools print three significant digits."""


def tool(module: str, args: list[str], cwd, env) -> str:
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def sacct_hours(env, array_id: str) -> tuple[float, float, int]:
    """``(allocated GPU-hours of every run, worst case GPU-hours, tasks)`` of the array, from accounting alone."""
    out = slurm(env, "sacct", "-X", "--duplicates", "--noheader", "--parsable2", "-j", array_id,
                "--format=JobID,ElapsedRaw,AllocTRES,TimelimitRaw")
    spent, worst, tasks = 0.0, 0.0, set()
    for line in out.splitlines():
        job_id, elapsed, tres, limit_min = line.split("|")
        gpus = int(dict(item.split("=", 1) for item in tres.split(",") if "=" in item).get("gres/gpu", "0"))
        spent += int(elapsed) * gpus / 3600.0
        if job_id not in tasks:
            tasks.add(job_id)
            worst += int(limit_min) * gpus / 60.0
    return spent, worst, len(tasks)


def test_a_packed_sweeps_figures_agree_with_sacct(tmp_path, slurm_env):
    result = run_hpcsweep(["-m", "model.lr=1e-3,2e-3,3e-3,4e-3", *SMALL_TRIAL, "topology.mode=off",
                           "hydra.launcher.trials_per_task=2"], tmp_path, slurm_env, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    sweep_dir = only_sweep_dir(tmp_path)
    record = read_json(sweep_dir / "sweep.json")
    (array,) = record["arrays"]
    for job_id in sorted({t["job_id"] for t in record["trials"]}):
        assert wait_until_ended(slurm_env, job_id) == "COMPLETED"

    spent, worst, tasks = sacct_hours(slurm_env, array["array_job_id"])
    assert tasks == 2 and spent > 0
    # Before submit: two tasks of 8 GPUs for one 15-minute limit each, not four trials' worth.
    said = re.search(r"worst case (\S+) GPU-hours \(2 tasks \(4 trials, 2 per task\) x 1 node x 8 GPUs x 15 min\)",
                     output)
    assert said, output
    assert float(said.group(1)) == pytest.approx(worst) == 2 * 8 * 15 / 60

    shown = tool("hpcsweep.status", [str(sweep_dir), "--color=never"], tmp_path, slurm_env)
    status_spent = re.search(r"budget: (\S+) GPU-hours spent", shown)
    assert status_spent, shown
    assert float(status_spent.group(1)) == pytest.approx(spent, rel=DISPLAY_REL)

    table = tool("hpcsweep.report", [str(sweep_dir)], tmp_path, slurm_env)
    total = re.search(r"GPU-hours: (\S+) allocated in all", table)
    assert total, table
    assert float(total.group(1)) == pytest.approx(spent, rel=DISPLAY_REL)
    header, *lines = table.splitlines()
    words = header.split()
    # "mean tok/s" and "own GPU-h" are two header words each, their cells one.
    column, own_column = words.index("GPU-h") - 1, words.index("own") - 1
    rows = [line.split() for line in lines if line[:1].isdigit()]
    assert len(rows) == 4
    assert sum(float(row[column]) for row in rows) == pytest.approx(spent, rel=DISPLAY_REL, abs=2e-3)
    # Every trial ran on its task's allocation, and its own compute share is less than what that held
    # (8 GPUs for 1 worker, the startup, its pack-mate).
    own = [float(row[own_column]) for row in rows]
    assert all(float(row[column]) > 0 and o <= float(row[column]) for o, row in zip(own, rows)), table
    own_total = re.search(r"the trials' own share (\S+)", table)
    assert own_total and 0 < float(own_total.group(1)) < spent, table
