"""A sweep that keeps to its GPU-hour budget, then ``python -m hpcsweep.retry`` finishes it.

Six trials on four nodes (one trial fills a node: 64 CPUs and 8 GPUs): four run, two wait. The
budget covers about 25 s of the four running trials, about half of the sweep. Once it is spent,
the running trials stop with a checkpoint and the waiting ones are cancelled (or, had they
started, skipped). A retry of those with a larger budget completes every trial. The sweep repeats
the first two learning rates as trials 4 and 5, which wait in the first phase and run
uninterrupted in the retry: the reference weights for trials 0 and 1, which resume.
"""

from __future__ import annotations

import subprocess
import sys
import time

from .conftest import (
    SMALL_TRIAL,
    all_job_ids,
    read_json,
    run_hpcsweep,
    wait_for,
)

STEPS = 600
TRIAL = [o for o in SMALL_TRIAL if not o.startswith(("trainer.max_steps", "trainer.eval_every", "trainer.ckpt_every",
                                                    "trainer.log_every"))] + [
    f"trainer.max_steps={STEPS}", "trainer.eval_every=300", "trainer.ckpt_every=200", "trainer.log_every=10",
    "topology.mode=off",
]
GPUS = 8
"""GPUs per trial: the launcher's ``gpus_per_node`` (``trainer.nproc_per_node=auto``)."""
BUDGET_S = 4 * GPUS * 40
"""Four running trials of 8 GPUs for about 40 s, in GPU-seconds: about half of the sweep's 6 x 75 s."""
POLL_S = 2
ENDED = ("completed", "stopped", "skipped_budget", "cancelled", "failed")


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
    env = {**slurm_env, "HPCSWEEP_BUDGET_POLL_S": str(POLL_S)}
    budget = BUDGET_S / 3600.0
    started = time.monotonic()
    result = run_hpcsweep(["-m", "model.lr=1e-3,2e-3,3e-3,4e-3,1e-3,2e-3", *TRIAL,
                           f"hydra.launcher.budget_gpu_hours={budget}"], tmp_path, env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    worst = 6 * GPUS * 15 / 60
    assert f"worst case {worst:g} GPU-hours (6 trials x 1 node x 8 GPUs x 15 min); budget {budget:g} GPU-hours" in (
        result.stdout + result.stderr)
    sweep_dir = next(tmp_path.glob("multirun/*/*/sweep.json")).parent
    record = read_json(sweep_dir / "sweep.json")
    assert record["budget_gpu_hours"] == budget
    trial_dirs = {t["num"]: sweep_dir / str(t["num"]) for t in record["trials"]}

    # A running trial is never retried: refused, and nothing reaches Slurm.
    wait_for(lambda: (trial_dirs[0] / "metrics.json").exists(), timeout=120, what="trial 0 to start")
    before = all_job_ids(env)
    refused = tool("hpcsweep.retry", [str(sweep_dir), "--trials", "0"], tmp_path, env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "retry refused: --trials 0: #0 is running" in refused.stderr
    assert all_job_ids(env) == before

    first = wait_for(lambda: (s := statuses(sweep_dir, env)) and all(v in ENDED for v in s.values()) and s,
                     timeout=150, what="every trial to stop, be cancelled or skipped", interval=2)
    print(f"first phase: {time.monotonic() - started:.0f} s, statuses {first}")
    assert set(first.values()) <= {"stopped", "cancelled", "skipped_budget", "completed"}, first
    assert {first[4], first[5]} <= {"cancelled", "skipped_budget"}, first
    stopped = [n for n, s in first.items() if s == "stopped"]
    assert {0, 1} <= set(stopped), first
    for num in stopped:
        metrics = read_json(trial_dirs[num] / "metrics.json")
        assert metrics["last_stop_reason"] == "budget" and 0 < metrics["step"] < STEPS, metrics
        assert list((trial_dirs[num] / "checkpoints").glob("step*")), f"trial {num} stopped without a checkpoint"

    # Spent: at most the budget plus one step of each trial that was running.
    spent = sacct_spent_hours(env, [record["arrays"][0]["array_job_id"]])
    rates = [read_json(trial_dirs[n] / "metrics.json")["tokens_per_s"] for n in stopped]
    step_s = max(128 / rate for rate in rates if rate)  # data.batch_size x data.seq_len tokens a step
    print(f"budget {budget * 3600:.0f} GPU-s, spent {spent * 3600:.0f} GPU-s; {len(stopped)} trials stopped, "
          f"a step {step_s:.3f} s")
    assert spent <= budget + len(stopped) * GPUS * step_s / 3600.0, (spent * 3600, budget * 3600)
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

    final = wait_for(lambda: (s := statuses(sweep_dir, env)) and all(v in ENDED for v in s.values()) and s,
                     timeout=200, what="every retried trial to end", interval=2)
    print(f"both phases: {time.monotonic() - started:.0f} s")
    assert set(final.values()) == {"completed"}, final
    sha = {n: read_json(d / "metrics.json")["weights_sha256"] for n, d in trial_dirs.items()}
    assert sha[0] == sha[4] and sha[1] == sha[5], sha
    assert read_json(trial_dirs[0] / "metrics.json")["restarts"] >= 1
    report = tool("hpcsweep.report", [str(sweep_dir)], tmp_path, env).stdout
    assert "attempt" in report.splitlines()[0]
