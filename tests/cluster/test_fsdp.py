"""An FSDP trial of 2 nodes x 2 processes on the real local cluster: sharded checkpoints, and a
stop by ``scancel --signal=USR2``, requeue and resume that ends with the uninterrupted run's weights."""

from __future__ import annotations

import warnings

import pytest
import torch.distributed.checkpoint as dcp
import yaml

from hpcsweep.config import trial_config_from_dict
from hpcsweep.results.failure import submitit_logs
from hpcsweep.train.checkpoint.store import SafeFileSystemReader, read_metadata
from hpcsweep.train.trackers.metrics import weights_sha256
from hpcsweep.train.model import build_model

from .conftest import TWO_NODES_TWO_PROCESSES, EndedTrial, read_json, usr2_at_step, wait_until_ended
from .test_preemption import submit, wait_until_final

FSDP = [*TWO_NODES_TWO_PROCESSES, "trainer.parallel=fsdp"]


@pytest.fixture(scope="module")
def fsdp_trial(tmp_path_factory, slurm_env) -> EndedTrial:
    """The 2-node x 2-process FSDP trial, run straight through once."""
    cwd = tmp_path_factory.mktemp("fsdp-trial")
    job_id, trial_dir = submit(cwd, slurm_env, *FSDP)
    return EndedTrial(job_id, wait_until_ended(slurm_env, job_id), trial_dir)


def final_model_dir(trial_dir):
    (final,) = (trial_dir / "checkpoints").glob("step00000020*")
    return final / "model"


def gathered_weights_sha256(trial_dir) -> str:
    """The weights of the trial's final DCP checkpoint, loaded whole into a plain model here."""
    cfg = trial_config_from_dict(yaml.safe_load((trial_dir / "config.yaml").read_text()))
    model = build_model(cfg.model, seed=cfg.trainer.seed + 1)  # other weights, all overwritten
    target = {"model": model.state_dict()}
    with warnings.catch_warnings():  # DCP warns that one process without a process group loads alone: it does
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(target, storage_reader=SafeFileSystemReader(final_model_dir(trial_dir)), no_dist=True)
    model.load_state_dict(target["model"])
    return weights_sha256(model.state_dict())


def test_an_fsdp_trial_saves_one_shard_per_rank_and_hashes_the_whole_model(fsdp_trial):
    assert fsdp_trial.state == "COMPLETED"
    metrics = read_json(fsdp_trial.trial_dir / "metrics.json")
    assert (metrics["status"], metrics["world_size"], metrics["parallel"]) == ("completed", 4, "fsdp")
    assert len(metrics["nodes"]) == 2
    model_dir = final_model_dir(fsdp_trial.trial_dir)
    assert sorted(p.name for p in model_dir.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    tensors = read_metadata(model_dir).state_dict_metadata
    embed = tensors["model.model.embed_tokens.weight"]
    assert len(embed.chunks) == 4  # sharded on dim 0, a quarter per rank
    assert {c.sizes[0] for c in embed.chunks} == {embed.size[0] // 4}
    assert gathered_weights_sha256(fsdp_trial.trial_dir) == metrics["weights_sha256"]
    # A run that is right is quiet (issue 41: every task's .err held FSDP2's "returned a view tensor" warning).
    (err_log, *_) = submitit_logs(fsdp_trial.trial_dir.parent, fsdp_trial.job_id, ".err")
    for log in [err_log, fsdp_trial.trial_dir / "train.log"]:
        text = log.read_text()
        assert "Warning" not in text and "returned a view tensor" not in text, f"{log}:\n{text[-3000:]}"


def test_scancel_usr2_to_an_fsdp_trial_requeues_and_resumes_bit_identical(tmp_path, slurm_env, fsdp_trial):
    assert fsdp_trial.state == "COMPLETED"
    job_id, trial_dir = submit(tmp_path, slurm_env, *FSDP)
    usr2_at_step(slurm_env, job_id, trial_dir, 3)

    metrics = wait_until_final(slurm_env, job_id, trial_dir)
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["last_stop_reason"] == "time_limit"
    assert metrics["restarts"] >= 1
    straight = read_json(fsdp_trial.trial_dir / "metrics.json")["weights_sha256"]
    assert metrics["weights_sha256"] == straight
    assert gathered_weights_sha256(trial_dir) == straight
    assert wait_until_ended(slurm_env, job_id, timeout=60) == "COMPLETED"
