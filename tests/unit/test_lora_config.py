"""``model.peft`` and the nested ``model.lora.*`` keys: validated, named in errors, known to the key check, sweepable."""

import pytest

from hpcsweep.config import trial_config_from_dict, unknown_key_message

from .test_compose import loader_and_master


def lora_model(**lora):
    return trial_config_from_dict({"model": {"peft": "lora", "lora": lora}}).model


def test_defaults_train_every_weight_and_hold_lora_settings():
    model = trial_config_from_dict({}).model
    assert (model.peft, model.lora.r, model.lora.alpha, model.lora.dropout, model.lora.target_modules) == (
        "none", 16, 32.0, 0.0, None)
    assert lora_model(r=8, alpha=16, target_modules=["q_proj", "o_proj"]).lora.target_modules == ["q_proj", "o_proj"]


@pytest.mark.parametrize(
    "values, message",
    [
        ({"peft": "qlora"}, "model.peft='qlora' is not allowed: one of 'none', 'lora'"),
        ({"lora": {"r": 0}}, "model.lora.r=0 is not allowed: an integer >= 1"),
        ({"lora": {"r": "8"}}, "model.lora.r='8' is not allowed: an integer"),
        ({"lora": {"alpha": 0}}, "model.lora.alpha=0.0 is not allowed: a number > 0"),
        ({"lora": {"dropout": 1.0}}, "model.lora.dropout=1.0 is not allowed: 0 <= dropout < 1"),
        ({"lora": {"target_modules": []}}, "model.lora.target_modules=[] is not allowed: null (every attention"),
        ({"lora": {"target_modules": "q_proj"}}, "model.lora.target_modules='q_proj' is not allowed: a list or null"),
        ({"lora": 8}, "model.lora=8 is not allowed: a mapping of model.lora keys"),
        ({"lora": {"rr": 8}}, "model.lora.rr is not a config key; did you mean model.lora.r? (keys of model.lora: "
                              "alpha, dropout, experts, r, target_modules)"),
    ],
)
def test_bad_lora_values_name_the_nested_key(values, message):
    with pytest.raises(ValueError) as err:
        trial_config_from_dict({"model": values})
    assert str(err.value).startswith(message)


def test_dropout_is_allowed_on_moe_models_whose_experts_get_adapters():
    # hpcsweep.train.moe.expert_lora applies dropout to the routed experts' adapters (tests/unit/test_expert_lora.py).
    assert lora_model(dropout=0.1).lora.dropout == 0.1
    assert lora_model(dropout=0.1).lora.experts is True
    assert lora_model(experts=False).lora.experts is False
    with pytest.raises(ValueError, match=r"^model.lora.experts='yes' is not allowed"):
        lora_model(experts="yes")


def test_the_key_check_knows_nested_keys_and_hints_at_the_closest():
    for key in ("model.peft", "model.lora", "model.lora.r", "model.lora.alpha", "model.lora.target_modules"):
        assert unknown_key_message(key) is None, key
    message = unknown_key_message("model.lora.rr")
    assert message.startswith("model.lora.rr is not a config key; did you mean model.lora.r? (keys of model: ")
    assert "lora.dropout" in message
    assert unknown_key_message("model.lora.r.x").startswith("model.lora.r.x is not a config key")
    assert unknown_key_message("model.lr") is None and "did you mean model.lr?" in unknown_key_message("model.lrr")


def test_a_sweep_over_the_rank_composes_one_valid_trial_per_value():
    from hpcsweep.sweep.compose import SweepComposer

    composer = SweepComposer(*loader_and_master())
    ranks = [
        trial_config_from_dict(composer.compose_values(["model.peft=lora", f"model.lora.r={r}"])).model.lora.r
        for r in (8, 16, 64)
    ]
    assert ranks == [8, 16, 64]
    values = composer.compose_values(["model.peft=lora", "model.lora.target_modules=[q_proj,o_proj]"])
    assert trial_config_from_dict(values).model.lora.target_modules == ["q_proj", "o_proj"]
