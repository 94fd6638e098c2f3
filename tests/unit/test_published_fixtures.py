"""The model folders tests and benchmarks make look like published ones: their config class's defaults with
only sizes shrunk (``tests.model_folders.SIZE_KEYS``), ``use_cache: true`` among the defaults kept."""

from __future__ import annotations

import json

import pytest

from tests.model_folders import SIZE_KEYS, changed_keys, make_model_folder
from tests.moe_models import tiny_moe


def test_a_test_folder_keeps_every_default_but_its_sizes(tmp_path):
    from transformers import AutoConfig

    folder = make_model_folder(tmp_path / "model", weights=False)
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    assert changed_keys(config) == {}
    assert json.loads((folder / "config.json").read_text())["use_cache"] is True


@pytest.mark.parametrize("kind", ["v2", "v3", "mixtral", "qwen2_moe"])
def test_the_balance_tests_models_keep_every_default_but_their_sizes(kind):
    config = tiny_moe(kind).config
    changed = changed_keys(config)
    if kind == "v2":  # DeepSeek-V2-Lite's config.json sets these two; DeepseekV2Config's defaults differ
        assert set(changed) == {"aux_loss_alpha", "seq_aux"}
    else:
        assert changed == {}
    assert config.use_cache is True


def test_a_setting_that_is_not_a_size_needs_a_reason(tmp_path):
    with pytest.raises(ValueError, match=r"\['use_cache'\] are not sizes"):
        make_model_folder(tmp_path / "model", weights=False, use_cache=False)
    assert "use_cache" not in SIZE_KEYS
