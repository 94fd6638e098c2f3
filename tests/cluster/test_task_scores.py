"""Task scores drive a search (issue 32), on the real local cluster: a chat corpus of facts
(``data=chat``, rendered by the model's own chat template, Llama 3's) and a local lm-eval
multiple-choice task over the same facts, asked as that template renders a user turn; a search of 4
LoRA trials optimises the task's accuracy as one array, its pruner sees the scores taken every
``tasks.every`` steps, the best trial beats chance where the untrained base does not, and ``report``
and ``export --best --by`` follow it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpcsweep.prepare.chat_render import sample_messages
from tests.task_fixtures import (TASK, fact_chat_samples, make_fact_chat_model, write_fact_chat_corpus,
                                 write_fact_chat_task)

from .conftest import read_json, run_hpcsweep, wait_for
from .test_search import array_ended, load_study, only_sweep_dir

OBJECTIVE = f"tasks.{TASK}.acc"
CHANCE = 0.25
"""One of four colours."""


@pytest.fixture(scope="module")
def fact_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("facts")
    # Larger initial weights than Hugging Face's 0.02: adapters over a random base can move its outputs.
    model = make_fact_chat_model(root / "model", initializer_range=0.2)
    return model, write_fact_chat_corpus(root / "chat"), write_fact_chat_task(root / "tasks", model)


def test_the_task_asks_each_fact_as_the_chat_template_renders_its_training_samples(fact_files):
    """What transfers: each question of the task with its right choice is, token for token, the
    start of every training sample of that fact up to the answer's end."""
    from transformers import AutoTokenizer

    model, _, tasks = fact_files
    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    asked = {}
    for line in (tasks / f"{TASK}.jsonl").read_text().splitlines():
        row = json.loads(line)
        asked[row["question"]] = row["question"] + row["choices"][row["label"]]
    assert len(asked) == 16
    for sample in fact_chat_samples():
        rendered = tokenizer.apply_chat_template(sample_messages(sample, "a fact"), tokenize=False)
        (question,) = [q for q in asked if rendered.startswith(q)]
        answered = tokenizer(asked[question], add_special_tokens=False)["input_ids"]
        assert tokenizer(rendered, add_special_tokens=False)["input_ids"][: len(answered)] == answered


def base_score(model, tasks) -> float:
    """The untrained base's accuracy, through the trials' own scorer."""
    from transformers import AutoModelForCausalLM

    from hpcsweep.config import TasksConfig
    from hpcsweep.train.scores.task_scorer import TaskScorer

    base = AutoModelForCausalLM.from_pretrained(model, local_files_only=True)
    scorer = TaskScorer(TasksConfig(names=[TASK], include_path=str(tasks)), str(model))
    return scorer.score(base)[TASK]["acc"]


def test_a_lora_search_on_a_local_task_score_optimises_it_and_exports_its_best(tmp_path, slurm_env, fact_files):
    model, corpus, tasks = fact_files
    slurm_env = {**slurm_env, "OMP_NUM_THREADS": "1"}
    result = run_hpcsweep([
        "-m", "hydra/sweeper=search", "hydra.sweeper.seed=0", "hydra.sweeper.n_trials=4",
        f"hydra.sweeper.objective={OBJECTIVE}", "hydra.sweeper.direction=maximize",
        "hydra.sweeper.pruner=median", "hydra.sweeper.n_startup_trials=2",
        # From too low to learn the facts in 100 steps (1e-4) to learning them all by step 50.
        "model.lr=tag(log, interval(1e-4, 1.5e-2))",
        "model=pretrained", f"model.path={model}", "model.peft=lora",
        "data=chat", f"data.files={corpus}/*.jsonl", "data.seq_len=100", "data.packing=true", "data.batch_size=8",
        "trainer.max_steps=100", "trainer.warmup_steps=2", "trainer.eval_every=25", "trainer.eval_batches=1",
        "trainer.log_every=25", "trainer.ckpt_every=0", "topology.mode=off",
        f"tasks.names=[{TASK}]", f"tasks.include_path={tasks}", "tasks.every=25",
    ], tmp_path, slurm_env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = only_sweep_dir(tmp_path)
    (array,) = read_json(sweep_dir / "sweep.json")["arrays"]
    assert array["trials"] == [0, 1, 2, 3]
    wait_for(lambda: array_ended(slurm_env, array["array_job_id"], 4), timeout=900, what="the 4 search trials")

    # The trials trained on the samples as the template rendered them, the loss on the answers.
    (entry,) = (tmp_path / "multirun" / "token-cache").iterdir()
    header = read_json(entry / "tokens.json")
    assert (header["kind"], header["samples"], header["train_on"]) == ("chat", 384, "assistant"), header

    study = load_study(sweep_dir)
    assert study.direction.name == "MAXIMIZE" and len(study.trials) == 4
    scores = {}
    for trial in study.trials:
        num = trial.user_attrs["hpcsweep_num"]
        metrics = read_json(sweep_dir / str(num) / "metrics.json")
        assert metrics["status"] == {"COMPLETE": "completed", "PRUNED": "pruned"}[trial.state.name], metrics
        assert metrics["fill_rate"] > 0.5, metrics  # packed chat rows (a padded one is a quarter full)
        scores[num] = metrics["tasks"][TASK]["acc"]
        # The pruner saw every score taken, at its step; the last is the one metrics.json holds.
        assert sorted(trial.intermediate_values) == list(range(25, metrics["step"] + 1, 25))
        assert trial.intermediate_values[max(trial.intermediate_values)] == scores[num]
        if trial.state.name == "COMPLETE":
            assert trial.value == scores[num]
    best_num = study.best_trial.user_attrs["hpcsweep_num"]
    assert study.best_value == scores[best_num] == max(scores.values())
    assert min(scores.values()) < study.best_value, scores  # trials that differ: report and export pick one
    base = base_score(model, tasks)
    assert abs(base - CHANCE) <= 0.15, base  # the untrained base: near chance
    assert study.best_value >= 0.5 and study.best_value >= base + 0.25, (study.best_value, base)

    shown = subprocess.run([sys.executable, "-m", "hpcsweep.report", str(sweep_dir), "--sort", OBJECTIVE],
                           env=slurm_env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    header, first = shown.stdout.splitlines()[:2]
    assert OBJECTIVE in header.split()
    assert scores[int(first.split()[0])] == study.best_value

    done = subprocess.run([sys.executable, "-m", "hpcsweep.export", str(sweep_dir), "--best", "--by", OBJECTIVE,
                           "--out", str(tmp_path / "best")], cwd=tmp_path, env=slurm_env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    exported = int(done.stdout.split("exported trial #")[1].split()[0])
    assert scores[exported] == study.best_value
    assert (tmp_path / "best" / "adapter_config.json").exists()
