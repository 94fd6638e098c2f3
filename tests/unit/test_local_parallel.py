"""``hydra.launcher.local_parallelism=2``: two local trials at once, each in its own process, same weights."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from ..foreign_sweeps import (
    TWO_GROUPS,
    TWO_GROUPS_RETURNS,
    assert_hydra_job_returns,
    install_foreign_app,
    run_foreign_sweep,
)

# Tiny trials, long enough (20 steps) that a trial's process outlives the start of the next one.
TINY = [
    "hydra/launcher=local", "trainer.device=cpu", "trainer.nproc_per_node=1", "trainer.max_steps=20",
    "trainer.warmup_steps=2", "trainer.eval_every=10", "trainer.eval_batches=1", "trainer.ckpt_every=10",
    "trainer.log_every=10", "data.batch_size=4", "data.seq_len=32", "data.synthetic_tokens=50000",
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
]
SWEEP = ["-m", "model.lr=1e-4,2e-4,3e-4,4e-4", *TINY]
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")


def start_sweep(cwd: Path, sweep_dir: str, parallelism: int) -> subprocess.Popen:
    # One thread per process: the tests share two cores with everything else.
    return subprocess.Popen(
        [sys.executable, "-m", "hpcsweep", *SWEEP, f"hydra.launcher.local_parallelism={parallelism}",
         f"hydra.sweep.dir={sweep_dir}"],
        cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def stamp(line: str) -> datetime:
    return datetime.strptime(STAMP.search(line)[0], "%Y-%m-%d %H:%M:%S,%f")


def lifetime(trial_dir: Path) -> tuple[datetime, datetime]:
    """From the trial process's first log line (Hydra's job log) to its last training line."""
    return stamp(trial_dir.joinpath("hpcsweep.log").read_text()), stamp(trial_dir.joinpath("train.log").read_text().splitlines()[-1])


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def metrics(trial_dir: Path) -> dict:
    return json.loads((trial_dir / "metrics.json").read_text())


def test_two_trials_run_at_once_each_in_its_own_process_with_the_weights_of_one_at_a_time(tmp_path):
    parallel, one_at_a_time = start_sweep(tmp_path, "parallel", 2), start_sweep(tmp_path, "serial", 1)
    outputs = {name: proc.communicate(timeout=300)[0] for name, proc in (("parallel", parallel), ("serial", one_at_a_time))}
    assert parallel.returncode == 0, outputs["parallel"]
    assert one_at_a_time.returncode == 0, outputs["serial"]
    assert "4 trials, running locally, 2 at a time" in outputs["parallel"]

    dirs = {name: [tmp_path / name / str(num) for num in range(4)] for name in outputs}
    assert most_at_once([lifetime(d) for d in dirs["parallel"]]) == 2
    assert most_at_once([lifetime(d) for d in dirs["serial"]]) == 1

    pids = [metrics(d)["ranks"][0]["pid"] for d in dirs["parallel"]]
    assert len(set(pids)) == 4 and parallel.pid not in pids, (pids, parallel.pid)
    for num in range(4):
        done, alone = metrics(dirs["parallel"][num]), metrics(dirs["serial"][num])
        assert (done["status"], done["step"]) == ("completed", 20), num
        assert done["weights_sha256"] == alone["weights_sha256"], num
    assert len({metrics(d)["weights_sha256"] for d in dirs["parallel"]}) == 4


def test_another_apps_job_returns_come_back_in_trial_order_from_two_at_once(tmp_path):
    python = install_foreign_app(tmp_path / "install")
    sweep_dir = tmp_path / "parallel"
    proc, returns = run_foreign_sweep(
        python, tmp_path, sweep_dir, [*TWO_GROUPS, "hydra/launcher=hpcsweep_local", "hydra.launcher.local_parallelism=2"]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 trials, running locally, 2 at a time" in proc.stdout + proc.stderr
    assert_hydra_job_returns(returns, sweep_dir, TWO_GROUPS_RETURNS)


def test_a_bad_parallelism_runs_nothing_and_names_the_key(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hpcsweep", "-m", "model.lr=1e-4,3e-4", "hydra/launcher=local",
         "hydra.launcher.local_parallelism=0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert ("hydra.launcher.local_parallelism=0 is not allowed: a whole number >= 1, or null (one trial per GPU, "
            "1 without GPUs); no trial was run") in result.stdout + result.stderr
    assert not (tmp_path / "multirun").exists()
