"""A LoRA trial on the real local cluster: stopped by ``scancel --signal=USR2``, requeued, resumed, and
ended with the adapters of an uninterrupted run; its checkpoints hold the adapters, never the base."""

from __future__ import annotations

from .conftest import read_json, slurm, wait_for, wait_until_ended
from .test_preemption import reference, step_of, submit, wait_until_final  # noqa: F401  (reference: a fixture)

LORA = ("model.peft=lora", "model.lora.r=4")


def test_a_lora_trial_stopped_by_usr2_is_requeued_and_resumes_with_the_same_adapters(tmp_path, slurm_env, reference):
    uninterrupted = reference(1, *LORA)
    job_id, trial_dir = submit(tmp_path, slurm_env, *LORA)
    wait_for(lambda: step_of(trial_dir) >= 3, timeout=240, what="the LoRA trial to reach step 3")
    slurm(slurm_env, "scancel", "--signal=USR2", job_id)

    metrics = wait_until_final(slurm_env, job_id, trial_dir)
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["last_stop_reason"] == "time_limit"
    assert metrics["restarts"] >= 1 and metrics["slurm_restart_count"] >= 1
    assert metrics["weights_sha256"] == uninterrupted.weights_sha256()
    assert wait_until_ended(slurm_env, job_id, timeout=60) == "COMPLETED"
    assert "resumed from step" in (trial_dir / "train.log").read_text()

    from hpcsweep.train.checkpoint_store import read_metadata

    for checkpoint in (trial_dir / "checkpoints").glob("step*.pt"):
        saved = read_metadata(checkpoint / "model").state_dict_metadata
        assert saved and all("lora_" in key or key.endswith("e_score_correction_bias") for key in saved), checkpoint
    assert read_json(trial_dir / "metrics.json")["step"] == 20
