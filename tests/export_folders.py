"""Model folders for export tests: a bf16 DeepseekV3 (as a hub folder of a bf16 model is), and one whose
model and tokenizer come with remote code (an ``auto_map``), each written by ``save_pretrained``.

    folder = make_bf16_folder(tmp_path / "tiny-bf16")
    remote = make_remote_code_folder(tmp_path / "tiny-remote")
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.model_folders import make_model_folder

CONFIGURATION = '''from transformers import DeepseekV3Config


class TinyRemoteConfig(DeepseekV3Config):
    model_type = "tiny_remote"
'''
MODELING = '''from transformers import DeepseekV3ForCausalLM

from .configuration_tiny_remote import TinyRemoteConfig


class TinyRemoteForCausalLM(DeepseekV3ForCausalLM):
    config_class = TinyRemoteConfig
'''
AUTO_MAP = {"AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
            "AutoModelForCausalLM": "modeling_tiny_remote.TinyRemoteForCausalLM"}


def make_bf16_folder(folder: Path, **config_overrides) -> Path:
    """A tiny DeepseekV3 saved in bf16 (its router kept in fp32, as transformers keeps it), with a tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    fp32 = make_model_folder(folder.with_name(folder.name + "-fp32"), **config_overrides)
    model = AutoModelForCausalLM.from_pretrained(fp32, local_files_only=True, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(fp32 / name, folder / name)
    shutil.rmtree(fp32)
    return folder


def make_remote_code_folder(folder: Path) -> Path:
    """A tiny DeepseekV3 whose config.json names its own classes by ``auto_map`` (``model_type``
    ``tiny_remote``, unknown to transformers): it loads only with ``trust_remote_code=True``."""
    make_model_folder(folder)
    (folder / "configuration_tiny_remote.py").write_text(CONFIGURATION)
    (folder / "modeling_tiny_remote.py").write_text(MODELING)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="tiny_remote", auto_map=AUTO_MAP, architectures=["TinyRemoteForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
