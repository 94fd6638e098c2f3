"""``hydra/sweeper=search`` on the real local cluster: one throttled array whose tasks share one Optuna
journal with no driver, Hyperband pruning, and a USR2-stopped search trial that resumes as the same
study trial, bit-identical to an uninterrupted run of its parameters."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from .conftest import (
    SMALL_TRIAL,
    STOPPABLE_TRIAL,
    TERMINAL_STATES,
    read_json,
    run_hpcsweep,
    sacct_states,
    usr2_at_step,
    wait_for,
)
from .test_preemption import reference, wait_until_final  # noqa: F401  (reference: a fixture)

SEARCH = ["-m", "hydra/sweeper=search", "hydra.sweeper.seed=0"]
SPACE = ["model.lr=tag(log, interval(1e-4, 3e-2))", "trainer.warmup_steps=choice(1, 2)"]


def load_study(sweep_dir: Path):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(sweep_dir / "search" / "study.journal")))
    return optuna.load_study(study_name="search", storage=storage)


def only_sweep_dir(cwd: Path) -> Path:
    (sweep_file,) = cwd.glob("multirun/*/*/sweep.json")
    return sweep_file.parent


def array_ended(env: dict[str, str], array_id: str, n: int) -> bool:
    states = {k: v for k, v in sacct_states(env, array_id).items() if "_" in k and "[" not in k}
    return len(states) == n and all(v.split()[0] in TERMINAL_STATES for v in states.values())


def test_a_16_trial_hyperband_search_is_one_throttled_array_sharing_one_study(tmp_path, slurm_env):
    small = [o for o in SMALL_TRIAL if not o.startswith(("trainer.warmup_steps", "trainer.eval_every"))]
    started = time.monotonic()
    result = run_hpcsweep(
        [*SEARCH, *SPACE, *small, "trainer.eval_every=2", "hydra.sweeper.n_trials=16",
         "hydra.sweeper.pruner=hyperband", "hydra.launcher.array_parallelism=4"],
        tmp_path, slurm_env, timeout=120,
    )
    submit_s = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert submit_s < 30, f"the submit took {submit_s:.1f} s"
    sweep_dir = only_sweep_dir(tmp_path)
    sweep = read_json(sweep_dir / "sweep.json")
    (array,) = sweep["arrays"]
    assert array["trials"] == list(range(16))
    script = next(sweep_dir.glob(".submitit/*/*_submission.sh")).read_text()
    assert "#SBATCH --array=0-15%4" in script
    # Hyperband's last rung is the trials' trainer.max_steps, so the first wave can be pruned too.
    assert read_json(sweep_dir / "search" / "search.json")["settings"]["max_resource"] == 8

    wait_for(lambda: array_ended(slurm_env, array["array_job_id"], 16), timeout=400, what="the 16 search trials")
    study = load_study(sweep_dir)
    assert len(study.trials) == 16
    states = [t.state.name for t in study.trials]
    assert set(states) <= {"COMPLETE", "PRUNED"}, states
    assert "PRUNED" in states
    sweep = read_json(sweep_dir / "sweep.json")
    by_num = {t.user_attrs["hpcsweep_num"]: t for t in study.trials}
    assert sorted(by_num) == list(range(16)), "each slot ran exactly one study trial"
    for record in sweep["trials"]:
        trial = by_num[record["num"]]
        assert 1e-4 <= trial.params["model.lr"] <= 3e-2 and trial.params["trainer.warmup_steps"] in (1, 2)
        config = yaml.safe_load((sweep_dir / str(record["num"]) / "config.yaml").read_text())
        assert config["model"]["lr"] == trial.params["model.lr"]
        assert config["trainer"]["warmup_steps"] == trial.params["trainer.warmup_steps"]
        assert f"model.lr={trial.params['model.lr']}" in record["overrides"]
        metrics = read_json(sweep_dir / str(record["num"]) / "metrics.json")
        assert metrics["status"] == {"COMPLETE": "completed", "PRUNED": "pruned"}[trial.state.name]
    best = study.best_trial
    best_metrics = read_json(sweep_dir / str(best.user_attrs["hpcsweep_num"]) / "metrics.json")
    assert study.best_value == best_metrics["best_val_loss"]

    status = subprocess.run([sys.executable, "-m", "hpcsweep.status", str(sweep_dir)], env=slurm_env,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"{states.count('PRUNED')} pruned" in status.stdout.splitlines()[0]


def intermediate_steps(journal: Path, trial_id: int) -> list[int]:
    """Every step reported for ``trial_id``, in journal order (a step reported twice appears twice)."""
    steps = []
    for line in journal.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("trial_id") == trial_id and "intermediate_value" in entry:
            steps.append(entry["step"])
    return steps


LONGER = ["trainer.max_steps=150", "trainer.eval_every=50"]
"""Long enough (~8 s on one thread) for the stop to land mid-run, after the first report."""


def test_a_search_trial_stopped_by_usr2_resumes_as_the_same_study_trial(tmp_path, slurm_env, reference):
    result = run_hpcsweep([*SEARCH, SPACE[0], *STOPPABLE_TRIAL, *LONGER, "hydra.sweeper.n_trials=1"], tmp_path,
                          slurm_env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = only_sweep_dir(tmp_path)
    (trial,) = read_json(sweep_dir / "sweep.json")["trials"]
    trial_dir = sweep_dir / "0"
    wait_for(lambda: (sweep_dir / "search" / "trials" / "0.json").exists(), timeout=120, what="the trial's parameters")
    choice = read_json(sweep_dir / "search" / "trials" / "0.json")
    (lr,) = [o for o in choice["overrides"] if o.startswith("model.lr=")]
    expected = reference(1, *LONGER, lr)
    # After the first report, so that the resumed trial could report a step twice.
    usr2_at_step(slurm_env, trial["job_id"], trial_dir, 51)

    metrics = wait_until_final(slurm_env, trial["job_id"], trial_dir)
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["restarts"] >= 1 and metrics["last_stop_reason"] == "time_limit"
    assert metrics["weights_sha256"] == expected.weights_sha256()
    study = load_study(sweep_dir)
    (study_trial,) = study.trials
    assert study_trial.state.name == "COMPLETE" and study_trial.number == choice["study_trial"]
    assert study_trial.params == choice["params"]
    assert study_trial.value == metrics["best_val_loss"]
    steps = intermediate_steps(sweep_dir / "search" / "study.journal", study_trial._trial_id)
    assert sorted(steps) == sorted(set(steps)) == [50, 100, 150]
    config = yaml.safe_load((trial_dir / "config.yaml").read_text())
    assert config["model"]["lr"] == choice["params"]["model.lr"]


def test_a_two_node_search_trial_runs_its_chosen_parameters_and_is_pruned_on_both_nodes(tmp_path, slurm_env):
    # Seed 0 draws lr 3e-3 for trial 0 and 1e-6 for trial 1 (asserted below): trial 1 stays far
    # behind trial 0 at its first evaluation, where the median pruner stops it.
    settings = ["hydra.sweeper.sampler=random", "hydra.sweeper.pruner=median", "hydra.sweeper.n_startup_trials=1",
                "hydra.sweeper.n_trials=2", "hydra.launcher.array_parallelism=1"]
    shape = ["trainer.nodes=2", "trainer.nproc_per_node=1", "hydra.launcher.cpus_per_task=1"]
    result = run_hpcsweep([*SEARCH, "model.lr=choice(3e-3, 1e-6)", *settings, *STOPPABLE_TRIAL, *shape],
                          tmp_path, slurm_env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = only_sweep_dir(tmp_path)
    (array,) = read_json(sweep_dir / "sweep.json")["arrays"]
    wait_for(lambda: array_ended(slurm_env, array["array_job_id"], 2), timeout=300, what="the two search trials")
    states = {k: v.split()[0] for k, v in sacct_states(slurm_env, array["array_job_id"]).items() if "_" in k}
    assert set(states.values()) == {"COMPLETED"}, states

    by_num = {t.user_attrs["hpcsweep_num"]: t for t in load_study(sweep_dir).trials}
    assert [by_num[n].params["model.lr"] for n in (0, 1)] == [3e-3, 1e-6]
    journal = sweep_dir / "search" / "study.journal"
    done, pruned = read_json(sweep_dir / "0" / "metrics.json"), read_json(sweep_dir / "1" / "metrics.json")
    for metrics in (done, pruned):
        assert len(set(metrics["nodes"])) == 2 and len(metrics["ranks"]) == 2, metrics["nodes"]
    # Both nodes trained the chosen parameters: node 1 read them from search/trials/0.json.
    assert yaml.safe_load((sweep_dir / "0" / "config.yaml").read_text())["model"]["lr"] == 3e-3
    assert by_num[0].state.name == "COMPLETE" and by_num[0].value == done["best_val_loss"]
    # Only rank 0 reports: one value per evaluation.
    assert intermediate_steps(journal, by_num[0]._trial_id) == [10, 20]
    # Pruned at its first evaluation, and both nodes stopped there: their jobs completed, nothing hung.
    assert by_num[1].state.name == "PRUNED" and intermediate_steps(journal, by_num[1]._trial_id) == [10]
    assert (pruned["status"], pruned["step"]) == ("pruned", 10)


def test_a_4_trial_median_search_on_slurm_says_when_its_lowered_pruner_starts(tmp_path, slurm_env):
    """Issue 41: the docs' 4-trial median search could never prune (n_startup_trials=5) and said nothing; on Slurm
    the submit now says the start-up it lowered, and the study's pruner has it."""
    small = [o for o in SMALL_TRIAL if not o.startswith("trainer.warmup_steps")]  # SPACE searches it
    result = run_hpcsweep([*SEARCH, *SPACE, *small, "hydra.sweeper.n_trials=4", "hydra.sweeper.pruner=median"],
                          tmp_path, slurm_env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("pruner median (prunes once 1 trial has completed: n_startup_trials=5 lowered to 1 for the pruner, as 4 "
            "trials would leave it none to prune)") in result.stdout + result.stderr
    sweep_dir = only_sweep_dir(tmp_path)
    assert read_json(sweep_dir / "search" / "search.json")["settings"]["pruner_startup_trials"] == 1
    # The words and the record were under test, not the trials: free the cluster for the other tests.
    array_id = read_json(sweep_dir / "sweep.json")["arrays"][0]["array_job_id"]
    subprocess.run(["scancel", array_id], env=slurm_env, check=True, timeout=60)
