"""Warm start (``hydra.sweeper.warm_start``): which earlier trials seed a new search and why the others do
not, the refusals before submit, the seeding of a real journal, and a local search warm-started from a
finished 8-trial grid whose first TPE suggestion comes from the model, not from random start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from hpcsweep.files.sweep_record import SweepRecord, write_sweep_record
from hpcsweep.search.earlier_sweeps import read_earlier_sweep
from hpcsweep.search.settings import SearchFiles, SearchPlan, SearchSettings, settings_from_mapping, write_plan
from hpcsweep.search.space import parse_space
from hpcsweep.search.study import WARM_START_ATTR, build_sampler, create_study, distributions, load_study, seed_study
from hpcsweep.search.warm_start import EarlierSweep, EarlierTrial, SeedTrial, check_objective, select_trials

SPACE = parse_space([
    "model.lr=tag(log, interval(1e-4, 1e-1))", "trainer.warmup_steps=range(0, 10, 2)",
    "model.attention=choice(mla, mha)", "trainer.max_steps=20",
])
CONFIG = {
    "model": {"lr": 1e-3, "n_layers": 2, "attention": "mla"},
    "data": {"batch_size": 4, "kind": "synthetic"},
    "trainer": {"max_steps": 20, "warmup_steps": 0, "eval_every": 5, "weight_decay": 0.0},
}
FIXED_KEYS = ["trainer.max_steps"]
# The slots of a search record heartbeats themselves, which Optuna warns is meant for optimize().
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


def earlier(num, status="completed", value=0.5, pruned_values=None, overrides=None, **changes):
    """An earlier trial of CONFIG with ``changes`` (``model__lr=...``) applied to its config.yaml."""
    config = json.loads(json.dumps(CONFIG))
    for dotted, new in changes.items():
        group, key = dotted.split("__")
        config[group][key] = new
    metrics = {"status": status, **({} if value is None else {"best_val_loss": value})}
    return EarlierTrial("/sweeps/grid", num, status, metrics, config, overrides or {}, pruned_values or {})


def select(trials, pruner="none", fixed_keys=FIXED_KEYS):
    return select_trials([EarlierSweep("/sweeps/grid", None, None, tuple(trials))], SPACE, CONFIG, fixed_keys,
                         "best_val_loss", pruner)


def test_a_finished_trial_inside_the_space_with_the_same_fixed_settings_is_kept_with_its_value():
    result = select([earlier(0, value=0.25, model__lr=0.003, trainer__warmup_steps=4),
                     earlier(1, status="stopped_early", model__attention="mha")])
    assert result.dropped == ()
    assert result.kept[0] == SeedTrial("/sweeps/grid", 0, "COMPLETE", 0.25,
                                       {"model.lr": 0.003, "trainer.warmup_steps": 4, "model.attention": "mla"}, {})
    assert result.kept[1].params["model.attention"] == "mha"


@pytest.mark.parametrize(("trial", "kind", "reason"), [
    (earlier(0, model__lr=0.5), "outside the space", "model.lr=0.5 is outside tag(log, interval(0.0001, 0.1))"),
    (earlier(0, trainer__warmup_steps=3), "outside the space", "trainer.warmup_steps=3 is outside range(0, 9, 2)"),
    (earlier(0, trainer__warmup_steps=2.0), "outside the space", "trainer.warmup_steps=2.0 is outside"),
    (earlier(0, model__attention="gqa"), "outside the space", "model.attention='gqa' is not one of choice('mla', 'mha')"),
    (earlier(0, model__n_layers=4), "with other fixed settings", "model.n_layers=4, and this search has 2"),
    (earlier(0, data__batch_size=8), "with other fixed settings", "data.batch_size=8, and this search has 4"),
    (earlier(0, trainer__max_steps=40), "with other fixed settings", "trainer.max_steps=40, and this search has 20"),
    # A key the earlier trial's own overrides set counts, though the search does not name it.
    (earlier(0, overrides={"trainer.weight_decay": 0.1}, trainer__weight_decay=0.1), "with other fixed settings",
     "trainer.weight_decay=0.1, and this search has 0.0"),
    (earlier(0, value=None), "without the objective", "its metrics.json has no finite number best_val_loss"),
    (earlier(0, value=float("nan")), "without the objective", "its metrics.json has no finite number best_val_loss"),
    (earlier(0, status="failed", value=None), "not finished", "status failed, not completed"),
    (earlier(0, status=None, value=None), "not finished", "no metrics.json (it never started), not completed"),
    (earlier(0, status="pruned", value=None, pruned_values={2: 1.0}), "pruned",
     "pruned trials seed only a search with pruner sha or hyperband, not none"),
])
def test_a_trial_left_out_says_why(trial, kind, reason):
    result = select([trial])
    assert result.kept == ()
    (dropped,) = result.dropped
    assert (dropped.trial, dropped.kind) == ("/sweeps/grid#0", kind)
    assert reason in dropped.reason


def test_keys_that_only_one_side_sets_count_and_unset_keys_left_at_their_defaults_do_not():
    # eval_every differs but neither side overrides it: not a fixed setting.
    assert select([earlier(0, trainer__eval_every=10)]).kept
    dropped = select([earlier(0, trainer__eval_every=10)], fixed_keys=["trainer.eval_every"]).dropped
    assert dropped[0].reason == "trainer.eval_every=10, and this search has 5"
    # A searched key, and anything inside a searched config group, is never compared as fixed.
    assert select([earlier(0, model__lr=0.01)]).kept


def test_a_searched_config_group_takes_the_choice_its_overrides_name_and_leaves_its_keys_uncompared():
    space = parse_space(["model=choice(deepseek_tiny, llama_small)"])
    chose = earlier(0, overrides={"model": "llama_small"}, model__n_layers=8)
    result = select_trials([EarlierSweep("/sweeps/grid", None, None, (chose, earlier(1)))], space, CONFIG, [],
                           "best_val_loss", "none")
    assert [(t.num, t.params) for t in result.kept] == [(0, {"model": "llama_small"})]
    assert result.dropped[0].reason == "model is not in its config.yaml or its overrides"


def test_a_pruned_search_trial_seeds_a_hyperband_search_with_its_reported_values():
    result = select([earlier(0, status="pruned", value=None, pruned_values={2: 1.5, 4: 1.25}),
                     earlier(1, status="pruned", value=None)], pruner="hyperband")
    assert [(t.num, t.state, t.intermediate_values) for t in result.kept] == [(0, "PRUNED", {2: 1.5, 4: 1.25})]
    assert result.dropped[0].reason == "pruned, and its study holds none of the values it reported"


def test_the_command_prints_how_many_were_kept_and_each_reason_with_its_count():
    result = select([earlier(0), earlier(1, model__lr=0.5), earlier(2, model__lr=0.7),
                     earlier(3, status="failed", value=None)])
    assert result.lines(1) == [
        "warm start: 1 of 4 earlier trials of 1 sweep(s) seed the study",
        "  dropped 2 outside the space, e.g. /sweeps/grid#1: model.lr=0.5 is outside "
        "tag(log, interval(0.0001, 0.1)) (and 1 more)",
        "  dropped 1 not finished, e.g. /sweeps/grid#3: status failed, not completed",
    ]


@pytest.mark.parametrize(("objective", "direction", "refused"), [
    ("best_val_loss", "minimize", False),
    ("val_loss", "minimize", True),
    ("best_val_loss", "maximize", True),
])
def test_an_earlier_search_of_another_objective_or_direction_is_refused(objective, direction, refused):
    search = EarlierSweep("/sweeps/search", "best_val_loss", "minimize", ())
    if not refused:
        check_objective(search, objective, direction)
        return
    with pytest.raises(ValueError) as err:
        check_objective(search, objective, direction)
    assert str(err.value).startswith("hydra.sweeper.warm_start=/sweeps/search is not allowed: "
                                     "that search minimized best_val_loss")
    assert "needs the same objective and direction" in str(err.value)
    # A grid sweep optimised nothing: any key its trials hold is taken.
    check_objective(EarlierSweep("/sweeps/grid", None, None, ()), objective, direction)


def test_a_dir_that_is_no_readable_sweep_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=rf"warm_start={tmp_path} is not allowed: {tmp_path} holds no sweep.json"):
        read_earlier_sweep(tmp_path, tmp_path / "new")
    (tmp_path / "sweep.json").write_text("{not json")
    with pytest.raises(ValueError, match=rf"warm_start={tmp_path} is not allowed: {tmp_path}/sweep.json .*cannot be read"):
        read_earlier_sweep(tmp_path, tmp_path / "new")
    with pytest.raises(ValueError, match="it is this search's own sweep dir"):
        read_earlier_sweep(tmp_path, tmp_path)


def test_warm_start_settings_are_absolute_paths_and_a_bad_value_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert settings_from_mapping({"warm_start": ["a", "b"]}).warm_start == (str(tmp_path / "a"), str(tmp_path / "b"))
    assert settings_from_mapping({"warm_start": "a"}).warm_start == (str(tmp_path / "a"),)
    assert SearchSettings(warm_start=None).warm_start == ()
    with pytest.raises(ValueError, match=r"hydra.sweeper.warm_start=\[1\] is not allowed: a list of sweep dirs"):
        SearchSettings(warm_start=[1])


def seeds(n):
    """``n`` finished trials around model.lr=1e-2, warmup 4, mha: the best near there."""
    trials = []
    for i in range(n):
        lr = 10 ** (-3 + 2 * i / (n - 1))
        params = {"model.lr": lr, "trainer.warmup_steps": 2 * (i % 5), "model.attention": ("mla", "mha")[i % 2]}
        trials.append(SeedTrial("/sweeps/grid", i, "COMPLETE", abs(lr - 1e-2) * 100 + i % 2, params, {}))
    return trials


class RandomStartupSpy:
    """Counts the calls TPE's random start-up sampler gets, and passes them on."""

    def __init__(self, sampler):
        self.calls = 0
        self.sample = sampler._random_sampler.sample_independent
        sampler._random_sampler.sample_independent = self

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.sample(*args, **kwargs)


@pytest.mark.parametrize(("n_startup_trials", "random_startup"), [(5, False), (8, False), (9, True)])
def test_seeded_trials_are_complete_in_the_journal_and_tpe_starts_from_them(tmp_path, n_startup_trials, random_startup):
    settings = SearchSettings(seed=0, n_startup_trials=n_startup_trials)
    files = SearchFiles(tmp_path)
    write_plan(files, SearchPlan(settings, SPACE))
    seed_study(create_study(files, settings), seeds(8), SPACE, settings)

    study = load_study(files, settings, num=0)
    assert [(t.number, t.state) for t in study.trials] == [(i, TrialState.COMPLETE) for i in range(8)]
    assert [t.user_attrs[WARM_START_ATTR] for t in study.trials] == [{"sweep_dir": "/sweeps/grid", "num": i}
                                                                     for i in range(8)]
    assert study.trials[3].params == seeds(8)[3].params
    assert study.trials[3].distributions == distributions(SPACE)
    spy = RandomStartupSpy(study.sampler)
    trial = study.ask(distributions(SPACE))
    assert trial.number == 8
    # TPE samples at random while fewer than n_startup_trials trials have finished: 8 seeded ones are enough.
    assert (spy.calls > 0) is random_startup
    assert (spy.calls == len(SPACE.dimensions)) is random_startup


TINY = [
    "trainer.max_steps=4", "trainer.eval_every=2", "trainer.ckpt_every=4", "trainer.log_every=2",
    "trainer.eval_batches=1", "data.batch_size=4", "data.seq_len=32",
]


def run(args, cwd):
    return subprocess.run([sys.executable, "-m", "hpcsweep", "-m", "hydra/launcher=local", *args, *TINY], cwd=cwd,
                          env=dict(os.environ), capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("earlier", "message"), [
    ("nowhere", "hydra.sweeper.warm_start={dir} is not allowed: {dir} holds no sweep.json"),
    ("search", "hydra.sweeper.warm_start={dir} is not allowed: that search minimized val_loss and this one "
               "would minimize best_val_loss; warm start needs the same objective and direction"),
])
def test_a_warm_start_that_cannot_be_taken_stops_the_command_before_anything_is_written(tmp_path, earlier, message):
    earlier_dir = tmp_path / earlier
    if earlier == "search":
        write_sweep_record(SweepRecord(str(earlier_dir), "local", "2026-12-01T00:00:00+00:00", []))
        write_plan(SearchFiles(earlier_dir), SearchPlan(SearchSettings(objective="val_loss"), SPACE))
    result = run(["hydra/sweeper=search", "model.lr=interval(1e-3, 1e-2)", f"hydra.sweeper.warm_start=[{earlier_dir}]",
                  f"hydra.sweep.dir={tmp_path / 'new'}"], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert len([line for line in output.splitlines() if message.format(dir=earlier_dir) in line]) == 1, output
    assert "Traceback" not in output and not (tmp_path / "new").exists()


def test_a_search_warm_started_from_an_8_trial_grid_holds_its_trials_then_asks_tpe(tmp_path):
    grid_dir, search_dir = tmp_path / "grid", tmp_path / "search"
    grid = run(["model.lr=1e-3,3e-3,1e-2,3e-2", "trainer.warmup_steps=1,2", "hydra.launcher.local_parallelism=2",
                f"hydra.sweep.dir={grid_dir}"], tmp_path)
    assert grid.returncode == 0, grid.stdout + grid.stderr
    search_args = [
        "hydra/sweeper=search", "hydra.sweeper.seed=0", "model.lr=tag(log, interval(1e-3, 3e-2))",
        "trainer.warmup_steps=choice(1, 2)", "hydra.sweeper.n_trials=1", "hydra.sweeper.n_startup_trials=8",
        f"hydra.sweeper.warm_start=[{grid_dir}]", f"hydra.sweep.dir={search_dir}",
    ]
    search = run(search_args, tmp_path)
    output = search.stdout + search.stderr
    assert search.returncode == 0, output
    assert "warm start: 8 of 8 earlier trials of 1 sweep(s) seed the study" in output

    study = load_study(SearchFiles(search_dir), SearchSettings())
    seeded, new = study.trials[:8], study.trials[8:]
    assert [(t.number, t.state) for t in seeded] == [(i, TrialState.COMPLETE) for i in range(8)]
    grid_trials = json.loads((grid_dir / "sweep.json").read_text())["trials"]
    for trial, record in zip(seeded, grid_trials):
        assert trial.user_attrs[WARM_START_ATTR] == {"sweep_dir": str(grid_dir), "num": record["num"]}
        metrics = json.loads((grid_dir / str(record["num"]) / "metrics.json").read_text())
        assert trial.value == metrics["best_val_loss"]
        config = yaml.safe_load((grid_dir / str(record["num"]) / "config.yaml").read_text())
        assert trial.params == {"model.lr": config["model"]["lr"], "trainer.warmup_steps": config["trainer"]["warmup_steps"]}
    (first,) = new
    assert first.number == 8 and first.user_attrs["hpcsweep_num"] == 0 and first.state == TrialState.COMPLETE

    # Running the sweep dir again resumes the study: nothing is seeded twice.
    again = run(search_args, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "warm start" not in again.stdout + again.stderr
    assert len(load_study(SearchFiles(search_dir), SearchSettings()).trials) == 9

    # The first new trial is TPE's choice from the 8, not a random start-up draw: its sampler, given
    # the seeded trials alone, takes the model's path and picks the same parameters.
    plan = SearchPlan(SearchSettings(seed=0, n_startup_trials=8), parse_space(search_args[2:4]))
    replay = optuna.create_study(sampler=build_sampler(plan.settings, 0))
    replay.add_trials(seeded)
    spy = RandomStartupSpy(replay.sampler)
    assert replay.ask(distributions(plan.space)).params == first.params
    assert spy.calls == 0


def test_seeded_reported_values_are_rungs_that_successive_halving_prunes_a_new_trial_against(tmp_path):
    settings = SearchSettings(seed=0, pruner="sha", min_resource=2, reduction_factor=2)
    files = SearchFiles(tmp_path)
    earlier_trials = [SeedTrial("/sweeps/search", i, "COMPLETE", 0.8, seeds(4)[i].params, {2: 1.0, 4: 0.8})
                      for i in range(3)]
    seed_study(create_study(files, settings), [*earlier_trials, SeedTrial(
        "/sweeps/search", 3, "PRUNED", None, seeds(4)[3].params, {2: 1.5})], SPACE, settings)
    study = load_study(files, settings)
    assert [t.system_attrs for t in study.trials] == [{"completed_rung_0": 1.0, "completed_rung_1": 0.8}] * 3 + [
        {"completed_rung_0": 1.5}]
    assert study.trials[3].state == TrialState.PRUNED and study.trials[3].intermediate_values == {2: 1.5}
    worse, better = study.ask(distributions(SPACE)), study.ask(distributions(SPACE))
    worse.report(5.0, 2)
    better.report(0.5, 2)
    # Alone at its rung, a trial is never pruned; against the seeded values, the worse one is.
    assert worse.should_prune() and not better.should_prune()


def test_seeded_trials_of_a_hyperband_search_hold_the_rungs_of_their_bracket(tmp_path):
    settings = SearchSettings(seed=0, pruner="hyperband", min_resource=1, max_resource=8, reduction_factor=2)
    files = SearchFiles(tmp_path)
    values = {1: 3.0, 2: 2.0, 4: 1.5, 8: 1.0}
    seed_study(create_study(files, settings), [SeedTrial("/g", i, "COMPLETE", 1.0, p, values)
                                               for i, p in enumerate(t.params for t in seeds(8))], SPACE, settings)
    pruner = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=8, reduction_factor=2)
    study = load_study(files, settings)
    pruner._try_initialization(study)
    brackets = set()
    for trial in study.trials:
        bracket = pruner._get_bracket_id(study, trial)
        brackets.add(bracket)
        # Bracket b's first rung is at step 2**b; each later rung doubles it, up to step 8.
        rung_steps = [2 ** (bracket + r) for r in range(4 - bracket)]
        assert trial.system_attrs == {f"completed_rung_{r}": values[step] for r, step in enumerate(rung_steps)}
    assert len(brackets) > 1


def test_the_report_names_a_seeded_best_trial_by_the_earlier_trial_it_copies(tmp_path):
    from hpcsweep.results.search_report import best_trial_text, summarize_study

    settings = SearchSettings(seed=0)
    files = SearchFiles(tmp_path)
    seeded = seeds(8)
    seed_study(create_study(files, settings), seeded, SPACE, settings)
    summary = summarize_study(load_study(files, settings).trials, "best_val_loss", "minimize", {})
    best = min(seeded, key=lambda t: t.value)
    assert summary.best.warm_start == f"/sweeps/grid#{best.num}"
    assert f"best: warm start /sweeps/grid#{best.num} (study trial {best.num}) best_val_loss={best.value:.6g}" \
        in best_trial_text(summary)
