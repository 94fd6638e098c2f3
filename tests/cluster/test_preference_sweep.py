"""Issue 43's acceptance on the real local cluster: ``objective=dpo`` sweeps of a chat-template MoE folder (a DeepseekV3
at its config class's defaults, sizes shrunk, with Qwen 3's real template) on preference pairs whose chosen answer
follows a rule and whose rejected one breaks it.

- A 4-trial LoRA beta sweep learns the rule (the best trial's ``val_reward_accuracy`` above 0.5); its one preparation
  job computes the reference log-probabilities once, its trials read them (no reference forward), and a second sweep
  on the same folder, pairs and token cache reuses them: its submit says so and queues no preparation job.
- A full fine-tuning DPO trial stopped by USR2 is requeued and ends with the weights of the same trial run straight.
- A search maximising ``val_reward_accuracy`` prunes on it, in one array.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.chat_fixtures import REAL_TEMPLATES
from tests.model_folders import make_model_folder
from tests.preference_fixtures import right_and_wrong_pairs, write_preference_file

from .conftest import (
    SMALL_TRIAL,
    STOPPABLE_TRIAL,
    TERMINAL_STATES,
    all_job_ids,
    only_sweep_dir,
    read_json,
    run_hpcsweep,
    sacct_states,
    submitted_from,
    usr2_at_step,
    wait_for,
    wait_until_ended,
)
from .test_preemption import outside_any_job, wait_until_final
from .test_search import SEARCH, intermediate_steps, load_study

PAIRS = 64
"""48 training and 16 validation pairs (``data.val_fraction=0.25``); each of the 128 sequences is about 50 tokens."""
PRECOMPUTED = "reference log-probabilities: precomputed"
ADAPTERS_OFF = "reference: the model with its adapters off"


@pytest.fixture(scope="module")
def user_files(tmp_path_factory) -> tuple[Path, Path]:
    """A DeepseekV3 MoE folder whose tokenizer knows the turn markers, and a file of pairs: the folder and the glob."""
    root = tmp_path_factory.mktemp("preference")
    folder = make_model_folder(root / "small-deepseek", chat_markers=True)
    write_preference_file(root / "pairs" / "a.jsonl", right_and_wrong_pairs(PAIRS))
    return folder, root / "pairs"


def dpo_settings(folder: Path, pairs: Path, cache: Path) -> list[str]:
    """The overrides of a DPO trial of ``folder`` on ``pairs``' files, tokenized into ``cache``."""
    return ["model=pretrained", f"model.path={folder}", "objective=dpo", "data=preference",
            f"data.files={pairs}/*.jsonl", f"data.chat_template={REAL_TEMPLATES['qwen3']}", f"data.cache_dir={cache}",
            "data.seq_len=64", "data.val_fraction=0.25"]


# Four validation batches of four pairs: every validation pair, so a reward accuracy above 0.5 is most of them.
SMALL_DPO_TRIAL = [o for o in SMALL_TRIAL if not o.startswith(("data.seq_len", "trainer.eval_batches"))] + [
    "trainer.eval_batches=4"]


def array_ended(env: dict[str, str], array_id: str, n: int) -> dict[str, str] | None:
    """The array's ``n`` task states once every one has ended; None before."""
    states = {k: v.split()[0] for k, v in sacct_states(env, array_id).items() if "_" in k and "[" not in k}
    return states if len(states) == n and set(states.values()) <= TERMINAL_STATES else None


def train_log(trial_dir: Path) -> str:
    return (trial_dir / "train.log").read_text()


def test_a_lora_beta_sweep_learns_the_rule_on_a_reference_computed_once_that_a_second_sweep_reuses(
        tmp_path, slurm_env, user_files):
    folder, pairs = user_files
    cache = tmp_path / "token-cache"
    lora = [*SMALL_DPO_TRIAL, *dpo_settings(folder, pairs, cache), "model.peft=lora", "model.lr=1e-2"]
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    result = run_hpcsweep(["-m", *lora, "objective.beta=0.05,0.1,0.3,1.0"], first, slurm_env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = only_sweep_dir(first)
    record = read_json(sweep_dir / "sweep.json")
    (array,) = record["arrays"]
    preparation = record["token_preparation"]
    assert wait_until_ended(slurm_env, preparation["job_id"], timeout=400) == "COMPLETED"
    states = wait_for(lambda: array_ended(slurm_env, array["array_job_id"], 4), timeout=600, what="the 4 DPO trials")
    assert set(states.values()) == {"COMPLETED"}, states

    # One job computed the reference once: 128 answers (each pair's chosen and rejected), into the pairs' entry.
    (entry,) = cache.iterdir()
    assert preparation["entries"] == [str(entry)]
    prep_log = Path(preparation["log"]).read_text()
    assert prep_log.count(f"reference log-probabilities of {2 * PAIRS} answers under {folder} computed") == 1, prep_log
    (reference,) = entry.glob("reference-*.bin")
    logps = np.fromfile(reference, dtype=np.float64)
    assert len(logps) == 2 * PAIRS and np.isfinite(logps).all() and (logps < 0).all()
    written = reference.stat()

    # Every trial read them (no forward of the model with its adapters off) and learned the rule.
    accuracies = {}
    for trial in record["trials"]:
        trial_dir = sweep_dir / str(trial["num"])
        metrics = read_json(trial_dir / "metrics.json")
        assert metrics["status"] == "completed" and metrics["step"] == 8, metrics
        assert f"{PRECOMPUTED} from {folder}" in train_log(trial_dir) and ADAPTERS_OFF not in train_log(trial_dir)
        accuracies[trial["num"]] = metrics["val_reward_accuracy"]
    assert max(accuracies.values()) > 0.5, accuracies

    # A second sweep, same folder, pairs and cache, a new sweep dir: its submit says it reuses the tokens and the
    # reference, so it queues no preparation job (its one job is the trial's), and its trial reads the same file.
    before = all_job_ids(slurm_env)
    result = run_hpcsweep(["-m", *lora, "objective.beta=0.3", "trainer.max_steps=4", "trainer.eval_every=4"], second,
                          slurm_env, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"model.path={folder}: reusing its reference log-probabilities of data.files in {entry}" in output, output
    assert "reusing its tokens, cache entry" in output, output
    again = read_json(only_sweep_dir(second) / "sweep.json")
    (trial,) = again["trials"]
    assert again.get("token_preparation") is None, again["token_preparation"]
    assert wait_until_ended(slurm_env, trial["job_id"], timeout=400) == "COMPLETED"
    assert {job.split("_")[0] for job in submitted_from(slurm_env, second, before)} == {
        again["arrays"][0]["array_job_id"]}
    trial_dir = second / trial["trial_dir"]
    assert read_json(trial_dir / "metrics.json")["status"] == "completed"
    assert f"{PRECOMPUTED} from {folder}" in train_log(trial_dir) and ADAPTERS_OFF not in train_log(trial_dir)
    assert (reference.stat().st_mtime_ns, reference.stat().st_ino) == (written.st_mtime_ns, written.st_ino)
    assert list(entry.glob("reference-*.bin")) == [reference]


def straight_run(run_dir: Path, env: dict[str, str], overrides: list[str]) -> subprocess.Popen:
    """The same trial uninterrupted, one process here with no Slurm job around it, started in the background."""
    args = [f"hydra.run.dir={run_dir}", *[o for o in overrides if not o.startswith("hydra.")]]
    return subprocess.Popen([sys.executable, "-m", "hpcsweep", *args], cwd=run_dir.parent, env=outside_any_job(env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_full_fine_tuning_dpo_trial_stopped_by_usr2_resumes_bit_exact(tmp_path, slurm_env, user_files):
    folder, pairs = user_files
    # One intra-op thread in the trial and the straight run alike: a task's threads follow the CPUs it is given,
    # which on this one-machine cluster vary by node, and 1 and 2 threads sum a matmul in a different order.
    env = {**slurm_env, "OMP_NUM_THREADS": "1"}
    stoppable = [o for o in STOPPABLE_TRIAL if not o.startswith("data.seq_len")]
    full = [*stoppable, *dpo_settings(folder, pairs, tmp_path / "cache"), "model.peft=none", "model.lr=1e-3",
            "objective.beta=0.3"]
    result = run_hpcsweep(["-m", *full], tmp_path, env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    record = read_json(only_sweep_dir(tmp_path) / "sweep.json")
    (trial,) = record["trials"]
    trial_dir = tmp_path / trial["trial_dir"]
    assert wait_until_ended(env, record["token_preparation"]["job_id"], timeout=400) == "COMPLETED"
    # After the job, on its cache entry: the straight run reads the very reference numbers the trial reads.
    straight = straight_run(tmp_path / "straight", env, full)
    try:
        usr2_at_step(env, trial["job_id"], trial_dir, 3, timeout=400)
        metrics = wait_until_final(env, trial["job_id"], trial_dir, timeout=400)
        out, _ = straight.communicate(timeout=400)
    finally:
        if straight.poll() is None:
            straight.kill()
            straight.wait(30)
    assert straight.returncode == 0, out[-3000:]
    assert "reusing its reference log-probabilities" in out, out[-3000:]
    assert metrics["status"] == "completed", metrics.get("error")
    assert metrics["restarts"] >= 1 and metrics["last_stop_reason"] == "time_limit"
    expected = read_json(tmp_path / "straight" / "metrics.json")
    assert metrics["weights_sha256"] == expected["weights_sha256"]
    assert metrics["val_reward_accuracy"] == expected["val_reward_accuracy"]
    # The trial ran the policy's forward alone: its reference is the preparation job's numbers.
    assert f"{PRECOMPUTED} from {folder}" in train_log(trial_dir) and ADAPTERS_OFF not in train_log(trial_dir)
    assert wait_until_ended(env, trial["job_id"], timeout=120) == "COMPLETED"


def test_a_search_maximising_reward_accuracy_prunes_on_it_in_one_array(tmp_path, slurm_env, user_files):
    folder, pairs = user_files
    # Seed 0 draws lr 1e-2 for trial 0 and 1e-9 for trial 1 (asserted below): trial 0 learns the rule by its first
    # evaluation, trial 1 barely moves from the reference, and the median pruner stops it there.
    settings = ["hydra.sweeper.objective=val_reward_accuracy", "hydra.sweeper.direction=maximize",
                "hydra.sweeper.sampler=random", "hydra.sweeper.pruner=median", "hydra.sweeper.n_startup_trials=1",
                "hydra.sweeper.n_trials=2", "hydra.launcher.array_parallelism=1"]
    dpo = [*SMALL_DPO_TRIAL, *dpo_settings(folder, pairs, tmp_path / "cache"), "model.peft=lora", "objective.beta=0.1"]
    result = run_hpcsweep([*SEARCH, "model.lr=choice(1e-2, 1e-9)", *settings, *dpo], tmp_path, slurm_env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = only_sweep_dir(tmp_path)
    record = read_json(sweep_dir / "sweep.json")
    (array,) = record["arrays"]  # one array, whose tasks share the study
    assert array["trials"] == [0, 1]
    states = wait_for(lambda: array_ended(slurm_env, array["array_job_id"], 2), timeout=600, what="the 2 search trials")
    assert set(states.values()) == {"COMPLETED"}, states

    search = read_json(sweep_dir / "search" / "search.json")["settings"]
    assert (search["objective"], search["direction"]) == ("val_reward_accuracy", "maximize")
    study = load_study(sweep_dir)
    assert [d.name for d in study.directions] == ["MAXIMIZE"]
    by_num = {t.user_attrs["hpcsweep_num"]: t for t in study.trials}
    assert [by_num[n].params["model.lr"] for n in (0, 1)] == [1e-2, 1e-9]
    done, pruned = read_json(sweep_dir / "0" / "metrics.json"), read_json(sweep_dir / "1" / "metrics.json")
    journal = sweep_dir / "search" / "study.journal"
    assert by_num[0].state.name == "COMPLETE" and by_num[0].value == done["val_reward_accuracy"] > 0.5
    assert intermediate_steps(journal, by_num[0]._trial_id) == [4, 8]
    # Pruned at its first evaluation on the reward accuracy it reported there, below the completed trial's.
    assert by_num[1].state.name == "PRUNED" and intermediate_steps(journal, by_num[1]._trial_id) == [4]
    assert (pruned["status"], pruned["step"]) == ("pruned", 4)
    assert by_num[1].intermediate_values == {4: pruned["val_reward_accuracy"]}
    assert pruned["val_reward_accuracy"] < by_num[0].intermediate_values[4]
    status = subprocess.run([sys.executable, "-m", "hpcsweep.status", str(sweep_dir)], env=slurm_env,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "1 pruned" in status.stdout.splitlines()[0]
