"""A request the cluster can never satisfy, or data that cannot train the model, stops the sweep in one
line; nothing is submitted (#11, #26), and so does a trial whose memory plan does not fit its GPUs (#23).

Slurm itself would queue most of these jobs for ever (reason ``PartitionConfig``,
``PartitionTimeLimit``) or fail inside submitit with a traceback.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import (
    REPO,
    all_job_ids,
    read_json,
    run_hpcsweep,
    slurm,
    submitted_from,
    wait_for,
    wait_until_ended,
)


def queued_job_ids(env: dict[str, str]) -> set[str]:
    """Every job and array task squeue shows, of every user."""
    out = slurm(env, "squeue", "--noheader", "--all", "--array", "--format=%i")
    return set(out.split())


def assert_refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert message in output, output
    assert "Traceback" not in output, output


@pytest.fixture
def short_partition(slurm_env):
    """A partition of every node with MaxTime=10 minutes, for as long as the test runs."""
    slurm(slurm_env, "scontrol", "create", "PartitionName=short", "Nodes=node[1-4]", "MaxTime=10")
    try:
        yield "short"
    finally:
        slurm(slurm_env, "scontrol", "delete", "PartitionName=short")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.nodes=16"], "trainer.nodes=16 is more than partition batch has: 4 nodes; nothing was submitted"),
        (
            ["hydra.launcher.gpus_per_node=16"],
            "hydra.launcher.gpus_per_node=16: no node of partition batch has more than 8 GPUs (gres gpu:a100:8); "
            "nothing was submitted",
        ),
        (
            ["hydra.launcher.mem=10T"],
            "hydra.launcher.mem=10T: no node of partition batch has more than 512000 MB of memory; nothing was submitted",
        ),
        (
            ["hydra.launcher.partition=short", "hydra.launcher.timeout_min=11"],
            "hydra.launcher.timeout_min=11 is more than partition short allows: MaxTime=10 min; nothing was submitted",
        ),
    ],
    ids=["nodes", "gpus", "mem", "maxtime"],
)
def test_a_request_no_node_or_partition_can_satisfy_is_refused(tmp_path, slurm_env, short_partition, overrides, message):
    before, queued = all_job_ids(slurm_env), queued_job_ids(slurm_env)
    result = run_hpcsweep(["-m", "model.lr=1e-4", *overrides], tmp_path, slurm_env, timeout=120)
    assert_refused(result, message)
    assert "launcher: slurm" in result.stdout + result.stderr
    assert not submitted_from(slurm_env, tmp_path, before)
    assert queued_job_ids(slurm_env) <= queued  # nothing new; a job queued before may have ended since
    assert not list(tmp_path.glob("multirun/*/*/.submitit"))


def write_corpus(path, vocab_size: int, num_tokens: int) -> None:
    import numpy as np

    from hpcsweep.train.data.corpora import write_token_file

    write_token_file(path, np.arange(num_tokens) % vocab_size, vocab_size=vocab_size, tokenizer="toy")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.path=/no/such.bin"], "data.path='/no/such.bin' is not allowed: no such token file; nothing was submitted"),
        (["data.path=c173.bin", "model.vocab_size=100"],
         "model.vocab_size=100 is not allowed: c173.bin needs at least 173 (its vocabulary); nothing was submitted"),
        (["data.path=c173.bin", "data.seq_len=300"],
         "data.seq_len=300 is not allowed: at most 248: c173.bin holds 5000 tokens"),
    ],
    ids=["missing", "vocab", "seq_len"],
)
def test_a_data_mistake_is_refused_before_submit(tmp_path, slurm_env, overrides, message):
    write_corpus(tmp_path / "c173.bin", vocab_size=173, num_tokens=5000)
    before, queued = all_job_ids(slurm_env), queued_job_ids(slurm_env)
    result = run_hpcsweep(["-m", "data=file", "model.lr=1e-4", *overrides], tmp_path, slurm_env, timeout=120)
    assert_refused(result, message)
    output = result.stdout + result.stderr
    assert "launcher: slurm" in output and len([line for line in output.splitlines() if "is not allowed" in line]) == 1
    assert "such.json" not in output
    assert not submitted_from(slurm_env, tmp_path, before)
    assert queued_job_ids(slurm_env) <= queued  # nothing new; a job queued before may have ended since
    assert not (tmp_path / "multirun").exists()


def test_the_default_request_is_accepted(tmp_path, slurm_env):
    # Held, so the default trials (8 workers each) never start; the check does not read --hold.
    result = run_hpcsweep(
        ["-m", "model.lr=1e-4,3e-4", "+hydra.launcher.additional_parameters.hold=true"], tmp_path, slurm_env, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (array,) = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))["arrays"]
    array_id = array["array_job_id"]
    try:
        assert {f"{array_id}_0", f"{array_id}_1"} <= queued_job_ids(slurm_env)
    finally:
        slurm(slurm_env, "scancel", array_id)
        wait_for(lambda: not any(j.startswith(f"{array_id}_") for j in queued_job_ids(slurm_env)),
                 timeout=60, what=f"array {array_id} to leave the queue")


def test_the_sweep_driver_job_refuses_in_its_log(tmp_path, slurm_env):
    # tmp_path stands for the repo root the user submits from, with its committed slurm/logs/.
    (tmp_path / "slurm" / "logs").mkdir(parents=True)
    before = all_job_ids(slurm_env)
    submitted = subprocess.run(
        ["sbatch", "--parsable", str(REPO / "slurm" / "sweep.sbatch"), "model.lr=1e-4", "trainer.nodes=16"],
        cwd=tmp_path, env={**slurm_env, "HPCSWEEP_PYTHON": sys.executable},
        capture_output=True, text=True, check=True, timeout=60,
    )
    driver = submitted.stdout.strip().split(";")[0]
    assert wait_until_ended(slurm_env, driver, timeout=300) == "FAILED"
    exit_code = slurm(slurm_env, "sacct", "-X", "--noheader", "--parsable2", "-j", driver, "--format=ExitCode").strip()
    assert exit_code == "2:0"
    log = (tmp_path / "slurm" / "logs" / f"hpcsweep-sweep-{driver}.out").read_text()
    last_line = log.strip().splitlines()[-1]
    assert "trainer.nodes=16 is more than partition batch has: 4 nodes; nothing was submitted" in last_line, log
    assert "Traceback" not in log
    # Nothing but the driver itself was submitted (accounting may list the driver a moment late).
    assert all_job_ids(slurm_env) - before <= {driver}
    assert not list(tmp_path.glob("slurm-*.out"))


# A dense model of Llama-2-7B's sizes, built in: full fine-tuning with AdamW needs ~180 GB a GPU
# under DDP, more than the cluster's GPUs (declared as 80 GB A100s: Gres=gpu:a100:8). With the
# default trainer.parallel=auto the plan shards it with FSDP over the trial's 8 GPUs instead.
SEVEN_B = [
    "model=llama_small", "model.hidden_size=4096", "model.intermediate_size=11008", "model.num_layers=32",
    "model.num_heads=32", "model.num_kv_heads=32", "model.vocab_size=32000", "model.max_position_embeddings=2048",
    "data.seq_len=2048", "data.batch_size=1", "data.synthetic_tokens=100000",
]


def test_a_trial_that_cannot_fit_its_gpus_is_refused_with_its_fix(tmp_path, slurm_env):
    before, queued = all_job_ids(slurm_env), queued_job_ids(slurm_env)
    result = run_hpcsweep(["-m", "model.lr=1e-4", *SEVEN_B, "trainer.parallel=ddp"], tmp_path, slurm_env, timeout=120)
    assert_refused(
        result,
        "trial #0: ~180 GB/GPU (training from scratch, DDP) > 80 GB per A100: trainer.parallel=fsdp over >= 3 GPUs; "
        "nothing was submitted",
    )
    assert not submitted_from(slurm_env, tmp_path, before)
    assert queued_job_ids(slurm_env) <= queued
    assert not list(tmp_path.glob("multirun/*/*/.submitit"))


def test_check_memory_false_submits_the_trial_the_plan_refuses(tmp_path, slurm_env):
    # Held, so the 7B trial never starts; only the check is skipped.
    result = run_hpcsweep(
        ["-m", "model.lr=1e-4", *SEVEN_B, "trainer.parallel=ddp", "hydra.launcher.check_memory=false",
         "+hydra.launcher.additional_parameters.hold=true"], tmp_path, slurm_env, timeout=120,
    )
    assert_submitted_held(result, tmp_path, slurm_env, tasks=1)


def test_the_trial_the_plan_refuses_fits_with_lora_or_fsdp_and_is_submitted(tmp_path, slurm_env):
    # The fixes the refusal names, each submitted (held: a 7B trial never starts here).
    for name in ("lora", "fsdp"):
        (tmp_path / name).mkdir()
    lora = run_hpcsweep(["-m", "model.lr=1e-4", *SEVEN_B, "trainer.parallel=ddp", "model.peft=lora",
                         "+hydra.launcher.additional_parameters.hold=true"], tmp_path / "lora", slurm_env, timeout=120)
    assert_submitted_held(lora, tmp_path / "lora", slurm_env, tasks=1)
    sharded = run_hpcsweep(["-m", "model.lr=1e-4", *SEVEN_B, "trainer.parallel=fsdp,auto",
                            "+hydra.launcher.additional_parameters.hold=true"], tmp_path / "fsdp", slurm_env, timeout=120)
    assert_submitted_held(sharded, tmp_path / "fsdp", slurm_env, tasks=2)


def assert_submitted_held(result, cwd, slurm_env, tasks: int) -> None:
    """The sweep was submitted as one array of ``tasks`` held tasks; cancel it."""
    assert result.returncode == 0, result.stdout + result.stderr
    (array,) = read_json(next(cwd.glob("multirun/*/*/sweep.json")))["arrays"]
    array_id = array["array_job_id"]
    ids = {array_id} | {f"{array_id}_{i}" for i in range(tasks)}
    try:
        # squeue names a one-task array by its job id alone.
        assert queued_job_ids(slurm_env) & ids
    finally:
        slurm(slurm_env, "scancel", array_id)
        wait_for(lambda: not queued_job_ids(slurm_env) & ids, timeout=60, what=f"array {array_id} to leave the queue")
