"""The pure parts of ``hpcsweep.train.remote_code``: model code written for transformers 4 under transformers 5
(the model-level fixes are proved on a DeepSeek-MoE folder in test_remote_code_moe.py)."""

from __future__ import annotations

import pytest

from hpcsweep.train import remote_code


@pytest.mark.parametrize("rope, legacy", [
    (None, None),
    ({}, None),
    # transformers 5's form of a config.json's rope_scaling: null
    ({"rope_theta": 10000, "rope_type": "default"}, None),
    ({"rope_theta": 10000, "rope_type": "linear", "factor": 4.0},
     {"rope_theta": 10000, "rope_type": "linear", "factor": 4.0, "type": "linear"}),
    ({"type": "dynamic", "factor": 2.0}, {"type": "dynamic", "factor": 2.0}),
])
def test_rope_settings_read_back_as_transformers_4_gave_them(rope, legacy):
    assert remote_code.legacy_rope_scaling(rope) == legacy


def test_only_code_that_reads_rope_scaling_and_not_rope_parameters_gets_the_old_form():
    old = 'if self.config.rope_scaling is None:\n    ...\nscaling_type = self.config.rope_scaling["type"]'
    new = "self.scaling = yarn_apply_mscale(config.rope_parameters, d)  # rope_scaling is the old name"
    assert (remote_code.reads_legacy_rope(old), remote_code.reads_legacy_rope(new),
            remote_code.reads_legacy_rope("")) == (True, False, False)


def test_the_model_code_is_read_from_the_folder_the_auto_map_names(tmp_path):
    from types import SimpleNamespace

    (tmp_path / "modeling_x.py").write_text("rope_scaling")
    config = SimpleNamespace(auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"}, _name_or_path=str(tmp_path))
    assert remote_code.model_code_source(config) == "rope_scaling"
    # Code in another repository of the hub (repo--module.Class) is never read, nor a folder without it.
    elsewhere = SimpleNamespace(auto_map={"AutoModelForCausalLM": "org/repo--modeling_x.X"}, _name_or_path=str(tmp_path))
    assert remote_code.model_code_source(elsewhere) == ""
    assert remote_code.model_code_source(SimpleNamespace(auto_map={}, _name_or_path=str(tmp_path))) == ""


def test_a_removed_name_is_given_back_and_one_transformers_has_is_kept(monkeypatch):
    import transformers.utils.import_utils as import_utils

    monkeypatch.delattr(import_utils, "is_torch_fx_available", raising=False)
    kept = import_utils.is_torch_available
    remote_code.provide_removed_names()
    from transformers.utils.import_utils import is_torch_fx_available  # as DeepSeek-MoE's code imports it

    assert is_torch_fx_available() is False and import_utils.is_torch_available is kept
