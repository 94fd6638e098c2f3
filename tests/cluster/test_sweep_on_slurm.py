"""A sweep on the real local cluster: one job array, validation before submission."""

from __future__ import annotations

import pytest

from .conftest import (
    SMALL_TRIAL,
    all_job_ids,
    read_json,
    run_hpcsweep,
    sacct_states,
    submitted_from,
    wait_for,
)

METRICS_KEYS = {
    "status", "step", "max_steps", "train_loss", "val_loss", "best_val_loss",
    "tokens_per_s", "restarts", "weights_sha256",
}


def test_two_trial_sweep_is_one_array_and_completes(tmp_path, slurm_env):
    result = run_hpcsweep(["-m", "model.lr=1e-4,3e-4", *SMALL_TRIAL], tmp_path, slurm_env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "launcher: slurm" in result.stdout + result.stderr

    sweep = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))
    assert sweep["launcher"] == "slurm"
    assert len(sweep["arrays"]) == 1
    array_id = sweep["arrays"][0]["array_job_id"]
    assert [t["job_id"] for t in sweep["trials"]] == [f"{array_id}_0", f"{array_id}_1"]
    assert [t["overrides"][0] for t in sweep["trials"]] == ["model.lr=0.0001", "model.lr=0.0003"]

    def finished():
        states = sacct_states(slurm_env, array_id)
        done = {job: state for job, state in states.items() if state not in ("PENDING", "RUNNING", "REQUEUED")}
        return states if len(done) == 2 else None

    states = wait_for(finished, timeout=400, what=f"array {array_id} to finish")
    assert states == {f"{array_id}_0": "COMPLETED", f"{array_id}_1": "COMPLETED"}, states

    for trial, lr in zip(sweep["trials"], (1e-4, 3e-4)):
        metrics = read_json(tmp_path / trial["trial_dir"] / "metrics.json")
        assert METRICS_KEYS <= set(metrics), sorted(METRICS_KEYS - set(metrics))
        assert metrics["status"] == "completed"
        assert metrics["step"] == metrics["max_steps"] == 8
        assert len(metrics["weights_sha256"]) == 64
        # The plan as the trial ran (the dummy GPUs train on CPU: fp32, compared with no GPU) and its peak.
        plan = metrics["memory_plan"]
        assert plan["setup"]["precision"] == "fp32" and plan["verdict"] == "not compared"
        assert plan["total_bytes"] == sum(plan["bytes"].values()) and metrics["memory_peak"]["source"] == "VmHWM"
        env_record = read_json(tmp_path / trial["trial_dir"] / "environment.json")
        assert env_record["slurm"]["job_label"] == trial["job_id"]
        config_text = (tmp_path / trial["trial_dir"] / "config.yaml").read_text()
        assert f"lr: {lr}" in config_text


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.lr=-1", "model.lr=-1.0 is not allowed: a learning rate > 0"),
        ("+model.nosuch=1", "model.nosuch is not a config key (keys of model:"),
        ("model.nosuch=1", "model.nosuch is not a config key"),
        ("model.lrr=1e-3", "model.lrr is not a config key; did you mean model.lr?"),
        ("trainer.nodes=0", "trainer.nodes=0 is not allowed: an integer >= 1"),
        ("hydra.launcher.partition=nosuch", "hydra.launcher.partition='nosuch' is not a partition of this cluster; allowed: batch, urgent"),
        ("hydra.launcher.signal_delay_s=900", "hydra.launcher.signal_delay_s=900 is not allowed: whole seconds from 1 to 899"),
    ],
)
def test_bad_config_fails_before_any_job_is_submitted(tmp_path, slurm_env, override, message):
    before = all_job_ids(slurm_env)
    result = run_hpcsweep(["-m", "model.lr=1e-3,2e-3", override, *SMALL_TRIAL], tmp_path, slurm_env, timeout=120)
    assert result.returncode != 0
    assert message in result.stderr + result.stdout
    assert not submitted_from(slurm_env, tmp_path, before)
    assert not list(tmp_path.glob("multirun/*/*/.submitit"))


def test_shell_syntax_in_override_values_never_reaches_a_shell(tmp_path, slurm_env):
    marker = tmp_path / "pwned"
    payloads = [f"$(touch {marker})", f"`touch {marker}`", f"x;touch {marker}"]
    # Into an #SBATCH line (the launcher's comment) and into the workers' environment (an NCCL override).
    result = run_hpcsweep(
        [
            "-m",
            f"hydra.launcher.comment='{payloads[0]}'",
            f"+nccl.overrides.NCCL_HPCSWEEP_PROBE='{payloads[1]}','{payloads[2]}'",
            *SMALL_TRIAL,
            "trainer.max_steps=2",
            "hydra.launcher.wait=true",
        ],
        tmp_path, slurm_env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    # The values did arrive where they were aimed, unevaluated.
    sweep = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))
    probes = [read_json(tmp_path / t["trial_dir"] / "environment.json")["nccl"]["NCCL_HPCSWEEP_PROBE"] for t in sweep["trials"]]
    assert probes == payloads[1:]
    script = next(tmp_path.glob("multirun/*/*/.submitit/*/*_submission.sh")).read_text()
    assert f"#SBATCH --comment='{payloads[0]}'" in script
    rejected = run_hpcsweep(["-m", "hydra.launcher.comment='a\nb'", *SMALL_TRIAL], tmp_path, slurm_env, timeout=120)
    assert rejected.returncode == 2
    assert "must not contain newlines" in rejected.stdout + rejected.stderr
