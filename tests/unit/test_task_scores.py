"""Task scores: lm-eval on the trial's model in memory, offline; early stopping on any metric;
dotted objectives; the report's columns and sort; export --best --by."""

from __future__ import annotations

import csv
import io
import json
import socket
from pathlib import Path

import pytest
import torch
import yaml

from hpcsweep import report
from hpcsweep.config import trial_config_from_dict, trial_config_to_dict
from hpcsweep.export.source import TrialChoice, best_trial
from hpcsweep.files.metric_keys import metric_value, task_score_keys
from hpcsweep.results.table import load_sweep, sort_rows
from hpcsweep.search.study import objective_value
from hpcsweep.files import task_files
from hpcsweep.train.optim import EarlyStopping
from hpcsweep.train.scores.task_scorer import is_due, scores_from_results, tensorboard_scalars
from tests.task_fixtures import TASK, make_fact_model, write_fact_corpus, write_fact_task

from .sweep_fixtures import make_sweep, metrics

torch.set_num_threads(1)

LM_EVAL_RESULTS = {
    "facts": {"alias": "facts", "name": "facts", "sample_len": 16, "acc,none": 0.5, "acc_stderr,none": 0.12,
              "acc_norm,none": 0.25, "acc_norm_stderr,none": "N/A"},
    "gsm": {"alias": "gsm", "exact_match,strict-match": 0.125, "exact_match_stderr,strict-match": 0.01},
}


def test_lm_eval_results_become_scores_without_stderr_or_filter_none():
    scores = scores_from_results(LM_EVAL_RESULTS)
    assert scores == {"facts": {"acc": 0.5, "acc_norm": 0.25}, "gsm": {"exact_match_strict-match": 0.125}}
    assert tensorboard_scalars(scores) == {"tasks/facts/acc": 0.5, "tasks/facts/acc_norm": 0.25,
                                           "tasks/gsm/exact_match_strict-match": 0.125}


def test_dotted_keys_read_task_scores_and_plain_keys():
    report_ = {"best_val_loss": 2.0, "val_accuracy": 0.5, "tasks": {"facts": {"acc": 0.75}}, "status": "completed"}
    assert objective_value(report_, "tasks.facts.acc") == 0.75
    assert metric_value(report_, "best_val_loss") == 2.0
    assert metric_value(report_, "tasks.facts.acc_norm") is None
    assert metric_value(report_, "status") is None
    assert task_score_keys(report_) == ["tasks.facts.acc"]


def test_tasks_run_every_n_steps_and_at_the_end():
    assert [s for s in range(1, 11) if is_due(s, 4, 10)] == [4, 8, 10]
    assert [s for s in range(1, 11) if is_due(s, 0, 10)] == [10]


@pytest.mark.parametrize("mode,values,stops_at", [
    ("max", [0.5, 0.5, 0.5], 3),            # a score that stalls stops after patience=2 evaluations
    ("max", [0.5, 0.6, 0.7, 0.8], None),     # one that rises never does
    ("min", [2.0, 1.9, 1.95, 1.97], 4),      # a loss that stops falling does
])
def test_early_stopping_in_either_direction(mode, values, stops_at):
    early = EarlyStopping(patience=2, min_delta=0.0, mode=mode)
    stopped = [i + 1 for i, value in enumerate(values) if early.update(value)]
    assert (stopped[0] if stopped else None) == stops_at
    assert early.best == (max(values) if mode == "max" else min(values))


@pytest.mark.parametrize("values,message", [
    ({"trainer": {"early_stop_metric": "val_los"}},
     "trainer.early_stop_metric='val_los' is not allowed: one of val_loss, val_accuracy, val_reward_accuracy, "
     "val_reward_margin, or a task score tasks.NAME.METRIC"),
    ({"trainer": {"early_stop_metric": "tasks.other.acc"}, "tasks": {"names": ["facts"], "include_path": "t"}},
     "trainer.early_stop_metric='tasks.other.acc' is not allowed: a score of a task in tasks.names=['facts']"),
    ({"trainer": {"early_stop_metric": "tasks.facts.acc", "early_stop_patience": 2},
      "tasks": {"names": ["facts"], "include_path": "t"}},
     "tasks.every=0 is not allowed: a number of steps > 0 when early stopping watches tasks.facts.acc"),
    ({"trainer": {"early_stop_mode": "up"}}, "trainer.early_stop_mode='up' is not allowed: one of 'min', 'max'"),
    ({"tasks": {"names": ["facts"]}}, "tasks.include_path=None is not allowed: a folder of lm-eval task YAML files"),
    ({"tasks": {"names": ["a", "a"], "include_path": "t"}}, "tasks.names=['a', 'a'] is not allowed: a list of distinct"),
    ({"tasks": {"every": -1}}, "tasks.every=-1 is not allowed: an integer >= 0"),
])
def test_bad_task_and_early_stop_keys_are_refused(values, message):
    with pytest.raises(ValueError) as err:
        trial_config_from_dict(values)
    assert message in str(err.value)


def test_the_login_node_refuses_unknown_task_names_with_the_list_and_a_missing_lm_eval_with_the_pip_line(tmp_path):
    tasks = write_fact_task(tmp_path / "tasks")
    (tasks / "group.yaml").write_text("group: mine\ntask: [facts]\nprocess: !function utils.process\n")
    trial = trial_config_from_dict({"model": {"path": str(tmp_path / "m")},
                                    "tasks": {"names": ["facts", "fact", "mine"], "include_path": str(tasks)}})
    with pytest.raises(ValueError) as err:
        task_files.check_tasks(trial, lm_eval_installed=True)
    assert str(err.value) == (f"tasks.names=['facts', 'fact', 'mine'] is not allowed: fact not defined in {tasks} "
                              "(its tasks: facts, mine)")
    with pytest.raises(ValueError) as err:
        task_files.check_tasks(trial, lm_eval_installed=False)
    assert "lm-evaluation-harness is not installed: pip install 'hpcsweep[tasks]'" in str(err.value)
    missing = trial_config_from_dict({"model": {"path": "m"}, "tasks": {"names": ["facts"], "include_path": "nowhere"}})
    with pytest.raises(ValueError, match="tasks.include_path='nowhere' is not allowed: no such folder"):
        task_files.check_tasks(missing, lm_eval_installed=True)
    no_tokenizer = trial_config_from_dict({"tasks": {"names": ["facts"], "include_path": str(tasks)}})
    with pytest.raises(ValueError, match="task scores need a tokenizer"):
        task_files.check_tasks(no_tokenizer, lm_eval_installed=True)
    task_files.check_tasks(trial_config_from_dict({"model": {"path": "m"}, "tasks": {
        "names": ["facts", "mine"], "include_path": str(tasks)}}), lm_eval_installed=True)


@pytest.fixture(scope="module")
def fact_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("facts")
    return make_fact_model(root / "model"), write_fact_corpus(root / "corpus"), write_fact_task(root / "tasks"), root


def write_fact_trial(trial_dir: Path, fact_files, *, tasks: dict | None, lr: float = 3e-3, **trainer) -> Path:
    """A trial dir of the fact model, its corpus tokenized first (as a sweep does)."""
    from hpcsweep.sweep.text_preparation import prepare_here

    model, corpus, task_dir, root = fact_files
    cfg = {
        "model": {"path": str(model), "lr": lr},
        "data": {"kind": "text", "files": str(corpus / "*.txt"), "cache_dir": str(root / "cache"),
                 "seq_len": 32, "batch_size": 4},
        "trainer": {"device": "cpu", "warmup_steps": 0, "eval_batches": 1, "log_every": 2, "ckpt_every": 0,
                    "telemetry_every_s": 0, **trainer},
        "tasks": {"include_path": str(task_dir), "limit": 8, **tasks} if tasks else {},
    }
    trial = trial_config_from_dict(cfg)
    prepare_here([trial])
    trial_dir.mkdir()
    (trial_dir / "config.yaml").write_text(yaml.safe_dump(trial_config_to_dict(trial)))
    return trial_dir


def run_fact_trial(trial_dir: Path, fact_files, **settings) -> dict:
    """Train the fact model in this process; its metrics.json."""
    from hpcsweep.train import worker

    assert worker.run_trial(write_fact_trial(trial_dir, fact_files, **settings)) == 0
    return json.loads((trial_dir / "metrics.json").read_text())


@pytest.fixture
def no_network(monkeypatch):
    """Every socket connect fails, and is recorded: nothing may reach a hub."""
    tried = []

    def refuse(sock, address):
        tried.append(address)
        raise OSError(f"network unreachable in this test: {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    return tried


def test_a_stalling_task_score_stops_the_trial_offline_and_training_is_unchanged_by_the_tasks(
        tmp_path, fact_files, no_network):
    from hpcsweep.files.tb_runs import run_event_files
    from hpcsweep.results.event_reader import read_runs

    # SGD at a constant lr so small that the model, and so its score, stays where it is: a score that stalls.
    fixed = dict(optimizer="sgd", momentum=0.0, min_lr_ratio=1.0, eval_every=2, lr=1e-9)
    stalled = run_fact_trial(tmp_path / "stalled", fact_files, tasks={"names": [TASK], "every": 2}, max_steps=20,
                             early_stop_metric=f"tasks.{TASK}.acc", early_stop_mode="max", early_stop_patience=2,
                             **fixed)
    assert stalled["status"] == "stopped_early" and stalled["step"] == 6  # scored at 2, then 4 and 6 no better
    score = stalled["tasks"][TASK]["acc"]
    assert 0.0 <= score <= 1.0 and set(stalled["tasks"]) == {TASK}
    assert stalled["val_accuracy"] is not None and 0.0 <= stalled["val_accuracy"] <= 1.0
    assert no_network == []
    (scalars,) = read_runs([run_event_files(tmp_path / "stalled")])
    assert scalars[f"tasks/{TASK}/acc"].steps == [2, 4, 6]
    assert scalars[f"tasks/{TASK}/acc"].values[-1] == pytest.approx(score)

    # The same trial without tasks (and without early stopping) trains the same bits to step 6.
    plain = run_fact_trial(tmp_path / "plain", fact_files, tasks=None, max_steps=6, **fixed)
    assert "tasks" not in plain
    assert plain["weights_sha256"] == stalled["weights_sha256"]


def test_task_runs_log_no_lm_eval_warning_and_leave_its_logger_as_it_was(fact_files, caplog, monkeypatch):
    """lm-eval warns at each HFLM built around a model in memory ("`pretrained` model kwarg is not of
    type `str`", 14 times in a sweep's task runs): a trial that scores right logs none of it."""
    import logging

    from hpcsweep.config import TasksConfig
    from hpcsweep.train.scores.task_scorer import TaskScorer
    from transformers import AutoModelForCausalLM

    model_dir, _, task_dir, _ = fact_files
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    scorer = TaskScorer(TasksConfig(names=[TASK], include_path=str(task_dir)), str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    before = logging.getLogger("lm_eval").level
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            assert set(scorer.score(model)) == {TASK}
    assert [r.getMessage() for r in caplog.records if r.name.startswith("lm_eval")] == []
    assert logging.getLogger("lm_eval").level == before


def task_sweep(sweep_dir: Path) -> None:
    make_sweep(sweep_dir, [
        (["model.lr=1e-4"], metrics("completed", best=2.0, val_accuracy=0.30, tasks={TASK: {"acc": 0.25}})),
        (["model.lr=1e-3"], metrics("completed", best=2.5, val_accuracy=0.40, tasks={TASK: {"acc": 0.875}})),
        (["model.lr=1e-2"], metrics("pruned", best=3.0, val_accuracy=0.20, tasks={TASK: {"acc": 0.5}})),
    ])


def test_report_shows_val_accuracy_and_each_task_score_and_sorts_best_first_by_one(tmp_path, capsys):
    task_sweep(tmp_path / "sweep")
    out_csv = tmp_path / "r.csv"
    assert report.main([str(tmp_path / "sweep"), "--sort", f"tasks.{TASK}.acc", "--csv", str(out_csv)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[header.index("best_val_loss") + 1: header.index("best_val_loss") + 3] == ["val_acc", f"tasks.{TASK}.acc"]
    assert [line.split()[0] for line in lines[1:4]] == ["1", "2", "0"]
    assert lines[1].split()[header.index(f"tasks.{TASK}.acc")] == "0.8750"
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [(r["num"], r[f"tasks.{TASK}.acc"], r["val_accuracy"]) for r in rows] == [
        ("1", "0.875", "0.4"), ("2", "0.5", "0.2"), ("0", "0.25", "0.3")]
    assert report.main([str(tmp_path / "sweep"), "--sort", f"tasks.{TASK}.acc", "--ascending"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:4]] == ["0", "2", "1"]
    assert report.main([str(tmp_path / "sweep"), "--sort", "tasks.nope.acc"]) == 2
    assert capsys.readouterr().err.strip().endswith(f"val_accuracy, tasks.{TASK}.acc")
    rows = sort_rows(load_sweep(tmp_path / "sweep").rows, "val_accuracy", descending=True)
    assert [row.num for row in rows] == [1, 0, 2]


def test_export_best_by_a_task_score_takes_the_highest_and_by_a_loss_the_lowest(tmp_path):
    trials = [TrialChoice(n, [], tmp_path / str(n)) for n in range(3)]
    candidates = [
        (trials[0], metrics("completed", best=2.0, tasks={TASK: {"acc": 0.25}})),
        (trials[1], metrics("completed", best=2.5, tasks={TASK: {"acc": 0.875}})),
        (trials[2], metrics("completed", best=float("nan"), tasks={TASK: {"acc": 0.875}})),
    ]
    assert best_trial(candidates, f"tasks.{TASK}.acc").num == 1  # the lower number among equals
    assert best_trial(candidates, "best_val_loss").num == 0      # NaN ranks nowhere
    # A failed trial ranks after every other, as in report's table, whatever its number.
    failed = [(trials[0], metrics("failed", best=1.0)), (trials[1], metrics("completed", best=2.5))]
    assert best_trial(failed, "best_val_loss").num == 1
    make_sweep(tmp_path / "sweep", [(["model.lr=1e-4"], failed[0][1]), (["model.lr=3e-4"], failed[1][1])])
    assert sort_rows(load_sweep(tmp_path / "sweep").rows, "best_val_loss")[0].num == 1
    assert best_trial(failed[:1], "best_val_loss").num == 0  # the only one with a number
    from hpcsweep.export.source import ExportRefused

    with pytest.raises(ExportRefused, match="--by tasks.other.acc: no trial with a checkpoint has a number"):
        best_trial(candidates, "tasks.other.acc")


def test_a_trial_dir_trained_before_the_task_keys_existed_resumes_when_they_keep_their_defaults():
    from hpcsweep.trial.identity import config_differences

    now = trial_config_to_dict(trial_config_from_dict({}))
    before = {group: dict(values) for group, values in now.items() if group != "tasks"}
    for key in ("early_stop_metric", "early_stop_mode"):
        del before["trainer"][key]
    assert config_differences(before, now) == []
    changed = trial_config_to_dict(trial_config_from_dict({"trainer": {"early_stop_mode": "max"}}))
    assert [d.key for d in config_differences(before, changed)] == ["trainer.early_stop_mode"]


def test_a_task_objective_is_checked_against_tasks_names_and_reported_from_the_first_task_run():
    from hpcsweep.sweep.hooks import Allocation, CheckedTrial
    from hpcsweep.sweep.hpcsweep_hook import HpcsweepTrials

    def checked(every: int, names=(TASK,)):
        trial = trial_config_from_dict({"trainer": {"eval_every": 25, "max_steps": 100},
                                        "tasks": {"names": list(names), "include_path": "t", "every": every}})
        return CheckedTrial(Allocation(), (trial, None))

    hook = HpcsweepTrials()
    assert hook.objective_steps(checked(10)) == (10, 100)
    assert hook.objective_steps(checked(0)) == (25, 100)  # tasks at the end only: evaluations come first
    hook.check_objective(checked(10), f"tasks.{TASK}.acc")
    hook.check_objective(checked(10), "best_val_loss")
    for objective in ("tasks.other.acc", f"tasks.{TASK}"):
        with pytest.raises(ValueError) as err:
            hook.check_objective(checked(10), objective)
        assert str(err.value) == (f"hydra.sweeper.objective={objective} is not allowed: a task score is "
                                  f"tasks.NAME.METRIC with NAME one of tasks.names=['{TASK}']")


def test_two_ranks_wait_for_rank_0s_scores_and_stop_early_together(tmp_path, fact_files):
    from .test_trainer_ddp import torchrun

    trial = write_fact_trial(tmp_path / "ddp", fact_files, tasks={"names": [TASK], "every": 2}, max_steps=20,
                             early_stop_metric=f"tasks.{TASK}.acc", early_stop_mode="max", early_stop_patience=1,
                             optimizer="sgd", momentum=0.0, min_lr_ratio=1.0, eval_every=2, lr=1e-9)
    assert torchrun(trial) == 0, (trial / "torchrun.err").read_text()[-3000:]
    metrics_ = json.loads((trial / "metrics.json").read_text())
    # Scored at 2, no better at 4: both ranks stopped there, rank 1 on the scores rank 0 sent it.
    assert metrics_["status"] == "stopped_early" and metrics_["step"] == 4 and metrics_["world_size"] == 2
    assert set(metrics_["tasks"]) == {TASK}


def test_val_accuracy_counts_next_token_hits_and_leaves_out_targets_that_take_no_loss():
    from hpcsweep.train.trackers.metrics import accuracy_counts

    logits = torch.tensor([[[5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 5.0]]])
    targets = torch.tensor([[-100, 1, 2, 2]])  # the first is a prompt token (chat data): not counted
    assert accuracy_counts(logits, targets).tolist() == [2.0, 3.0]
    assert accuracy_counts(logits, torch.full((1, 4), -100)).tolist() == [0.0, 0.0]


def test_two_ranks_score_half_the_requests_each_heartbeat_and_give_rank_0_the_scores_of_one_rank(tmp_path, fact_files):
    import os
    import subprocess
    import sys

    from .test_trainer_ddp import free_port

    model, _, _, root = fact_files
    tasks = write_fact_task(tmp_path / "tasks")
    script = Path(__file__).resolve().parent.parent / "task_scoring_ranks.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", str(script), str(tmp_path), str(model), str(tasks)]
    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
                                    "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # 16 questions x 4 choices: each rank ran its 8 questions' requests and heartbeat meanwhile.
    assert rank0["requests"] == rank1["requests"] == 32 and rank0["beats"] >= 1 and rank1["beats"] >= 1
    assert rank1["scores"] is None and set(rank0["scores"]) == {TASK}
    assert rank0["scores"] == rank0["alone"]
    assert rank0["training"] and rank1["training"]  # the model goes back to train mode


def test_a_trial_with_tasks_that_auto_shards_with_fsdp_is_refused_before_submit():
    from hpcsweep.sweep.memory_check import check_memory_plans

    from .test_memory_plan import BIG, sweep_trial

    tasks = {"tasks": {"names": [TASK], "include_path": "t"}}
    # 8 GPUs on each of 2 nodes: BIG fits with FSDP only, so trainer.parallel=auto takes it.
    with pytest.raises(ValueError) as refused:
        check_memory_plans([sweep_trial(0, {}), sweep_trial(3, {**BIG, **tasks}, nodes=2)],
                           {"gpus_per_node": 8}, ["gpu:a100:8"])
    assert str(refused.value).startswith(f"trial #3: tasks.names=['{TASK}'] is not allowed here: trainer.parallel=auto "
                                         "chose FSDP (the trial does not fit a GPU with DDP)")
    check_memory_plans([sweep_trial(3, BIG, nodes=2), sweep_trial(4, tasks)], {"gpus_per_node": 8}, ["gpu:a100:8"])
