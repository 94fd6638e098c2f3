"""One attempt per node: built once from the environment and the launcher's caps; what its workers read."""

from hpcsweep.config import trial_config_from_dict
from hpcsweep.files.attempt_file import NO_RUNNER, WorkerAttempt, read_attempt, write_attempt
from hpcsweep.trial.admit import admit
from hpcsweep.trial.attempt import Caps, build_attempt

from .trial_dirs import trial_config

TRIAL = trial_config_from_dict(trial_config({"trainer.device": "cpu", "trainer.nproc_per_node": 2}))
JOB = {"SLURM_JOB_ID": "77", "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]",
       "SLURM_NNODES": "2", "SLURM_RESTART_COUNT": "1", "SLURMD_NODENAME": "node2"}


def test_the_attempt_holds_the_job_the_role_and_the_caps(tmp_path):
    caps = Caps.from_launcher({"max_num_timeout": 3, "max_retries": 1, "signal_delay_s": 90})
    node1 = build_attempt(TRIAL, tmp_path, {**JOB, "SLURM_NODEID": "1"}, caps=caps, search_trial=tmp_path / "s.json")
    node0 = build_attempt(TRIAL, tmp_path, {**JOB, "SLURM_NODEID": "0"}, caps=caps)
    assert (node0.records_for_the_trial, node1.records_for_the_trial) == (True, False)
    assert (node1.job.job_label, node1.requeues, node1.label, node1.node) == ("70_7", 1, "70_7.1", "node2")
    assert (node1.rdzv.nnodes, node1.rdzv.node_rank, node1.rdzv.nproc_per_node) == (2, 1, 2)
    assert node1.for_workers() == WorkerAttempt(
        node_rank=1, stop_file=tmp_path / "stop" / "node1.json", worker_dir=tmp_path / "workers" / "node1",
        signal_delay_s=90, search_trial=tmp_path / "s.json",
    )


def test_outside_slurm_the_attempt_has_its_own_port_and_no_signal_lead(tmp_path):
    local = build_attempt(TRIAL, tmp_path, {}, caps=Caps(signal_delay_s=90))
    assert local.job is None and local.records_for_the_trial and local.label.startswith("local.")
    assert local.env["MASTER_PORT"].isdigit() and local.for_workers().signal_delay_s is None


def test_the_attempt_file_round_trips_and_no_file_means_no_runner(tmp_path):
    attempt = build_attempt(TRIAL, tmp_path, {**JOB, "SLURM_NODEID": "0"}, caps=Caps(signal_delay_s=120))
    write_attempt(attempt.attempt_file, attempt.for_workers())
    assert attempt.attempt_file == tmp_path / "attempt" / "node0.json"
    assert read_attempt(attempt.attempt_file) == attempt.for_workers()
    assert read_attempt(None) == NO_RUNNER


def test_admit_fails_a_trial_requeued_beyond_its_cap_and_lets_a_fresh_one_train(tmp_path):
    job = {k: v for k, v in JOB.items() if not k.startswith("SLURM_ARRAY")}  # not a sweep's task: no budget
    over = admit(build_attempt(TRIAL, tmp_path / "capped", {**job, "SLURM_NODEID": "0"}, caps=Caps(max_requeues=0)))
    assert over.kind == "failed" and "max_num_timeout=0" in over.message
    assert over.metrics["status"] == "failed"  # node 0 records it
    other = admit(build_attempt(TRIAL, tmp_path / "capped1", {**job, "SLURM_NODEID": "1"}, caps=Caps(max_requeues=0)))
    assert other.kind == "failed" and not (tmp_path / "capped1" / "metrics.json").exists()
    assert admit(build_attempt(TRIAL, tmp_path / "fresh", {})) is None
