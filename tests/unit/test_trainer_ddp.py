"""Two gloo ranks under torchrun: exact resume, and equivalence with one rank at twice the batch."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpcsweep.control.exit_codes import EXIT_STOPPED
from hpcsweep.train import worker as train

from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)

BASE = {
    "data.batch_size": 4,
    "data.seq_len": 32,
    "data.synthetic_tokens": 50_000,
    "model.dropout": 0.0,
    "trainer.device": "cpu",
    "trainer.max_steps": 10,
    "trainer.warmup_steps": 2,
    "trainer.eval_every": 5,
    "trainer.eval_batches": 1,
    "trainer.log_every": 1,
    "trainer.ckpt_every": 0,
}


def make_trial(path: Path, **overrides) -> Path:
    return make_trial_dir(path, {**BASE, **overrides})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(trial: Path, attempt_file: Path | None = None, nproc: int = 2, **env: str) -> int:
    """``torchrun --nproc-per-node=NPROC -m hpcsweep.train TRIAL [ATTEMPT_FILE]``, as production launches it.

    torchrun exits 1 when a worker exits non-zero, EXIT_STOPPED included; metrics.json tells.
    """
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", "hpcsweep.train", str(trial),
        *([] if attempt_file is None else [str(attempt_file)]),
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=300)
    with open(trial / "torchrun.err", "a") as f:
        f.write(done.stderr)
    return done.returncode



def losses(trial: Path) -> list[tuple[int, float]]:
    events = EventAccumulator(str(trial / "tb"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("train/loss")]


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    straight = make_trial(root / "straight")
    resumed = make_trial(root / "resumed")
    codes = [torchrun(straight), torchrun(resumed, HPCSWEEP_FAULT="stop,step=5,rank=0")]
    stopped = read_metrics(resumed)
    codes.append(torchrun(resumed))
    return straight, resumed, codes, stopped


def test_two_ranks_stop_and_resume_exactly(two_rank_runs):
    straight, resumed, codes, stopped = two_rank_runs
    assert codes == [0, 1, 0]
    assert (stopped["status"], stopped["step"]) == ("running", 5)
    assert f"exitcode  : {EXIT_STOPPED}" in (resumed / "torchrun.err").read_text()
    done, reference = read_metrics(resumed), read_metrics(straight)
    assert (done["status"], done["step"], done["restarts"], done["world_size"]) == ("completed", 10, 1, 2)
    assert done["weights_sha256"] == reference["weights_sha256"]
    assert "resumed from step00000005" in (resumed / "train.log").read_text()
    assert "resumed from step00000005" in (resumed / "logs" / "rank1.log").read_text()


def test_ranks_record_where_they_ran(two_rank_runs):
    straight, *_ = two_rank_runs
    ranks = read_metrics(straight)["ranks"]
    assert [(r["rank"], r["local_rank"]) for r in ranks] == [(0, 0), (1, 1)]
    assert len({r["pid"] for r in ranks}) == 2
    assert read_metrics(straight)["nodes"] == [socket.gethostname()]
    # Rank 0 summarised the telemetry its node's local rank 0 sampled, through the log windows' gather.
    telemetry = read_metrics(straight)["telemetry"]
    assert (telemetry["source"], telemetry["reason"], telemetry["gpus"]) == (
        "cpu", "the trial trains on CPU: no GPU to read", [])


@pytest.mark.parametrize("one_rank", [{"data.batch_size": 8}, {"trainer.grad_accum": 2}])
def test_two_ranks_equal_one_rank_with_twice_the_batch(two_rank_runs, tmp_path, one_rank):
    straight, *_ = two_rank_runs
    single = make_trial(tmp_path / "single", **one_rank)
    assert train.run_trial(single) == 0
    two, one = losses(straight), losses(single)
    assert [s for s, _ in two] == [s for s, _ in one] == list(range(1, 11))
    assert max(abs(a - b) for (_, a), (_, b) in zip(two, one)) < 1e-5
    assert two[-1][1] < two[0][1] - 0.5  # the curves are real training, not a constant
    assert abs(read_metrics(straight)["val_loss"] - read_metrics(single)["val_loss"]) < 1e-5
