"""A trial's stderr holds what the user can act on: torch's warnings about choices hpcsweep made on purpose
(the agent in a thread, buffers not synced each step) are gone at their source."""

from __future__ import annotations

import os
import subprocess
import sys

UNACTIONABLE = (
    "Failed to register signal handlers since torchelastic is running on a child thread",
    "`broadcast_buffers` is deprecated",
)


def test_a_two_worker_trial_runs_without_the_warnings_a_user_cannot_act_on(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hpcsweep", "hydra/launcher=local", "trainer.device=cpu", "trainer.nproc_per_node=2",
         "trainer.max_steps=2", "trainer.warmup_steps=1", "trainer.eval_every=2", "trainer.eval_batches=1",
         "trainer.ckpt_every=0", "trainer.log_every=1", "data.batch_size=2", "data.seq_len=16",
         "data.synthetic_tokens=20000", "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
         "hydra.run.dir=trial"],
        cwd=tmp_path, env={**os.environ, "SLURM_CONF": "/nonexistent"}, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    worker_logs = "".join(p.read_text() for p in (tmp_path / "trial" / "logs" / "torchrun").rglob("*.log"))
    for text in (result.stderr, worker_logs):
        assert not [warning for warning in UNACTIONABLE if warning in text], text[-3000:]
