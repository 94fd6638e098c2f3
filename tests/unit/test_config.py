"""Config validation: every bad value names its key, the value, and what is allowed."""

import pytest

from hpcsweep.config import trial_config_from_dict, trial_config_to_dict


def test_defaults_validate_and_round_trip():
    config = trial_config_from_dict({})
    assert trial_config_from_dict(trial_config_to_dict(config)) == config


def test_ints_are_accepted_as_floats():
    assert trial_config_from_dict({"model": {"lr": 1}}).model.lr == 1.0


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"model": {"lr": -1}}, "model.lr=-1.0 is not allowed: a learning rate > 0"),
        ({"model": {"lr": 0}}, "model.lr=0.0 is not allowed"),
        ({"model": {"lr": "fast"}}, "model.lr='fast' is not allowed: a number"),
        ({"model": {"nosuch": 1}}, "model.nosuch is not a config key (keys of model: arch,"),
        ({"model": {"lrr": 1}}, "model.lrr is not a config key; did you mean model.lr? (keys of model: arch,"),
        ({"trainer": {"nodes": 0}}, "trainer.nodes=0 is not allowed: an integer >= 1"),
        ({"trainer": {"nodes": True}}, "trainer.nodes=True is not allowed: an integer"),
        ({"trainer": {"precision": "fp8"}}, "trainer.precision='fp8' is not allowed: one of 'fp32', 'bf16', 'fp16'"),
        ({"nccl": {"preset": "x"}}, "nccl.preset='x' is not allowed: one of 'a100_ib'"),
        ({"topology": {"mode": "near"}}, "topology.mode='near' is not allowed: one of 'switches', 'pin', 'off'"),
        ({"extra": {}}, "extra is not a config key (config groups: model, data, trainer, nccl, topology, logging, tasks, objective, resume)"),
    ],
)
def test_bad_values_name_key_value_and_allowed(values, message):
    with pytest.raises(ValueError) as err:
        trial_config_from_dict(values)
    assert message in str(err.value)


def test_nproc_per_node_is_auto_or_a_positive_integer():
    from hpcsweep.train.distributed import resolve_nproc_per_node

    assert trial_config_from_dict({}).trainer.nproc_per_node == "auto"
    assert trial_config_from_dict({"trainer": {"nproc_per_node": 4}}).trainer.nproc_per_node == 4
    with pytest.raises(ValueError, match="trainer.nproc_per_node='many' is not allowed: an integer or one of 'auto'"):
        trial_config_from_dict({"trainer": {"nproc_per_node": "many"}})
    assert resolve_nproc_per_node("auto", 8) == 8
    assert resolve_nproc_per_node("auto", 0) == 1
    assert resolve_nproc_per_node(2, 8) == 2


def test_a_sequence_longer_than_the_model_takes_is_refused():
    with pytest.raises(ValueError, match=r"^data.seq_len=1024 is not allowed: at most model.max_position_embeddings=512$"):
        trial_config_from_dict({"data": {"seq_len": 1024}})
    assert trial_config_from_dict({"data": {"seq_len": 512}}).data.seq_len == 512


def test_a_synthetic_corpus_too_small_for_the_sequences_is_refused():
    with pytest.raises(ValueError, match=r"^data.seq_len=64 is not allowed: at most 48: the synthetic corpus "
                                         r"\(data.synthetic_tokens=1000\) holds 1000 tokens"):
        trial_config_from_dict({"data": {"synthetic_tokens": 1000}})


def test_a_corpus_must_fit_the_vocabulary_and_the_sequences():
    from hpcsweep.config import DataConfig, check_corpus_fits

    data = DataConfig(kind="file", path="c.bin", seq_len=10, val_fraction=0.1)
    check_corpus_fits(data, 173, num_tokens=1000, corpus_vocab_size=173, source="c.bin")
    with pytest.raises(ValueError, match=r"^model.vocab_size=100 is not allowed: c.bin needs at least 173 \(its vocabulary\)$"):
        check_corpus_fits(data, 100, num_tokens=1000, corpus_vocab_size=173, source="c.bin")
    # A 10% validation split of 120 tokens holds 12: a window of 10 + 1 targets is the longest that fits.
    check_corpus_fits(data, 256, num_tokens=120, corpus_vocab_size=173, source="c.bin")
    with pytest.raises(ValueError, match=r"^data.seq_len=10 is not allowed: at most 9: c.bin holds 110 tokens"):
        check_corpus_fits(data, 256, num_tokens=110, corpus_vocab_size=173, source="c.bin")
