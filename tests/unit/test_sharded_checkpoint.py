"""Two gloo ranks under torchrun: sharded checkpoints written in the background, and a save killed
half-way (SIGKILL while rank 0 is paused inside it) leaving the previous checkpoint to resume from."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpcsweep.train.checkpoint.manager import RESUME_DIR, WEIGHTS_DIR, checkpoint_paths, parse_name
from hpcsweep.train.checkpoint.store import read_metadata
from hpcsweep.train.fault import MARKER_FILE

from .test_trainer_ddp import free_port
from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)

SETTINGS = {
    "data.batch_size": 4, "data.seq_len": 32, "data.synthetic_tokens": 50_000, "model.dropout": 0.1,
    "trainer.device": "cpu", "trainer.max_steps": 10, "trainer.warmup_steps": 2, "trainer.eval_every": 5,
    "trainer.eval_batches": 1, "trainer.log_every": 5, "trainer.ckpt_every": 3,
}


def start_torchrun(trial: Path, **env: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", "hpcsweep.train", str(trial),
    ]
    return subprocess.Popen(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, stdout=subprocess.DEVNULL,
        stderr=open(trial / "torchrun.err", "a"), start_new_session=True,
    )


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it, from /proc (torchrun starts its workers in sessions of
    their own, so killing torchrun's process group leaves them running)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and its workers, as a node failure would; wait until torchrun is gone."""
    for pid in process_tree(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)


def is_worker(pid: int) -> bool:
    """Whether ``pid`` still runs an hpcsweep worker (a zombie has an empty command line)."""
    try:
        return "hpcsweep.train" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return False


def run_torchrun(trial: Path, **env: str) -> int:
    return start_torchrun(trial, **env).wait(timeout=300)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    trial = make_trial_dir(tmp_path_factory.mktemp("sharded") / "straight", SETTINGS)
    assert run_torchrun(trial) == 0
    return trial


def test_every_rank_writes_its_share_and_reads_its_own_rng(straight):
    newest = checkpoint_paths(straight / "checkpoints")[0]
    assert parse_name(newest.name)[0] == 10
    for part in (WEIGHTS_DIR, RESUME_DIR):
        shards = {p.name: p.stat().st_size for p in (newest / part).glob("*.distcp")}
        assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp"] and min(shards.values()) > 1000, (part, shards)
    keys = read_metadata(newest / RESUME_DIR).state_dict_metadata
    assert {k.split(".")[1] for k in keys if k.startswith("rng.")} == {"rank0", "rank1"}
    # Only the newest keeps what resuming needs; the best others keep their weights.
    assert [(p / RESUME_DIR).exists() for p in checkpoint_paths(straight / "checkpoints")][0] is True
    assert not any((p / RESUME_DIR).exists() for p in checkpoint_paths(straight / "checkpoints")[1:])


def test_a_save_killed_half_way_leaves_the_previous_checkpoint_and_no_temp_file(straight, tmp_path):
    trial = make_trial_dir(tmp_path / "killed", SETTINGS)
    marker = trial / MARKER_FILE  # written as rank 0 pauses inside the save
    proc = start_torchrun(trial, HPCSWEEP_FAULT="hang_in_save,step=6,rank=0")
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert proc.poll() is None, "training ended before the save of step 6 paused"
        assert time.monotonic() < deadline, "rank 0 never paused inside the save of step 6"
        time.sleep(0.2)
    workers = process_tree(proc.pid)[1:]
    kill_tree(proc)
    deadline = time.monotonic() + 30
    while any(is_worker(pid) for pid in workers):
        assert time.monotonic() < deadline, "a worker outlived the kill"
        time.sleep(0.1)
    checkpoints = trial / "checkpoints"
    temp = [p.name for p in checkpoints.iterdir() if p.name.startswith(".tmp-")]
    assert temp == [".tmp-step00000006.pt"]  # the kill did land inside the save (no evaluation at step 6)
    assert [parse_name(p.name)[0] for p in checkpoint_paths(checkpoints)] == [3]

    assert run_torchrun(trial) == 0
    log = (trial / "train.log").read_text()
    assert f"removed {checkpoints / temp[0]}, left by a save that did not finish" in log
    assert "resumed from step00000003.pt" in log and "resumed from step00000003.pt" in (trial / "logs" / "rank1.log").read_text()
    assert not [p for p in checkpoints.rglob(".tmp-*")]
    done, reference = read_metrics(trial), read_metrics(straight)
    assert (done["status"], done["step"]) == ("completed", 10)
    # Resumed from the step-3 checkpoint, written in the background while step 4 trained: exact.
    assert done["weights_sha256"] == reference["weights_sha256"]
