"""Issue 42's acceptance on a real container runtime: the local cluster's Slurm OCI support with runc
(``scripts/slurm-cluster up --oci``) and the bundle ``scripts/make-test-image`` builds (Debian bookworm's own
Python 3.11 and the requirements; the sweep's code comes in through its snapshot, mounted with /tmp).

A 2-trial sweep of 2-node trials runs in the container; one trial stopped by USR2 is requeued, resumes
inside, and ends with the weights of the same trial run without a container (the session's
``two_node_trial``); ``environment.json`` says the container's OS and Python, which are not the host's. A
LoRA fine-tuning of a pretrained folder on ``data=text`` runs there too, its preparation job included.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.model_folders import corpus_documents, make_model_folder, write_text_corpus

from .conftest import (
    REPO,
    STOPPABLE_TRIAL,
    TWO_NODES_TWO_PROCESSES,
    read_json,
    run_hpcsweep,
    sacct_states,
    slurm,
    usr2_at_step,
    wait_for,
    wait_until_ended,
)
from .test_preemption import wait_until_final

IMAGE_BUILD_TIMEOUT_S = 1800.0
"""A cold build here takes about 2 minutes (debootstrap, then pip); a slow mirror much longer."""


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return f"({path}: {err})"


@pytest.fixture(scope="session")
def oci_bundle(slurm_env) -> Path:
    """The test bundle, on a cluster with Slurm's OCI support.

    ``scripts/test.sh`` brings the cluster up with ``--oci`` and builds the bundle in the background while
    the tests before these run: this waits for the build's exit status (``$HPCSWEEP_TEST_IMAGE_LOG.rc``)
    and names its log when it failed. Run on its own, it builds the bundle here (installing debootstrap
    and runc as root when missing) and turns the cluster's OCI support on (``up --oci`` on a running
    cluster writes oci.conf and starts nothing).
    """
    cluster_dir = Path(slurm_env["SLURM_CONF"]).parents[1]
    up = subprocess.run([sys.executable, str(REPO / "scripts" / "slurm-cluster"), "up", "--oci"], capture_output=True,
                        text=True, timeout=900, env={**slurm_env, "HPCSWEEP_CLUSTER_DIR": str(cluster_dir)})
    assert up.returncode == 0, up.stdout + up.stderr
    image = Path(os.environ.get("HPCSWEEP_TEST_IMAGE", "/var/tmp/hpcsweep-test-image"))
    log = os.environ.get("HPCSWEEP_TEST_IMAGE_LOG")
    if log:
        status = Path(f"{log}.rc")
        rc = wait_for(lambda: status.exists() and status.read_text().strip(), timeout=IMAGE_BUILD_TIMEOUT_S,
                      what=f"scripts/make-test-image {image} (started by scripts/test.sh; its log: {log})")
        assert rc == "0", f"scripts/make-test-image {image} exited {rc}; the end of its log {log}:\n{log_tail(Path(log))}"
    else:
        build = subprocess.run([sys.executable, str(REPO / "scripts" / "make-test-image"), str(image),
                                "--bind", str(cluster_dir)], capture_output=True, text=True,
                               timeout=IMAGE_BUILD_TIMEOUT_S)
        assert build.returncode == 0, build.stdout + build.stderr
    return image


def in_container(bundle: Path) -> list[str]:
    return ["hydra.launcher.container.runtime=oci", f"hydra.launcher.container.image={bundle}"]


def assert_ran_inside(trial_dir: Path, bundle: Path) -> dict:
    """The trial's environment.json: the bundle's Debian and its own Python, not this host's, and the
    container as submitted."""
    record = read_json(trial_dir / "environment.json")
    assert record["os_release"]["PRETTY_NAME"] == "Debian GNU/Linux 12 (bookworm)", record["os_release"]
    assert record["python_executable"] == "/usr/bin/python3", record["python_executable"]
    assert (record["python_executable"], record["python"]) != (sys.executable, platform.python_version())
    assert record["torch"] == __import__("torch").__version__
    container = record["container"]
    assert (container["runtime"], container["image"]) == ("oci", str(bundle)), container
    assert container["identity"]["kind"] == "bundle" and container["identity"]["config_json"]["sha256"]
    return record


def test_a_two_trial_sweep_of_two_node_trials_runs_in_the_container_and_a_stopped_trial_resumes_exactly(
        tmp_path, slurm_env, oci_bundle, two_node_trial):
    # Trial 0 is the session's two_node_trial (model.lr's default), run without a container.
    result = run_hpcsweep(["-m", *STOPPABLE_TRIAL, *TWO_NODES_TWO_PROCESSES, "model.lr=3e-3,1e-3",
                           *in_container(oci_bundle)], tmp_path, slurm_env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    record = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))
    (array,) = record["arrays"]
    stopped, other = sorted(record["trials"], key=lambda t: t["num"])
    trial_dir = tmp_path / stopped["trial_dir"]
    usr2_at_step(slurm_env, stopped["job_id"], trial_dir, 3)

    metrics = wait_until_final(slurm_env, stopped["job_id"], trial_dir, timeout=400)
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["last_stop_reason"] == "time_limit"
    assert metrics["restarts"] >= 1 and metrics["slurm_restart_count"] >= 1
    assert metrics["weights_sha256"] == read_json(two_node_trial.trial_dir / "metrics.json")["weights_sha256"]
    states = wait_for(lambda: (s := sacct_states(slurm_env, array["array_job_id"])) and len(s) == 2 and all(
        v.split()[0] in ("COMPLETED", "FAILED", "CANCELLED") for v in s.values()) and s, timeout=400,
        what="both trials to end")
    assert set(states.values()) == {"COMPLETED"}, states
    assert read_json(tmp_path / other["trial_dir"] / "metrics.json")["status"] == "completed"

    # Requeued and resumed inside: the record of the last attempt, on the node the trial's rank 0 ran on.
    env_record = assert_ran_inside(trial_dir, oci_bundle)
    assert env_record["slurm"]["restart_count"] >= 1
    assert assert_ran_inside(tmp_path / other["trial_dir"], oci_bundle)["slurm"]["nodelist"]
    # Every step of the array ran with --container (accounting keeps it).
    steps = slurm(slurm_env, "sacct", "--noheader", "--parsable2", "-j", array["array_job_id"],
                  "--format=JobID,Container%200")
    containers = {line.split("|")[1] for line in steps.splitlines() if line.split("|")[0].endswith(".0")}
    assert containers == {str(oci_bundle)}, steps


def test_a_lora_fine_tuning_on_text_runs_in_the_container_with_its_preparation_job(tmp_path, slurm_env, oci_bundle):
    folder = make_model_folder(tmp_path / "small-deepseek")
    corpus = write_text_corpus(tmp_path / "corpus", corpus_documents(16, 60))
    short = [o for o in STOPPABLE_TRIAL
             if not o.startswith(("trainer.max_steps", "trainer.ckpt_every", "trainer.eval_every", "data.seq_len"))]
    result = run_hpcsweep(["-m", *short, "trainer.max_steps=4", "trainer.ckpt_every=2", "trainer.eval_every=2",
                           "model=pretrained", f"model.path={folder}", "model.peft=lora", "model.lora.r=4",
                           "data=text", f"data.files={corpus}/*", "data.seq_len=16", *in_container(oci_bundle)],
                          tmp_path, slurm_env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    record = read_json(next(tmp_path.glob("multirun/*/*/sweep.json")))
    prep_id = record["token_preparation"]["job_id"]
    (trial,) = record["trials"]
    assert wait_until_ended(slurm_env, prep_id, timeout=300) == "COMPLETED", log_tail(
        Path(record["token_preparation"]["log"]))
    assert wait_until_ended(slurm_env, trial["job_id"], timeout=400) == "COMPLETED"
    trial_dir = tmp_path / trial["trial_dir"]
    metrics = read_json(trial_dir / "metrics.json")
    assert metrics["status"] == "completed" and metrics["step"] == 4, metrics.get("error")
    assert_ran_inside(trial_dir, oci_bundle)
    # The preparation job tokenized the text in a step of its own in the same container.
    steps = slurm(slurm_env, "sacct", "--noheader", "--parsable2", "-j", prep_id, "--format=JobID,State,Container%200")
    assert f"{prep_id}.0|COMPLETED|{oci_bundle}" in steps.splitlines(), steps
    assert len(list((tmp_path / "multirun" / "token-cache").iterdir())) == 1
