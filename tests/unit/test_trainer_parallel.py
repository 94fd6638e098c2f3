"""FSDP and DDP's gradient-communication options, trained on two gloo ranks under torchrun.

Every trial is 20 steps of the same config, two micro-batches a step (so the no-sync micro-step
runs too); plain DDP is the reference the others are held to.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpcsweep.train.checkpoint.store import read_metadata

from .test_trainer_ddp import losses, make_trial, torchrun
from .trial_dirs import read_metrics

STEPS = {"trainer.max_steps": 20, "trainer.eval_every": 10, "trainer.grad_accum": 2}
WARMUP = 4
"""``trainer.comm_warmup_steps``: plain all-reduce before PowerSGD compresses or local SGD begins."""
PARALLEL_RUNS = 2
"""torchrun runs at once (each of two 1-thread ranks)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    trials = {
        "ddp": make_trial(root / "ddp", **STEPS, **{"trainer.parallel": "ddp"}),
        "fsdp": make_trial(root / "fsdp", **STEPS, **{"trainer.parallel": "fsdp"}),
        "bf16": make_trial(root / "bf16", **STEPS, **{"trainer.grad_comm": "bf16"}),
        "powersgd": make_trial(root / "powersgd", **STEPS, **{
            "trainer.grad_comm": "powersgd", "trainer.powersgd_rank": 2, "trainer.comm_warmup_steps": WARMUP}),
        "local_sgd": make_trial(root / "local_sgd", **STEPS, **{
            "trainer.sync_every": 4, "trainer.comm_warmup_steps": WARMUP}),
    }
    trials["powersgd_resumed"] = make_trial(root / "powersgd_resumed", **STEPS, **{
        "trainer.grad_comm": "powersgd", "trainer.powersgd_rank": 2, "trainer.comm_warmup_steps": WARMUP})
    trials["local_sgd_resumed"] = make_trial(root / "local_sgd_resumed", **STEPS, **{
        "trainer.sync_every": 4, "trainer.comm_warmup_steps": WARMUP})
    resumed_names = ("powersgd_resumed", "local_sgd_resumed")
    codes, comm_keys = {}, {}

    def straight(name):
        codes[name] = torchrun(trials[name])

    def stopped_and_resumed(name):
        resumed = trials[name]
        # Step 10 is inside a local-SGD period (averages after steps 4, 8, 12, ...): the ranks' models differ.
        codes[name.replace("resumed", "stopped")] = torchrun(resumed, HPCSWEEP_FAULT="stop,step=10,rank=0")
        stop_checkpoint = next((resumed / "checkpoints").glob("step00000010*")) / "resume"
        comm_keys[name] = sorted(k for k in read_metadata(stop_checkpoint).state_dict_metadata if k.startswith("comm."))
        codes[name] = torchrun(resumed)

    # Every trial has its own dir and port and shares nothing with another: two at a time, so one's
    # single-threaded phases (torchrun's start, the rendezvous, the exit) overlap the other's training.
    # The stop and its resume stay in order; what each run trains is the same as one at a time.
    jobs = [(stopped_and_resumed, name) for name in resumed_names]
    jobs += [(straight, name) for name in trials if name not in resumed_names]
    with ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
        for future in [pool.submit(run, name) for run, name in jobs]:
            future.result()
    return trials, codes, comm_keys


def curve(trial):
    return [loss for _, loss in losses(trial)]


def grad_norms(trial):
    events = EventAccumulator(str(trial / "tb"))
    events.Reload()
    return [e.value for e in events.Scalars("train/grad_norm")]


def test_every_trial_completes(runs):
    trials, codes, _ = runs
    assert codes == {**{name: 0 for name in trials}, "powersgd_stopped": 1, "local_sgd_stopped": 1}
    for name, trial in trials.items():
        metrics = read_metrics(trial)
        assert (metrics["status"], metrics["step"], metrics["world_size"]) == ("completed", 20, 2), name


def test_fsdp_and_ddp_start_alike_and_train_alike(runs):
    trials, *_ = runs
    ddp, fsdp = curve(trials["ddp"]), curve(trials["fsdp"])
    assert len(ddp) == len(fsdp) == 20
    assert max(abs(a - b) for a, b in zip(ddp, fsdp)) < 1e-4
    assert fsdp[-1] < fsdp[0] - 1.0  # real training, not a constant
    # The clipped norm is the whole model's, from DTensor shards as from DDP's full gradients.
    ddp_norms, fsdp_norms = grad_norms(trials["ddp"]), grad_norms(trials["fsdp"])
    assert max(abs(a - b) / a for a, b in zip(ddp_norms, fsdp_norms)) < 1e-4
    assert max(ddp_norms) > 1.0  # so trainer.grad_clip=1.0 did clip
    assert read_metrics(trials["fsdp"])["val_loss"] == pytest.approx(read_metrics(trials["ddp"])["val_loss"], abs=1e-4)
    assert read_metrics(trials["fsdp"])["parallel"] == "fsdp"
    assert read_metrics(trials["ddp"])["parallel"] == "ddp"
    # Sharded: each rank wrote its own shard of the weights (and no rank wrote the whole).
    model = next((trials["fsdp"] / "checkpoints").glob("step00000020*")) / "model"
    assert sorted(p.name for p in model.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    chunks = read_metadata(model).state_dict_metadata["model.model.embed_tokens.weight"].chunks
    assert len(chunks) == 2


def test_compressed_all_reduce_trains_close_to_the_full_one(runs):
    trials, *_ = runs
    ddp = curve(trials["ddp"])
    for name in ("bf16", "powersgd"):
        compressed = curve(trials[name])
        assert compressed[-1] < compressed[0] - 0.5, name
        assert compressed != ddp, name  # the hook did change what was reduced
    # bf16 rounds each gradient sum; rank-2 PowerSGD of a tiny model is far coarser.
    assert max(abs(a - b) for a, b in zip(ddp, curve(trials["bf16"]))) < 0.1
    # PowerSGD all-reduces in full until its warm-up ends (a step's loss comes before its reduction).
    assert curve(trials["powersgd"])[:WARMUP + 1] == ddp[:WARMUP + 1]


def test_a_powersgd_trial_stopped_and_resumed_ends_bit_identical(runs):
    trials, _, comm_keys = runs
    resumed, straight = read_metrics(trials["powersgd_resumed"]), read_metrics(trials["powersgd"])
    assert resumed["restarts"] == 1
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    assert curve(trials["powersgd_resumed"]) == curve(trials["powersgd"])
    # Each rank saved its own PowerSGD state (its error feedback is its own).
    assert comm_keys["powersgd_resumed"] == ["comm.rank0", "comm.rank1"]


def test_a_local_sgd_trial_stopped_between_averages_resumes_bit_identical(runs):
    trials, _, comm_keys = runs
    resumed, straight = read_metrics(trials["local_sgd_resumed"]), read_metrics(trials["local_sgd"])
    assert resumed["restarts"] == 1
    # Each rank resumed its own drifted model and Adam moments, not rank 0's copy of them.
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    assert curve(trials["local_sgd_resumed"]) == curve(trials["local_sgd"])
    assert comm_keys["local_sgd_resumed"] == ["comm.rank0", "comm.rank1"]


def test_local_sgd_trains_on_its_own_between_averages(runs):
    trials, *_ = runs
    ddp, local = curve(trials["ddp"]), curve(trials["local_sgd"])
    assert local[:WARMUP + 1] == ddp[:WARMUP + 1]  # the warm-up all-reduces every step
    assert local[WARMUP + 1:] != ddp[WARMUP + 1:]
    assert local[-1] < local[0] - 1.0
    assert torch.isfinite(torch.tensor(local)).all()
