"""A 1,000-trial sweep on the real local cluster: few sbatch calls, and every task finds its own trial.

The tasks are submitted held. Every task's trial is checked with the very lookup its array task
makes at start (submitit's ``JobEnvironment`` paths from ``SLURM_ARRAY_*``, then its pickle), and
the first and last task of each array are released and really run.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import yaml
from submitit.core.job_environment import JobEnvironment
from submitit.core.utils import DelayedSubmission

from .conftest import (
    SMALL_TRIAL,
    TERMINAL_STATES,
    only_sweep_dir,
    read_json,
    run_hpcsweep,
    sacct_states,
    slurm,
    wait_for,
)

TRIALS = 1000
MAX_ARRAY_SIZE = 400
TINY = [*SMALL_TRIAL, "trainer.max_steps=2", "trainer.eval_every=2", "trainer.ckpt_every=2"]


def counting_sbatch(bin_dir: Path) -> Path:
    """An ``sbatch`` first on PATH that logs each call, then runs the real one."""
    real = shutil.which("sbatch")
    assert real, "sbatch is not on PATH"
    bin_dir.mkdir()
    log = bin_dir / "sbatch.calls"
    shim = bin_dir / "sbatch"
    shim.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{real}" "$@"\n')
    shim.chmod(0o755)
    return log


def task_trials(monkeypatch, folder: str, array_id: str, task: int) -> list:
    """The trials array task ``array_id_task`` runs, found as ``submitit.core.submission.process_job`` finds them."""
    for name, value in {"SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_FOLDER": folder, "SLURM_JOB_ID": "1",
                        "SLURM_ARRAY_JOB_ID": array_id, "SLURM_ARRAY_TASK_ID": str(task)}.items():
        monkeypatch.setenv(name, value)
    (trials,) = DelayedSubmission.load(JobEnvironment().paths.submitted_pickle).args
    return [(list(trial.overrides), trial.num) for trial in trials]


def test_a_thousand_trials_are_few_sbatch_calls_and_each_task_runs_its_own_trial(tmp_path, slurm_env, monkeypatch):
    calls = counting_sbatch(tmp_path / "bin")
    env = {**slurm_env, "PATH": f"{calls.parent}{os.pathsep}{slurm_env['PATH']}"}
    lrs = [f"{(i + 1) * 1e-6:.6g}" for i in range(TRIALS)]
    arrays: list[str] = []
    try:
        result = run_hpcsweep(
            ["-m", f"model.lr={','.join(lrs)}", *TINY, "hydra.launcher.cpus_per_task=1", "hydra.launcher.gpus_per_node=0",
             f"hydra.launcher.max_array_size={MAX_ARRAY_SIZE}", "+hydra.launcher.additional_parameters.hold=true"],
            tmp_path, env, timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        sweep_dir = only_sweep_dir(tmp_path)
        sweep = read_json(sweep_dir / "sweep.json")
        arrays = [a["array_job_id"] for a in sweep["arrays"]]
        assert len(calls.read_text().splitlines()) == len(arrays) == math.ceil(TRIALS / MAX_ARRAY_SIZE)

        trials = {t["num"]: t for t in sweep["trials"]}
        assert [trials[n]["overrides"][0] for n in range(TRIALS)] == [f"model.lr={lr}" for lr in lrs]
        folder = str(sweep_dir / ".submitit" / "%j")
        released = []
        for array in sweep["arrays"]:
            for task, num in enumerate(array["trials"]):
                assert trials[num]["job_id"] == f"{array['array_job_id']}_{task}"
                assert task_trials(monkeypatch, folder, array["array_job_id"], task) == [(trials[num]["overrides"], num)]
            released += [(f"{array['array_job_id']}_{task}", array["trials"][task]) for task in (0, len(array["trials"]) - 1)]

        for job_id, _ in released:
            slurm(env, "scontrol", "release", job_id)

        def ended():
            states = {job_id: sacct_states(env, job_id).get(job_id, "PENDING") for job_id, _ in released}
            return states if all(s.split()[0] in TERMINAL_STATES for s in states.values()) else None

        states = wait_for(ended, timeout=110, what="the released tasks to end", interval=1.0)
        assert set(states.values()) == {"COMPLETED"}, states
        for _, num in released:
            trial_dir = sweep_dir / str(num)
            assert read_json(trial_dir / "metrics.json")["status"] == "completed"
            assert yaml.safe_load((trial_dir / ".hydra" / "overrides.yaml").read_text()) == trials[num]["overrides"]
            assert f"model.lr={yaml.safe_load((trial_dir / 'config.yaml').read_text())['model']['lr']:.6g}" == \
                trials[num]["overrides"][0]
    finally:
        if arrays:
            slurm(slurm_env, "scancel", *arrays)
