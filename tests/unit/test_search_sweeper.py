"""``hydra/sweeper=search`` on the local launcher: validation before anything runs, then the same
search one trial after another, pruning included, resumable by running the sweep dir again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TINY = [
    "trainer.max_steps=8", "trainer.eval_every=2", "trainer.ckpt_every=4", "trainer.log_every=2",
    "trainer.eval_batches=1", "data.batch_size=4", "data.seq_len=32",
]
SEARCH = ["-m", "hydra/sweeper=search", "hydra/launcher=local", "hydra.sweeper.seed=0"]


def run(args, cwd):
    return subprocess.run([sys.executable, "-m", "hpcsweep", *args], cwd=cwd, env=dict(os.environ),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (["model.lr=interval(0.1, 0.01)"], "model.lr=interval(0.1, 0.01) is not allowed: low > high"),
        (["model.lr=tag(log, interval(0, 0.1))"], "a log scale needs low > 0"),
        (["model.nope=interval(0, 1)"], "model.nope is not a config key"),
        (["model.lr=interval(1e-3, 2)", "trainer.warmup_steps=tag(int, interval(-5, 10))"],
         "search space: trainer.warmup_steps=-5 is not allowed: an integer >= 0"),
        (["model.dropout=interval(0.0, 1.0)"], "search space: model.dropout=1.0 is not allowed: 0 <= dropout < 1"),
        (["model.lr=interval(1e-3, 2e-3)", "hydra.sweeper.pruner=asha"], "hydra.sweeper.pruner='asha' is not allowed"),
        (["model.lr=interval(1e-3, 2e-3)", "hydra.sweeper.pruner=median", "hydra.sweeper.n_trials=1"],
         "hydra.sweeper.pruner=median is not allowed with n_trials=1"),
    ],
)
def test_a_bad_search_stops_with_one_line_and_runs_nothing(tmp_path, space, message):
    result = run([*SEARCH, *space, *TINY], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert len([line for line in output.splitlines() if message in line]) == 1, output
    assert "Traceback" not in output
    assert not (tmp_path / "multirun").exists()


def load_study(sweep_dir: Path):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(sweep_dir / "search" / "study.journal")))
    return optuna.load_study(study_name="search", storage=storage)


def test_a_local_search_runs_its_trials_in_turn_prunes_and_resumes(tmp_path):
    space = ["model.lr=tag(log, interval(1e-4, 3e-2))", "trainer.warmup_steps=choice(1, 2)"]
    # n_startup_trials stays at its 5, which 4 trials never pass: the median pruner's start-up is lowered, and said.
    settings = ["hydra.sweeper.n_trials=4", "hydra.sweeper.pruner=median"]
    result = run([*SEARCH, *space, *settings, *TINY], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("pruner median (prunes once 1 trial has completed: n_startup_trials=5 lowered to 1 for the pruner, as 4 "
            "trials would leave it none to prune)") in result.stdout + result.stderr
    (sweep_dir,) = [p.parent for p in tmp_path.glob("multirun/*/*/sweep.json")]

    study = load_study(sweep_dir)
    assert len(study.trials) == 4
    states = [t.state.name for t in study.trials]
    assert set(states) <= {"COMPLETE", "PRUNED"} and "PRUNED" in states and "COMPLETE" in states
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    for record, trial in zip(sweep["trials"], study.trials):
        assert trial.user_attrs["hpcsweep_num"] == record["num"]
        config = yaml.safe_load((sweep_dir / str(record["num"]) / "config.yaml").read_text())
        assert config["model"]["lr"] == trial.params["model.lr"]
        assert config["trainer"]["warmup_steps"] == trial.params["trainer.warmup_steps"]
        assert f"model.lr={trial.params['model.lr']}" in record["overrides"]
        metrics = json.loads((sweep_dir / str(record["num"]) / "metrics.json").read_text())
        assert metrics["status"] == {"COMPLETE": "completed", "PRUNED": "pruned"}[trial.state.name]
        if trial.state.name == "PRUNED":
            assert metrics["step"] < metrics["max_steps"]
            assert sorted(trial.intermediate_values) == list(range(2, metrics["step"] + 1, 2))
        else:
            assert trial.value == metrics["best_val_loss"]
    assert study.best_value == min(t.value for t in study.trials if t.state.name == "COMPLETE")

    # TensorBoard (HParams included) shows where each pruned trial stopped.
    from hpcsweep.results.table import load_sweep

    loaded = load_sweep(sweep_dir)
    pruned = [row for row in loaded.rows if row.status == "pruned"]
    assert pruned
    for row in pruned:
        assert loaded.scalars[row.num]["hparams/pruned_at_step"].values == [row.step]

    plot = tmp_path / "report.png"
    report = subprocess.run([sys.executable, "-m", "hpcsweep.report", str(sweep_dir), "--plot", str(plot)],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert plot.stat().st_size > 0
    best = study.best_trial
    assert f"best: #{best.user_attrs['hpcsweep_num']} (study trial {best.number})" in report.stdout
    assert "rerun it as one trial: python -m hpcsweep " in report.stdout
    rerun, export = report.stdout.splitlines()[-2:]
    assert f"model.lr={best.params['model.lr']}" in rerun
    # Next to the rerun command, the command that exports that trial in Hugging Face format.
    num = best.user_attrs["hpcsweep_num"]
    assert export == (f"export trial #{num} in Hugging Face format: python -m hpcsweep.export {sweep_dir} "
                      f"--trial {num} --out {sweep_dir}/export-{num}")
    assert " pruned " in report.stdout

    # Running the sweep dir again resumes it: every slot finds its study trial, nothing new is asked.
    again = run([*SEARCH, *space, *settings, *TINY, f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [(t.number, t.state, t.params) for t in load_study(sweep_dir).trials] == [
        (t.number, t.state, t.params) for t in study.trials
    ]
    changed = run([*SEARCH, "model.lr=tag(log, interval(1e-4, 1e-2))", space[1], *settings, *TINY,
                   f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert changed.returncode == 2
    assert "hydra.sweep.dir holds a search with other space" in changed.stdout + changed.stderr
    assert len(load_study(sweep_dir).trials) == 4
