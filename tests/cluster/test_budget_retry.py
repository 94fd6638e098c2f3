"""A sweep that keeps to its GPU-hour budget, then ``python -m hpcsweep.retry`` finishes it.

Six trials on four nodes (one trial fills a node: 64 CPUs and 8 GPUs): four run, two wait. The
budget lets the four running trials start and train a while, then runs out; the running trials
stop with a checkpoint and the waiting ones are cancelled (or, had they started, skipped). A retry
of those with a larger budget completes every trial. The sweep repeats the first two learning
rates as trials 4 and 5, which wait in the first phase and run uninterrupted in the retry: the
reference weights for trials 0 and 1, which resume.

Nothing here assumes how fast this machine is: the budget and the trial's length come from a timed
one-trial sweep of the same trial in the same test, and every bound from what the trials recorded.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time

from hpcsweep.results.table import recorded_seconds
from hpcsweep.trial.budget_watch import horizon_s

from .conftest import (
    SMALL_TRIAL,
    all_job_ids,
    read_json,
    run_hpcsweep,
    wait_for,
)

TRIAL = [o for o in SMALL_TRIAL if not o.startswith(("trainer.max_steps", "trainer.eval_every", "trainer.ckpt_every",
                                                    "trainer.log_every"))] + [
    "trainer.log_every=10", "topology.mode=off",
]
TOKENS_PER_STEP = 4 * 32
"""``data.batch_size`` x ``data.seq_len`` of SMALL_TRIAL."""
GPUS = 8
"""GPUs per trial: the launcher's ``gpus_per_node`` (``trainer.nproc_per_node=auto``)."""
RUNNING = 4
"""Trials that start at once, one per node; the other two wait."""
START_MARGIN = 3
"""Four array tasks starting at once reach their first step within this many times one task alone,
measured just before (the sharing of the cores, and the load rising meanwhile)."""
SPEED_MARGIN = 1.5
"""The trials train at most this many times faster than the calibration trial did (the load may fall;
on 2 cores four trials at once train at half one trial's speed besides)."""
POLL_S = 2
ENDED = ("completed", "stopped", "skipped_budget", "cancelled", "failed")


def calibrate(tmp_path, env) -> tuple[float, float]:
    """One array task of TRIAL on this cluster, now: seconds from submission to its first step, and a step's time."""
    cwd = tmp_path / "calibration"
    cwd.mkdir()
    started = time.monotonic()
    result = run_hpcsweep(["-m", *TRIAL, "trainer.max_steps=60", "trainer.eval_every=60", "trainer.ckpt_every=0"],
                          cwd, env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics_path = next(cwd.glob("multirun/*/*/sweep.json")).parent / "0" / "metrics.json"
    wait_for(lambda: metrics_path.exists() and read_json(metrics_path).get("step", 0) >= 1, timeout=900,
             what="the calibration trial's first step", interval=0.2)
    start_s = time.monotonic() - started
    metrics = wait_for(lambda: (m := read_json(metrics_path)).get("status") in ENDED and m, timeout=900,
                       what="the calibration trial to end")
    assert metrics["status"] == "completed", metrics
    return start_s, TOKENS_PER_STEP / metrics["tokens_per_s"]


def recorded_step_s(metrics: dict) -> float:
    """An upper bound of one step of a trial, from its own metrics.json: its run time over its steps (at least one)."""
    seconds = recorded_seconds(metrics)
    assert seconds is not None, metrics
    return (seconds + 1) / max(1, metrics["step"])  # a second's slack: sacct counts each run in whole seconds


def tool(module: str, args: list[str], cwd, env) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def sacct_spent_hours(env, array_ids: list[str]) -> float:
    """GPU-hours of every run of the arrays' tasks, from accounting (the test's own sum)."""
    out = subprocess.run(
        ["sacct", "--noheader", "--parsable2", "--allocations", "--duplicates", "--jobs", ",".join(array_ids),
         "--format=JobID,ElapsedRaw,AllocTRES"], env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    total = 0.0
    for line in out.splitlines():
        _, elapsed, tres = line.split("|")
        gpus = dict(item.split("=", 1) for item in tres.split(",") if "=" in item).get("gres/gpu", "0")
        total += int(elapsed or 0) * int(gpus) / 3600.0
    return total


def statuses(sweep_dir, env) -> dict[int, str]:
    out = tool("hpcsweep.status", [str(sweep_dir), "--color=never"], sweep_dir, env).stdout
    found = {}
    for line in out.splitlines():
        if line.startswith("#"):
            num, _params, status = line.split()[:3]
            found[int(num[1:])] = status
    return found


def test_budget_stops_the_sweep_and_retry_completes_it(tmp_path, slurm_env):
    # One thread each: on shared cores, thread pools spinning against each other make a step's time erratic.
    env = {**slurm_env, "HPCSWEEP_BUDGET_POLL_S": str(POLL_S), "OMP_NUM_THREADS": "1"}
    start_s, one_step_s = calibrate(tmp_path, env)
    # The budget runs out (less the watch's look ahead) window_s after the four tasks start: after each
    # has started training, and a trainer that starts trains at least one step and saves before it
    # stops. Even at SPEED_MARGIN times the calibrated speed, the steps take longer than the window.
    window_s = START_MARGIN * start_s
    steps = math.ceil(SPEED_MARGIN * window_s / one_step_s)
    budget = RUNNING * GPUS * (window_s + horizon_s(POLL_S)) / 3600.0
    print(f"calibration: first step {start_s:.1f} s after submission, a step {one_step_s:.3f} s; {steps} steps, "
          f"budget {budget * 3600:.0f} GPU-s")
    trial = [*TRIAL, f"trainer.max_steps={steps}", f"trainer.eval_every={steps // 2}",
             f"trainer.ckpt_every={steps // 3}"]
    started = time.monotonic()
    result = run_hpcsweep(["-m", "model.lr=1e-3,2e-3,3e-3,4e-3,1e-3,2e-3", *trial,
                           f"hydra.launcher.budget_gpu_hours={budget}"], tmp_path, env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    worst = 6 * GPUS * 15 / 60
    assert f"worst case {worst:g} GPU-hours (6 trials x 1 node x 8 GPUs x 15 min); budget {budget:g} GPU-hours" in (
        result.stdout + result.stderr)
    sweep_dir = next(tmp_path.glob("multirun/*/*/sweep.json")).parent
    record = read_json(sweep_dir / "sweep.json")
    assert record["budget_gpu_hours"] == budget
    trial_dirs = {t["num"]: sweep_dir / str(t["num"]) for t in record["trials"]}

    first = wait_for(lambda: (s := statuses(sweep_dir, env)) and all(v in ENDED for v in s.values()) and s,
                     timeout=300 + 3 * window_s, what="every trial to stop, be cancelled or skipped", interval=2)
    print(f"first phase: {time.monotonic() - started:.0f} s, statuses {first}")
    assert set(first.values()) <= {"stopped", "cancelled", "skipped_budget", "completed"}, first
    assert {first[4], first[5]} <= {"cancelled", "skipped_budget"}, first
    stopped = [n for n, s in first.items() if s == "stopped"]
    assert {0, 1} <= set(stopped), first
    stopped_metrics = {n: read_json(trial_dirs[n] / "metrics.json") for n in stopped}
    for num, metrics in stopped_metrics.items():
        assert metrics["last_stop_reason"] == "budget" and 0 < metrics["step"] < steps, metrics
        assert list((trial_dirs[num] / "checkpoints").glob("step*")), f"trial {num} stopped without a checkpoint"

    # Spent: at most the budget plus one step of each trial that was running.
    spent = sacct_spent_hours(env, [record["arrays"][0]["array_job_id"]])
    longest_step_s = max(recorded_step_s(m) for m in stopped_metrics.values())
    print(f"budget {budget * 3600:.0f} GPU-s, spent {spent * 3600:.0f} GPU-s; {len(stopped)} trials stopped, "
          f"a step at most {longest_step_s:.3f} s")
    assert spent <= budget + len(stopped) * GPUS * longest_step_s / 3600.0, (spent * 3600, budget * 3600)
    shown = tool("hpcsweep.status", [str(sweep_dir), "--color=never"], tmp_path, env).stdout
    assert f"/ {budget:.3g} GPU-hours spent" in shown, shown
    assert "BUDGET SPENT" in shown or "80% OF BUDGET" in shown, shown

    retried = tool("hpcsweep.retry", [str(sweep_dir), "--status", "skipped_budget,cancelled",
                                      f"hydra.launcher.budget_gpu_hours={20 * budget}"], tmp_path, env)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    record = read_json(sweep_dir / "sweep.json")
    assert len(record["arrays"]) == 2 and record["budget_gpu_hours"] == 20 * budget
    again = {t["num"]: t for t in record["trials"] if len(t["attempts"]) == 2}
    assert set(again) == {n for n, s in first.items() if s != "completed"}
    retry_array = record["arrays"][1]["array_job_id"]
    assert all(t["job_id"].startswith(f"{retry_array}_") for t in again.values())

    # A running trial is never retried: refused, and nothing reaches Slurm. Trials 0 and 1 resume,
    # so 4 or 5, which train from the start, run longest: one of them is caught running.
    wait_for(lambda: any(statuses(sweep_dir, env).get(n) == "running" for n in (4, 5)), timeout=300 + 3 * window_s,
             what="trial 4 or 5 to run", interval=1)
    running = next(n for n in (4, 5) if statuses(sweep_dir, env).get(n) == "running")
    before = all_job_ids(env)
    refused = tool("hpcsweep.retry", [str(sweep_dir), "--trials", str(running)], tmp_path, env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"retry refused: --trials {running}: #{running} is running" in refused.stderr
    assert all_job_ids(env) == before

    final = wait_for(lambda: (s := statuses(sweep_dir, env)) and all(v in ENDED for v in s.values()) and s,
                     timeout=300 + 2 * SPEED_MARGIN * (window_s + steps * RUNNING * one_step_s),
                     what="every retried trial to end", interval=2)
    print(f"both phases: {time.monotonic() - started:.0f} s")
    assert set(final.values()) == {"completed"}, final
    sha = {n: read_json(d / "metrics.json")["weights_sha256"] for n, d in trial_dirs.items()}
    assert sha[0] == sha[4] and sha[1] == sha[5], sha
    assert read_json(trial_dirs[0] / "metrics.json")["restarts"] >= 1
    report = tool("hpcsweep.report", [str(sweep_dir)], tmp_path, env).stdout
    assert "attempt" in report.splitlines()[0]
