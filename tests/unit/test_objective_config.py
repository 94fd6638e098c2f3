"""The ``objective`` group: next-token by default, ``objective=dpo`` with TRL's settings, each refusal naming its key
and what is allowed; DPO only on ``data=preference``, and preference pairs only with DPO."""

from __future__ import annotations

import re

import pytest

from hpcsweep.config import DPO_LOSSES, ObjectiveConfig, build_group, trial_config_from_dict, unknown_key_message

PAIRS = {"kind": "preference", "files": "pairs/*.jsonl", "tokenizer": "tokenizer"}


def test_the_default_is_next_token_and_dpo_takes_trls_defaults():
    assert ObjectiveConfig() == ObjectiveConfig(kind="next_token", beta=0.1, loss="sigmoid", label_smoothing=0.0,
                                                sft_weight=0.0, reference=None)
    assert trial_config_from_dict({}).objective == ObjectiveConfig()
    assert DPO_LOSSES == ("sigmoid", "ipo", "hinge", "robust")
    for loss in DPO_LOSSES:
        build_group(ObjectiveConfig, "objective", {"kind": "dpo", "loss": loss})
    assert build_group(ObjectiveConfig, "objective", {"kind": "dpo", "beta": 1}).beta == 1.0


@pytest.mark.parametrize(("values", "message"), [
    ({"kind": "ppo"}, "objective.kind='ppo' is not allowed: one of 'next_token', 'dpo'"),
    ({"kind": "dpo", "loss": "kto"}, "objective.loss='kto' is not allowed: one of 'sigmoid', 'ipo', 'hinge', 'robust'"),
    ({"kind": "dpo", "beta": 0}, "objective.beta=0.0 is not allowed: a number > 0"),
    ({"kind": "dpo", "beta": -0.1}, "objective.beta=-0.1 is not allowed: a number > 0"),
    ({"kind": "dpo", "loss": "robust", "label_smoothing": 0.5},
     "objective.label_smoothing=0.5 is not allowed: 0 <= objective.label_smoothing < 0.5"),
    ({"kind": "dpo", "loss": "robust", "label_smoothing": -0.1},
     "objective.label_smoothing=-0.1 is not allowed: 0 <= objective.label_smoothing < 0.5"),
    ({"kind": "dpo", "label_smoothing": 0.1},
     "objective.label_smoothing=0.1 is not allowed: 0 unless objective.loss=robust (objective.loss=sigmoid takes no "
     "label smoothing)"),
    ({"kind": "dpo", "sft_weight": -1}, "objective.sft_weight=-1.0 is not allowed: a number >= 0"),
    ({"kind": "dpo", "reference": " "}, "objective.reference=' ' is not allowed: null (the model the trial starts "
                                        "from) or a Hugging Face model folder"),
    ({"beta": 0.5}, "objective.beta=0.5 is not allowed: 0.1 (its default) unless objective=dpo: "
                    "objective.kind=next_token takes no DPO setting"),
    ({"reference": "/shared/sft"}, "objective.reference='/shared/sft' is not allowed: None (its default) unless "
                                   "objective=dpo"),
])
def test_a_bad_setting_names_its_key_and_what_is_allowed(values, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        build_group(ObjectiveConfig, "objective", values)


def test_dpo_needs_preference_pairs():
    with pytest.raises(ValueError, match=re.escape(
            "data.kind='synthetic' is not allowed: preference when objective=dpo (DPO trains on chosen and rejected "
            "answers: data=preference)")):
        trial_config_from_dict({"objective": {"kind": "dpo"}})


def test_preference_pairs_need_dpo():
    with pytest.raises(ValueError, match=re.escape(
            "objective.kind='next_token' is not allowed: dpo when data.kind=preference (next-token training has no "
            "use for the rejected answers)")):
        trial_config_from_dict({"data": PAIRS})


def test_early_stopping_watches_what_the_objective_measures():
    with pytest.raises(ValueError, match=re.escape(
            "trainer.early_stop_metric='val_reward_accuracy' is not allowed: val_loss, val_accuracy or a task score "
            "unless objective=dpo (only DPO measures rewards)")):
        trial_config_from_dict({"trainer": {"early_stop_metric": "val_reward_accuracy"}})
    with pytest.raises(ValueError, match=re.escape(
            "trainer.early_stop_metric='val_accuracy' is not allowed: val_loss, val_reward_accuracy, "
            "val_reward_margin or a task score with objective=dpo")):
        trial_config_from_dict({"data": PAIRS, "objective": {"kind": "dpo"},
                                "trainer": {"early_stop_metric": "val_accuracy"}})
    trial = trial_config_from_dict({"data": PAIRS, "objective": {"kind": "dpo"}, "trainer": {
        "early_stop_metric": "val_reward_accuracy", "early_stop_mode": "max", "early_stop_patience": 2}})
    assert trial.trainer.early_stop_metric == "val_reward_accuracy"


def test_preference_pairs_are_jsonl_files_read_with_a_tokenizer():
    with pytest.raises(ValueError, match=re.escape(
            "data.files=None is not allowed: a glob or a list of globs of .jsonl files when data.kind=preference")):
        trial_config_from_dict({"data": {"kind": "preference"}, "objective": {"kind": "dpo"}})
    with pytest.raises(ValueError, match=re.escape("data.tokenizer=None is not allowed: a Hugging Face tokenizer "
                                                   "folder when data.kind=preference")):
        trial_config_from_dict({"data": {**PAIRS, "tokenizer": None}, "objective": {"kind": "dpo"}})
    trial = trial_config_from_dict({"data": PAIRS, "objective": {"kind": "dpo", "beta": 0.3, "loss": "ipo"}})
    assert (trial.objective.kind, trial.objective.beta, trial.objective.loss) == ("dpo", 0.3, "ipo")


def test_a_mistyped_objective_key_is_named_with_the_closest():
    assert unknown_key_message("objective.bta").startswith("objective.bta is not a config key; did you mean "
                                                          "objective.beta?")
    assert unknown_key_message("objective.sft_weight") is None
