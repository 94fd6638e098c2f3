"""The study in its journal: distinct trials for slots asking at once, the heartbeat that fails a killed
trial, the resume of a slot on its own study trial, and the pruning reporter's one value per step."""

from __future__ import annotations

import json
import threading
import time

import optuna
import pytest
from optuna.trial import TrialState

from hpcsweep.search import trial_slot
from hpcsweep.search.pruning import PruningReporter
from hpcsweep.search.settings import SearchFiles, SearchPlan, SearchSettings, read_choice, write_plan
from hpcsweep.search.space import parse_space
from hpcsweep.search.study import HEARTBEAT_ATTR, NUM_ATTR, create_study, load_study


@pytest.fixture
def search(tmp_path):
    settings = SearchSettings(n_trials=8, seed=0, pruner="median", n_startup_trials=1, heartbeat_interval_s=1,
                              grace_period_s=2)
    plan = SearchPlan(settings, parse_space(["model.lr=tag(log, interval(1e-4, 1e-1))", "trainer.max_steps=8"]))
    files = SearchFiles(tmp_path)
    write_plan(files, plan)
    create_study(files, settings)
    return files, plan


def test_slots_asking_at_once_get_distinct_trials_and_record_their_choice(search):
    files, plan = search
    choices = {}

    def ask(num):
        choices[num] = trial_slot.choose(files, plan, num)[1]

    threads = [threading.Thread(target=ask, args=(num,)) for num in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    study = load_study(files, plan.settings)
    assert sorted(c.study_trial for c in choices.values()) == list(range(8))
    assert len({c.params["model.lr"] for c in choices.values()}) == 8, "seeded per slot: no two draw alike"
    for num, choice in choices.items():
        assert study.trials[choice.study_trial].user_attrs[NUM_ATTR] == num
        assert read_choice(files, num) == choice
        assert choice.overrides == ["trainer.max_steps=8", f"model.lr={choice.params['model.lr']}"]


@pytest.mark.parametrize(("metrics", "state"), [
    ({"status": "completed", "best_val_loss": 0.5}, TrialState.COMPLETE),
    ({"status": "pruned"}, TrialState.PRUNED),
    ({"status": "failed"}, TrialState.FAIL),
    ({"status": "skipped_budget"}, TrialState.FAIL),
    ({"status": "stopped"}, TrialState.RUNNING),
])
def test_the_study_is_told_how_a_trial_ended(search, tmp_path, metrics, state):
    files, plan = search
    study, choice = trial_slot.choose(files, plan, 0)
    trial_dir = tmp_path / "0"
    trial_dir.mkdir()
    (trial_dir / "metrics.json").write_text(json.dumps(metrics))
    trial_slot.tell_from_results(study, plan, choice, trial_slot.SearchSlot([], str(trial_dir), None, True))
    assert load_study(files, plan.settings).trials[choice.study_trial].state == state


def test_a_slot_that_starts_again_resumes_its_study_trial(search):
    files, plan = search
    _, first = trial_slot.choose(files, plan, 3)
    _, again = trial_slot.choose(files, plan, 3)
    assert again == first
    assert len(load_study(files, plan.settings).trials) == 1


def test_a_trial_without_heartbeat_is_failed_and_its_slot_resumes_on_a_replacement(search):
    files, plan = search
    study, choice = trial_slot.choose(files, plan, 0)
    reporter = PruningReporter(files.trial(0))
    reporter.report(2, {"best_val_loss": 5.0})
    reporter.report(2, {"best_val_loss": 9.0})  # a resumed trial's step comes again: kept once
    trial_id = study.trials[0]._trial_id
    study._storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time() - 60)

    _, other = trial_slot.choose(files, plan, 1)  # the next slot to start fails the stale trial
    assert load_study(files, plan.settings).trials[0].state == TrialState.FAIL

    _, resumed = trial_slot.choose(files, plan, 0)
    trials = load_study(files, plan.settings).trials
    replacement = trials[resumed.study_trial]
    assert resumed.study_trial not in (choice.study_trial, other.study_trial)
    assert replacement.state == TrialState.RUNNING
    assert replacement.params == choice.params and replacement.user_attrs[NUM_ATTR] == 0
    assert replacement.intermediate_values == {2: 5.0}
    assert resumed.overrides == choice.overrides and read_choice(files, 0) == resumed
    running = [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs[NUM_ATTR] == 0]
    assert len(running) == 1, "one live study trial per slot"


def test_the_reporter_lets_the_pruner_stop_a_trial_worse_than_the_median(search):
    files, plan = search
    study, good = trial_slot.choose(files, plan, 0)
    good_reporter = PruningReporter(files.trial(0))
    for step, value in ((2, 5.0), (4, 4.0)):
        good_reporter.report(step, {"best_val_loss": value})
    trial_slot.tell_ended(study, good, "completed", 4.0)
    _, bad = trial_slot.choose(files, plan, 1)
    reporter = PruningReporter(files.trial(1))
    reporter.report(2, {"best_val_loss": 4.5})
    assert not reporter.should_prune()
    reporter.report(4, {"best_val_loss": 6.0})
    assert reporter.should_prune()
    reporter.report(6, {"val_loss": 1.0})  # no objective in these metrics: nothing reported
    assert load_study(files, plan.settings).trials[bad.study_trial].intermediate_values == {2: 4.5, 4: 6.0}


def test_the_journal_opens_with_plain_optuna(search):
    files, plan = search
    trial_slot.choose(files, plan, 0)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(files.journal)))
    (trial,) = optuna.load_study(study_name="search", storage=storage).trials
    assert trial.user_attrs == {NUM_ATTR: 0}
    assert json.loads(files.settings.read_text())["study_name"] == "search"


def test_every_rank_of_a_ddp_trial_stops_where_rank_0_is_told_to_prune(search, tmp_path):
    from hpcsweep.train.checkpoint.manager import trial_already_done

    from hpcsweep.files.attempt_file import WorkerAttempt, write_attempt

    from .test_trainer_ddp import make_trial, torchrun
    from .trial_dirs import read_metrics

    files, plan = search
    study, good = trial_slot.choose(files, plan, 0)
    good_reporter = PruningReporter(files.trial(0))
    for step in (5, 10):
        good_reporter.report(step, {"best_val_loss": 0.01})
    trial_slot.tell_ended(study, good, "completed", 0.01)
    trial_slot.choose(files, plan, 1)
    trial = make_trial(tmp_path / "trial")

    attempt_file = trial / "attempt" / "node0.json"  # as the runner writes it for a search trial
    write_attempt(attempt_file, WorkerAttempt(search_trial=files.trial(1)))
    assert torchrun(trial, attempt_file=attempt_file) == 0, (trial / "torchrun.err").read_text()[-3000:]
    metrics = read_metrics(trial)
    assert (metrics["status"], metrics["step"]) == ("pruned", 5)
    assert trial_already_done(trial, metrics)
    assert "step 5: pruned" in (trial / "logs" / "rank1.log").read_text()
    assert list(load_study(files, plan.settings).trials[1].intermediate_values) == [5]


def test_the_history_panel_marks_pruned_trials_and_draws_the_best_so_far(search):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpcsweep.results.search_report import best_trial_text, plot_history, summarize_study

    files, plan = search
    study, first = trial_slot.choose(files, plan, 0)
    trial_slot.tell_ended(study, first, "completed", 3.0)
    _, second = trial_slot.choose(files, plan, 1)
    PruningReporter(files.trial(1)).report(2, {"best_val_loss": 7.0})
    trial_slot.tell_ended(study, second, "pruned", None)
    _, third = trial_slot.choose(files, plan, 2)
    trial_slot.tell_ended(study, third, "completed", 2.0)
    summary = summarize_study(load_study(files, plan.settings).trials, "best_val_loss", "minimize",
                              {c.num: c for c in (first, second, third)})
    assert [(t.num, t.state, t.value, t.last_step) for t in summary.trials] == [
        (0, "COMPLETE", 3.0, None), (1, "PRUNED", 7.0, 2), (2, "COMPLETE", 2.0, None)]
    assert summary.best.num == 2
    text = best_trial_text(summary)
    assert "search: 3 study trials (2 complete, 1 pruned); minimize best_val_loss" in text
    assert f"best: #2 (study trial {third.study_trial}) best_val_loss=2" in text
    assert f"rerun it as one trial: python -m hpcsweep trainer.max_steps=8 model.lr={third.params['model.lr']}" in text

    fig, ax = plt.subplots()
    plot_history(ax, summary)
    completed, pruned = ax.collections
    assert completed.get_offsets().tolist() == [[0, 3.0], [2, 2.0]]
    assert pruned.get_offsets().tolist() == [[1, 7.0]]
    (best_line,) = ax.lines
    assert list(best_line.get_ydata()) == [3.0, 2.0]
    plt.close(fig)


def test_a_median_pruner_that_could_never_prune_within_n_trials_starts_lower_and_says_when():
    """Optuna's median pruner acts once n_startup_trials trials completed: 5 (the default) of a search
    of 4 trials never prunes. Its start-up is lowered (the pruner's only; TPE keeps its random start)."""
    from hpcsweep.search.settings import median_startup, with_pruner_startup
    from hpcsweep.search.study import build_pruner
    from hydra_plugins.hpcsweep_plugins.search_sweeper import pruner_summary

    lowered = with_pruner_startup(SearchSettings(n_trials=4, pruner="median"))
    assert (median_startup(lowered), lowered.n_startup_trials) == (1, 5)
    assert build_pruner(lowered)._n_startup_trials == 1
    assert pruner_summary(lowered) == ("median (prunes once 1 trial has completed: n_startup_trials=5 lowered to 1 "
                                       "for the pruner, as 4 trials would leave it none to prune)")
    assert median_startup(with_pruner_startup(SearchSettings(n_trials=16, pruner="median", n_startup_trials=20))) == 4
    kept = with_pruner_startup(SearchSettings(n_trials=16, pruner="median", n_warmup_steps=10))
    assert kept.pruner_startup_trials is None and build_pruner(kept)._n_startup_trials == 5
    assert pruner_summary(kept) == "median (prunes once 5 trials have completed (n_startup_trials=5), after step 10)"
    assert with_pruner_startup(SearchSettings(n_trials=4, pruner="hyperband")).pruner_startup_trials is None


@pytest.mark.parametrize("pruner", ["median", "sha", "hyperband"])
def test_a_pruner_with_one_trial_and_nothing_to_compare_is_refused_naming_the_keys(pruner):
    with pytest.raises(ValueError, match=f"hydra.sweeper.pruner={pruner} is not allowed with n_trials=1"):
        SearchSettings(n_trials=1, pruner=pruner)
    assert SearchSettings(n_trials=1, pruner=pruner, warm_start=("/earlier/sweep",)).n_trials == 1
