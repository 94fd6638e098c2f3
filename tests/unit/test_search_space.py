"""The search space, parsed from Hydra's sweep syntax; every refusal names its key."""

from __future__ import annotations

import pytest

from hpcsweep.search.settings import SearchSettings, parse_plan, SearchPlan, settings_from_mapping, with_trial_steps
from hpcsweep.search.space import Dimension, SearchSpace, check_trials, parse_space, space_from_dict


def test_each_sweep_form_becomes_a_dimension_and_plain_values_stay_fixed():
    space = parse_space([
        "model.lr=tag(log, interval(1e-4, 3e-2))",
        "trainer.warmup_steps=choice(10, 20, 50)",
        "trainer.weight_decay=interval(0.0, 0.2)",
        "data.batch_size=range(4, 17, 4)",
        "trainer.seed=tag(int, interval(1, 9))",
        "model.dropout=0.0,0.1",
        "+extra.name=choice(a, 'b c')",
        "trainer.max_steps=8",
    ])
    assert space.fixed == ("trainer.max_steps=8",)
    assert space.dimensions == (
        Dimension("model.lr", "float", 1e-4, 3e-2, None, True),
        Dimension("trainer.warmup_steps", "categorical", choices=(10, 20, 50)),
        Dimension("trainer.weight_decay", "float", 0.0, 0.2, None, False),
        Dimension("data.batch_size", "int", 4, 16, 4, False),
        Dimension("trainer.seed", "int", 1, 9, 1, False),
        Dimension("model.dropout", "categorical", choices=(0.0, 0.1)),
        Dimension("extra.name", "categorical", choices=("a", "b c"), prefix="+"),
    )


def test_a_plain_value_given_twice_passes_through_as_hydra_takes_it():
    space = parse_space(["trainer.max_steps=8", "trainer.max_steps=20", "model.lr=interval(1e-4, 1e-2)"])
    assert space.fixed == ("trainer.max_steps=8", "trainer.max_steps=20")


def test_a_float_range_is_the_list_of_its_values():
    (dim,) = parse_space(["model.dropout=range(0.0, 0.3, 0.1)"]).dimensions
    assert dim.kind == "categorical" and dim.choices == pytest.approx((0.0, 0.1, 0.2))


def test_chosen_values_become_overrides_hydra_parses_back():
    space = parse_space(["model.lr=tag(log, interval(1e-4, 3e-2))", "+extra.name=choice(a, 'b c')", "trainer.max_steps=8"])
    overrides = space.overrides({"model.lr": 0.00123, "extra.name": "b c"})
    assert overrides == ["trainer.max_steps=8", "model.lr=0.00123", "+extra.name=b\\ c"]
    reparsed = parse_space([*overrides, "model.dropout=0.0,0.1"])
    assert reparsed.fixed == tuple(overrides)


def test_validation_tries_both_ends_of_each_interval_and_every_choice():
    space = parse_space(["model.lr=interval(1e-4, 1e-2)", "trainer.warmup_steps=choice(1, 2, 3)", "trainer.max_steps=8"])
    assert [(t.key, t.value) for t in check_trials(space)] == [
        ("model.lr", 1e-4), ("model.lr", 1e-2),
        ("trainer.warmup_steps", 1), ("trainer.warmup_steps", 2), ("trainer.warmup_steps", 3),
    ]
    assert check_trials(space)[1].overrides == ["trainer.max_steps=8", "model.lr=0.01", "trainer.warmup_steps=1"]


def test_the_space_round_trips_through_json_and_knows_its_values():
    space = parse_space(["model.lr=tag(log, interval(1e-4, 3e-2))", "data.batch_size=range(4, 17, 4)", "x=choice(a,b)"])
    plan = SearchPlan(SearchSettings(pruner="hyperband", seed=3), space)
    import json

    assert parse_plan(json.dumps(plan.to_dict())) == plan
    assert space_from_dict(space.to_dict()) == space
    lr, batch, x = space.dimensions
    assert lr.contains(1e-3) and not lr.contains(1e-1)
    assert batch.contains(8) and not batch.contains(6) and not batch.contains(20)
    assert x.contains("a") and not x.contains("c")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.lr=interval(0.1, 0.01)"], "model.lr=interval(0.1, 0.01) is not allowed: low > high"),
        (["model.lr=tag(log, interval(0, 0.1))"], "model.lr=tag(log, interval(0, 0.1)) is not allowed: a log scale needs low > 0"),
        (["model.lr=tag(log, interval(-1, 0.1))"], "a log scale needs low > 0"),
        (["trainer.seed=tag(int, interval(0.5, 3))"], "trainer.seed=tag(int, interval(0.5, 3)) is not allowed: its ends must be whole numbers"),
        (["model.lr=tag(sqrt, interval(1, 2))"], "model.lr: tag 'sqrt' is not allowed: one of log, int"),
        (["model.lr=tag(log, choice(1, 2))"], "model.lr: tag 'log' is not allowed on choice()"),
        (["data.batch_size=range(8, 4)"], "data.batch_size=range(8, 4, 1) is not allowed: it holds no value"),
        (["data.batch_size=tag(log, range(0, 4))"], "a log scale needs start > 0 and step 1"),
        (["model=glob(*)"], "model=glob(...) is not allowed in a search"),
        (["model.lr=choice(1, 1)"], "model.lr=choice(1, 1) is not allowed: a value appears twice"),
        (["model.lr=1,2", "model.lr=3,4"], "model.lr is given twice"),
        (["model.lr=1e-3", "model.lr=interval(1e-4, 1e-2)"], "model.lr is given twice"),
        (["model.lr=1e-3"], "needs a space: at least one key=choice(...), range(...) or interval(...)"),
        (["model.lr=interval(1,"], "model.lr=interval(1,"),
    ],
)
def test_a_bad_space_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError) as err:
        parse_space(overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"sampler": "grid"}, "hydra.sweeper.sampler='grid' is not allowed: one of tpe, random, cmaes, qmc"),
        ({"pruner": "asha"}, "hydra.sweeper.pruner='asha' is not allowed: one of none, median, sha, hyperband"),
        ({"direction": "down"}, "hydra.sweeper.direction='down' is not allowed: one of minimize, maximize"),
        ({"n_trials": 0}, "hydra.sweeper.n_trials=0 is not allowed: a whole number >= 1"),
        ({"reduction_factor": 1}, "hydra.sweeper.reduction_factor=1 is not allowed"),
        ({"min_resource": 0}, "hydra.sweeper.min_resource=0 is not allowed"),
        ({"heartbeat_interval_s": 60, "grace_period_s": 30}, "hydra.sweeper.grace_period_s=30 is not allowed"),
        ({"objective": ""}, "hydra.sweeper.objective='' is not allowed"),
        ({"pruner": "hyperband", "min_resource": 50, "max_resource": 20},
         "hydra.sweeper.min_resource=50 is not allowed: at most max_resource=20"),
    ],
)
def test_bad_sweeper_settings_are_refused_naming_the_key(raw, message):
    with pytest.raises(ValueError, match=None) as err:
        settings_from_mapping({"_target_": "x", **raw})
    assert message in str(err.value)


def test_sweeper_settings_ignore_hydra_keys():
    assert settings_from_mapping({"_target_": "x", "params": None, "n_trials": 4}) == SearchSettings(n_trials=4)
    assert SearchSpace((), ()).overrides({}) == []


def test_unset_pruner_rungs_come_from_the_trials_objective_steps():
    steps = [(25, 200), (10, 300)]
    assert with_trial_steps(SearchSettings(pruner="hyperband"), steps).max_resource == 300
    assert with_trial_steps(SearchSettings(pruner="hyperband"), steps).min_resource is None
    assert with_trial_steps(SearchSettings(pruner="sha"), steps).min_resource == 10
    assert with_trial_steps(SearchSettings(pruner="sha"), steps).max_resource is None
    given = SearchSettings(pruner="hyperband", min_resource=5, max_resource=100)
    assert with_trial_steps(given, steps) == given
    for untouched in (SearchSettings(pruner="median"), SearchSettings(pruner="none")):
        assert with_trial_steps(untouched, steps) == untouched
    assert with_trial_steps(SearchSettings(pruner="hyperband"), []) == SearchSettings(pruner="hyperband")
    # SHA has no last rung: a max_resource given with it is not compared with the derived first rung.
    assert with_trial_steps(SearchSettings(pruner="sha", max_resource=5), steps).min_resource == 10
    # A first rung past every trial's end would leave Hyperband no room: the last rung follows it.
    assert with_trial_steps(SearchSettings(pruner="hyperband", min_resource=400), steps).max_resource == 400


def test_hpcsweep_trials_report_their_objective_from_the_first_evaluation_to_the_last_step():
    from hpcsweep.config import trial_config_from_dict
    from hpcsweep.sweep.hooks import Allocation, CheckedTrial, TrialHook
    from hpcsweep.sweep.hpcsweep_hook import HpcsweepTrials

    def checked(**trainer):
        return CheckedTrial(Allocation(), (trial_config_from_dict({"trainer": trainer}), None))

    assert HpcsweepTrials().objective_steps(checked()) == (25, 200)
    assert HpcsweepTrials().objective_steps(checked(eval_every=10, max_steps=300)) == (10, 300)
    assert HpcsweepTrials().objective_steps(checked(eval_every=500, max_steps=300)) == (300, 300)
    assert TrialHook().objective_steps(checked()) is None
