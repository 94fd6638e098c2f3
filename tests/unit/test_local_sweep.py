"""Without a reachable Slurm, ``python -m hpcsweep -m`` runs the trials on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SMALL = ["trainer.max_steps=6", "trainer.eval_every=3", "trainer.ckpt_every=3", "data.batch_size=4", "data.seq_len=32"]


def run(args, cwd, env):
    return subprocess.run([sys.executable, "-m", "hpcsweep", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def no_slurm_env():
    # A config file that does not exist makes `scontrol ping` fail, as on a machine without Slurm.
    return {**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf"}


def test_local_sweep_runs_every_trial_and_writes_sweep_json(tmp_path):
    result = run(["-m", "model.lr=1e-4,3e-4", *SMALL], tmp_path, no_slurm_env())
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    (line,) = [line for line in output.splitlines() if "controller" in line or "scontrol" in line]
    # Said at once: the file SLURM_CONF names is not there, so no Slurm command can run (scontrol would
    # retry for about a minute before it said so).
    assert line.endswith("] no Slurm controller (SLURM_CONF=/nonexistent/slurm.conf is no file): running locally"), output
    assert "resolve_ctls_from_dns_srv" not in output and "configuration source" not in output

    (sweep_file,) = tmp_path.glob("multirun/*/*/sweep.json")
    sweep = json.loads(sweep_file.read_text())
    assert sweep["launcher"] == "local"
    assert [t["overrides"] for t in sweep["trials"]] == [["model.lr=0.0001", *SMALL], ["model.lr=0.0003", *SMALL]]
    hashes = []
    for trial in sweep["trials"]:
        metrics = json.loads((tmp_path / trial["trial_dir"] / "metrics.json").read_text())
        assert metrics["status"] == "completed"
        assert metrics["step"] == metrics["max_steps"] == 6
        for key in ("train_loss", "val_loss", "best_val_loss", "tokens_per_s"):
            assert metrics[key] > 0, key
        assert metrics["restarts"] == 0
        hashes.append(metrics["weights_sha256"])
    assert len(set(hashes)) == 2, "two learning rates must give two different models"

    # It ends as a Slurm submission does: what ran, then the commands that show the sweep.
    sweep_dir = sweep_file.parent.resolve()
    assert [line.split("] ", 1)[1] for line in result.stdout.splitlines()[-3:]] == [
        "sweep done: 2 trial(s) ran: 2 completed, 0 failed",
        f"status: python -m hpcsweep.status {sweep_dir}",
        f"report: python -m hpcsweep.report {sweep_dir}",
    ], result.stdout[-2000:]


def test_forced_local_launcher_and_bad_value_runs_nothing(tmp_path):
    result = run(["-m", "hydra/launcher=local", "model.lr=1e-3,-1", *SMALL], tmp_path, dict(os.environ))
    output = result.stdout + result.stderr
    assert result.returncode == 2
    assert "trial #1 (model.lr=-1" in output and "model.lr=-1.0 is not allowed: a learning rate > 0" in output
    assert not (tmp_path / "multirun").exists(), "a refused sweep leaves no dir holding only multirun.yaml"


def test_single_run_with_bad_value_exits_with_the_key(tmp_path):
    result = run(["model.lr=-1"], tmp_path, no_slurm_env())
    assert result.returncode == 2
    assert "model.lr=-1.0 is not allowed" in result.stdout + result.stderr


def test_several_nodes_without_slurm_are_refused_before_anything_runs(tmp_path):
    result = run(["-m", "model.lr=1e-4,3e-4", "trainer.nodes=2", *SMALL], tmp_path, no_slurm_env())
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    (refusal,) = [line for line in output.splitlines() if "not allowed" in line]
    assert refusal.endswith(
        "] trial #0: trainer.nodes=2 is not allowed here: a local run has one node; run it where sbatch reaches "
        "a Slurm controller (hydra/launcher=auto, the default, or hydra/launcher=slurm); no trial was run"
    ), refusal
    assert "Traceback" not in output
    assert not (tmp_path / "multirun").exists(), "nothing written"


def test_the_spawn_start_method_still_runs_a_trial_without_the_fork_server(tmp_path):
    # ++: the key is set whether or not the launcher config declares it.
    result = run(["-m", "model.lr=1e-4", *SMALL, "++hydra.launcher.start_method=spawn"], tmp_path, no_slurm_env())
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    (trial_dir,) = [path.parent for path in tmp_path.glob("multirun/*/*/0/metrics.json")]
    assert json.loads((trial_dir / "metrics.json").read_text())["status"] == "completed"
    assert "fork server" not in output


def test_an_unknown_start_method_runs_nothing_and_names_the_key(tmp_path):
    result = run(["-m", "model.lr=1e-4", *SMALL, "++hydra.launcher.start_method=fork"], tmp_path, no_slurm_env())
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert ("hydra.launcher.start_method='fork' is not allowed: forkserver (trials forked from a process that has "
            "imported torch once) or spawn (a fresh interpreter per trial); no trial was run") in output
    assert not (tmp_path / "multirun").exists()
