"""A local sweep keeps to its budget too: the running trial stops with a checkpoint, the next is skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hpcsweep import status

BUDGET = 0.005
"""GPU-hours (here node-hours: the trials run on CPU): 18 s of one trial, more than the watch looks ahead
(two 0.5 s polls and 10 s for a stop), so the first trial starts; the second never does."""
TRIAL = ["trainer.max_steps=2000", "trainer.ckpt_every=500", "trainer.eval_every=1000", "trainer.log_every=10",
         "trainer.device=cpu", "data.batch_size=4", "data.seq_len=32"]


def test_local_sweep_stops_and_skips_once_the_budget_is_spent(tmp_path, capsys):
    env = {**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf", "HPCSWEEP_BUDGET_POLL_S": "0.5"}
    result = subprocess.run(
        [sys.executable, "-m", "hpcsweep", "-m", "hydra/launcher=local", f"hydra.launcher.budget_gpu_hours={BUDGET}",
         "model.lr=1e-3,2e-3", *TRIAL], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (sweep_file,) = tmp_path.glob("multirun/*/*/sweep.json")
    sweep_dir = sweep_file.parent
    assert json.loads(sweep_file.read_text())["budget_gpu_hours"] == BUDGET
    first, second = (json.loads((sweep_dir / n / "metrics.json").read_text()) for n in ("0", "1"))
    assert first["status"] == "stopped" and first["last_stop_reason"] == "budget", first
    assert 0 < first["step"] < 2000 and list((sweep_dir / "0" / "checkpoints").glob("step*"))
    assert second["status"] == "skipped_budget" and second["step"] == 0, second
    assert not (sweep_dir / "1" / "checkpoints").exists()

    assert status.main([str(sweep_dir)]) == status.EXIT_STOPPED  # stopped and skipped by the budget: not completed
    out = capsys.readouterr().out
    assert "2 trials, 1 stopped, 1 skipped_budget" in out
    assert f"/ {BUDGET:g} CPU-hours spent" in out and "BUDGET SPENT" in out  # a local sweep on CPUs, as report says
