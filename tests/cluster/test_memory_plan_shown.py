"""The memory plan shown to users on a real Slurm sweep: one line at submit, then plan and peak in
``report`` and ``status`` for each trial."""

from __future__ import annotations

import re
import subprocess
import sys

from .conftest import SMALL_TRIAL, only_sweep_dir, read_json, run_hpcsweep, sacct_states, wait_for


def hpcsweep_tool(module: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=120)


def test_a_lora_sweep_shows_its_plan_at_submit_and_plan_and_peak_after(tmp_path, slurm_env):
    result = run_hpcsweep(["-m", "model.lr=1e-4,3e-4,1e-3", "model.peft=lora", *SMALL_TRIAL], tmp_path, slurm_env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    # The three trials share one plan: one line, against the partition's A100s (80 GB GRES).
    plan_lines = [line for line in out.splitlines() if "memory plan: " in line]
    assert len(plan_lines) == 1, out[-3000:]
    assert re.search(r"memory plan: trials #0-2: ~\d+\.\d GB/GPU of 80 per A100 \(LoRA r=16, DDP\): fits$",
                     plan_lines[0]), plan_lines

    sweep_dir = only_sweep_dir(tmp_path)
    sweep = read_json(sweep_dir / "sweep.json")
    array_id = sweep["arrays"][0]["array_job_id"]

    def finished():
        states = sacct_states(slurm_env, array_id)
        ended = {job: s for job, s in states.items() if s not in ("PENDING", "RUNNING", "REQUEUED")}
        return states if len(ended) == 3 else None

    states = wait_for(finished, timeout=600, what=f"array {array_id} to finish")
    assert set(states.values()) == {"COMPLETED"}, states

    report = hpcsweep_tool("hpcsweep.report", [str(sweep_dir)], slurm_env)
    assert report.returncode == 0, report.stderr
    header, *rows = report.stdout.splitlines()[:4]
    assert header.split()[-1] == "GB(plan/peak)"
    status = hpcsweep_tool("hpcsweep.status", [str(sweep_dir)], slurm_env)
    for trial, row in zip(sweep["trials"], rows):
        metrics = read_json(tmp_path / trial["trial_dir"] / "metrics.json")
        plan, peak = metrics["memory_plan"], metrics["memory_peak"]
        # The dummy GPUs train on CPU: the plan's total (the interpreter included) against the resident set.
        assert plan["setup"]["peft"] == "lora" and peak["source"] == "ru_maxrss"
        shown = f"{plan['total_bytes'] / 2**30:.1f}/{peak['bytes'] / 2**30:.1f}"
        assert row.split()[-1] == shown, (row, shown)
        assert f"GB(plan/peak) {shown}" in status.stdout, status.stdout
