"""A worker's failure under the torchrun agent becomes the trial's failure, traceback in the log."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_failing_workers_fail_the_trial_with_their_traceback(tmp_path):
    # Valid config, but a corpus too short for one sequence: every worker raises while loading data.
    result = subprocess.run(
        [sys.executable, "-m", "hpcsweep", "trainer.nproc_per_node=2", "data.synthetic_tokens=100",
         "data.seq_len=64", "hydra.run.dir=trial"],
        cwd=tmp_path, env={**os.environ, "SLURM_CONF": "/nonexistent"},
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    trial = tmp_path / "trial"
    log = (trial / "hpcsweep.log").read_text()
    assert "failed:" in log and "exitcode" in log
    assert "Traceback" in log and "data.seq_len" in log
    metrics = json.loads((trial / "metrics.json").read_text())
    assert metrics["status"] == "failed"
    assert any("data.seq_len" in line for line in metrics["error"])
