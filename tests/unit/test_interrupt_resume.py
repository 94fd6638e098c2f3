"""Ctrl-C stops a local sweep with a checkpoint and says how to resume; resuming checks the config."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

# Tiny trials: long enough (100 steps) to be interrupted mid-run after the step-10 checkpoint.
TINY = [
    "hydra/launcher=local", "trainer.device=cpu", "trainer.nproc_per_node=1", "trainer.max_steps=100",
    "trainer.warmup_steps=2", "trainer.eval_every=100", "trainer.eval_batches=1", "trainer.ckpt_every=10",
    "trainer.log_every=50", "data.batch_size=4", "data.seq_len=32", "data.synthetic_tokens=50000",
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
]
SWEEP = ["-m", "model.lr=1e-4,3e-4", *TINY]


def env() -> dict[str, str]:
    # One thread per process: the tests share two cores with everything else.
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def hpcsweep(args: list[str], cwd: Path, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcsweep", *args], cwd=cwd, env={**env(), **extra_env},
        capture_output=True, text=True, timeout=600,
    )


def wait_for(condition, proc: subprocess.Popen, what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"the command ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.01)


def metrics(trial_dir: Path) -> dict:
    return json.loads((trial_dir / "metrics.json").read_text())


def test_ctrl_c_stops_the_sweep_with_a_checkpoint_and_the_printed_command_resumes_it(tmp_path):
    # Its own process group, as a terminal's foreground job: the Ctrl-C goes to the whole group.
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcsweep", *SWEEP], cwd=tmp_path, env=env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        wait_for(lambda: list(tmp_path.glob("multirun/*/*/0/checkpoints/step00000010*.pt")), proc,
                 "checkpoint of trial 0 at step 10")
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    (line,) = [line for line in (stdout + stderr).splitlines() if "resume with:" in line]
    assert line.startswith("interrupted: trial #0 stopped at step ")
    (sweep_dir,) = tmp_path.glob("multirun/*/*")
    stopped = metrics(sweep_dir / "0")
    assert (stopped["status"], stopped["last_stop_reason"]) == ("stopped", "interrupted")
    assert 10 <= stopped["step"] < 100 and f"step {stopped['step']} with a checkpoint" in line
    # No further trial starts after Ctrl-C; the one left says so, in status too, instead of pending.
    assert [path.name for path in (sweep_dir / "1").iterdir()] == ["metrics.json"]
    assert metrics(sweep_dir / "1")["status"] == "not_started"
    shown = subprocess.run([sys.executable, "-m", "hpcsweep.status", str(sweep_dir)], cwd=tmp_path, env=env(),
                           capture_output=True, text=True, timeout=120)
    assert "2 trials, 1 stopped, 1 not_started" in shown.stdout, shown.stdout + shown.stderr
    assert "pending" not in shown.stdout
    assert f"status: python -m hpcsweep.status {sweep_dir}" in stdout
    train_log = (sweep_dir / "0" / "train.log").read_text()
    assert f"saved at step {stopped['step']}, stopped" in train_log and "requeue" not in train_log  # nothing requeues locally

    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[:3] == ["python", "-m", "hpcsweep"]
    assert command[-1] == f"hydra.sweep.dir={sweep_dir.relative_to(tmp_path)}"
    resumed = hpcsweep(command[3:], tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from step{stopped['step']:08d}" in (sweep_dir / "0" / "train.log").read_text()

    # Once more: both trials have ended, neither is trained again.
    again = hpcsweep(command[3:], tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (again.stdout + again.stderr).count("not training it again") == 2

    reference = hpcsweep([*SWEEP, "hydra.sweep.dir=reference"], tmp_path)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    assert [t["num"] for t in sweep["trials"]] == [0, 1]
    for num in (0, 1):
        done, straight = metrics(sweep_dir / str(num)), metrics(tmp_path / "reference" / str(num))
        assert (done["status"], done["step"]) == ("completed", 100)
        assert done["weights_sha256"] == straight["weights_sha256"], f"trial {num}"
    assert metrics(sweep_dir / "0")["restarts"] == 1 and metrics(sweep_dir / "1")["restarts"] == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sweep_killed_outright_takes_its_running_trial_down_with_a_checkpoint(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcsweep", *SWEEP], cwd=tmp_path, env=env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    trial_dir = None
    try:
        wait_for(lambda: list(tmp_path.glob("multirun/*/*/0/checkpoints/step00000010*.pt")), proc,
                 "checkpoint of trial 0 at step 10")
        (trial_dir,) = [p.parent for p in tmp_path.glob("multirun/*/*/0/checkpoints")]
        (rank,) = metrics(trial_dir)["ranks"]
        assert pid_alive(rank["pid"])
        proc.kill()  # SIGKILL: the sweep passes nothing on
        proc.wait(timeout=60)
        deadline = time.monotonic() + 120
        while pid_alive(rank["pid"]) or metrics(trial_dir)["status"] == "running":
            assert time.monotonic() < deadline, "the trial process outlived its sweep by 120 s"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
    stopped = metrics(trial_dir)
    assert stopped["status"] == "stopped", stopped
    assert 10 <= stopped["step"] < 100
    assert list((trial_dir / "checkpoints").glob(f"step{stopped['step']:08d}*.pt")), "stopped with a checkpoint"


def test_resuming_with_another_lr_is_refused_unless_forced(tmp_path):
    first = hpcsweep(["model.lr=1e-4", *TINY, "hydra.run.dir=trial"], tmp_path, HPCSWEEP_FAULT="stop,step=2,rank=0")
    assert first.returncode == 5, first.stdout + first.stderr  # stopped with a checkpoint, nothing requeues
    assert metrics(tmp_path / "trial")["status"] == "stopped"

    refused = hpcsweep(["model.lr=3e-3", "trainer.max_steps=50", *TINY[:3], *TINY[4:], "hydra.run.dir=trial"], tmp_path)
    assert refused.returncode == 2
    (line,) = [line for line in (refused.stdout + refused.stderr).splitlines() if "different config" in line]
    assert "model.lr=0.0001 (now 0.003), trainer.max_steps=100 (now 50); rerun with the same overrides" in line
    assert "resume.force=true" in line
    assert metrics(tmp_path / "trial")["step"] == 2, "nothing trained"

    forced = hpcsweep(["model.lr=3e-3", *TINY, "resume.force=true", "hydra.run.dir=trial"], tmp_path)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    done = metrics(tmp_path / "trial")
    assert (done["status"], done["step"], done["restarts"]) == ("completed", 100, 1)
    (aside,) = (tmp_path / "trial").glob("config.before-*.yaml")
    assert "lr: 0.0001" in aside.read_text() and "lr: 0.003" in (tmp_path / "trial" / "config.yaml").read_text()


def test_a_typo_names_the_closest_key_for_a_run_and_a_sweep(tmp_path):
    for args in (["model.lrr=1e-3"], ["-m", "model.lrr=1e-3,2e-3"]):
        result = hpcsweep(args, tmp_path)
        assert result.returncode == 2
        assert result.stderr.startswith("model.lrr is not a config key; did you mean model.lr? (keys of model: arch,")
        assert "+model.lrr" not in result.stdout + result.stderr
    assert not list(tmp_path.iterdir()), "nothing written"
