"""Profiler traces on the real local cluster: one 2-node trial (a process per node) takes the window of
``trainer.profile_steps`` and then, while it runs, the steps ``python -m hpcsweep.profile`` asks for;
every rank leaves a Perfetto JSON trace of exactly those steps. The trial is cancelled afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import SMALL_TRIAL, only_sweep_dir, read_json, run_hpcsweep, slurm, wait_for, wait_until_ended

# Many steps of the tiny model: the trial is still running when the request comes, and is cancelled after it.
LONG_TRIAL = [o for o in SMALL_TRIAL if o.split("=")[0] not in (
    "trainer.max_steps", "trainer.eval_every", "trainer.ckpt_every", "trainer.log_every")] + [
    "trainer.max_steps=5000", "trainer.eval_every=5000", "trainer.ckpt_every=0", "trainer.log_every=10",
    "trainer.nodes=2", "trainer.nproc_per_node=1", "trainer.profile_steps=[3,4]", "topology.mode=off",
]
RANKS = 2


def step_labels(trace: Path) -> list[str]:
    """The ``step N`` labels of a trace in time order, once it reads as Perfetto's JSON trace format."""
    events = json.loads(trace.read_text())["traceEvents"]
    timed = [e for e in events if e.get("ph") == "X"]
    assert timed and all({"ph", "ts", "name", "pid", "tid"} <= e.keys() for e in timed), trace
    return [e["name"] for e in sorted(timed, key=lambda e: e["ts"]) if e["name"].startswith("step ")]


def test_a_two_node_trial_leaves_a_trace_per_rank_of_its_window_and_of_the_steps_asked_for(tmp_path, slurm_env):
    result = run_hpcsweep(["-m", *LONG_TRIAL], tmp_path, slurm_env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = only_sweep_dir(tmp_path)
    (trial,) = read_json(sweep_dir / "sweep.json")["trials"]
    trial_dir, job_id = tmp_path / trial["trial_dir"], trial["job_id"]
    try:
        window = [trial_dir / "profile" / "steps-3-4" / f"rank{r}.json" for r in range(RANKS)]
        wait_for(lambda: all(p.exists() for p in window), timeout=180, what="the traces of steps 3-4")
        assert [step_labels(p) for p in window] == [["step 3", "step 4"]] * RANKS

        asked = subprocess.run(
            [sys.executable, "-m", "hpcsweep.profile", str(sweep_dir), "--trial", "0", "--steps", "3", "--wait",
             "--timeout", "120"], cwd=tmp_path, env=slurm_env, capture_output=True, text=True, timeout=180)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        shown = [Path(line.strip()) for line in asked.stdout.splitlines() if line.startswith("  ")]
        assert [p.name for p in shown] == [f"rank{r}.json" for r in range(RANKS)], asked.stdout
        start, end = (int(n) for n in shown[0].parent.name.removeprefix("steps-").split("-"))
        assert end - start == 2 and start > 4, asked.stdout
        assert f"trial #0 profiled steps {start}-{end}:" in asked.stdout
        assert [step_labels(p) for p in shown] == [[f"step {n}" for n in range(start, end + 1)]] * RANKS

        status = subprocess.run([sys.executable, "-m", "hpcsweep.status", str(sweep_dir)], cwd=tmp_path,
                                env=slurm_env, capture_output=True, text=True, timeout=60)
        assert f"profile: {trial_dir}/profile/steps-{start}-{end}/" in status.stdout, status.stdout
    finally:
        slurm(slurm_env, "scancel", job_id)
    assert wait_until_ended(slurm_env, job_id, timeout=120).startswith("CANCELLED")
