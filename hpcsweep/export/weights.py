"""A trial's model on CPU, with the weights of one of its checkpoints: no process group, any layout.

The model is built as the trial built it (its ``config.yaml``: the architecture, the base and
``trainer.seed``, then the LoRA adapters), and the checkpoint's ``model/`` part is read into it by
DCP without a process group. DCP stores each tensor by its name with its shards' places, so a
checkpoint written by any number of ranks, by DDP or by FSDP2, reads into the one whole model here.
Under LoRA the checkpoint holds the adapters only; the frozen base is the one the trial started from.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import yaml

from hpcsweep.config import TrialConfig, trial_config_from_dict
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.train import lora, model
from hpcsweep.train.checkpoint.manager import TRAINER_FILE, WEIGHTS_DIR, load_plain_file
from hpcsweep.train.checkpoint.store import SafeFileSystemReader
from hpcsweep.train.checkpoint.trained_state import load_trained_state_dict, trained_state_dict


def trial_config(trial_dir: Path) -> TrialConfig:
    """The validated config the trial trained with."""
    return trial_config_from_dict(yaml.safe_load(TrialFiles(trial_dir).config.read_text()))


def load_trial_model(cfg: TrialConfig, checkpoint: Path) -> torch.nn.Module:
    """The trial's model (a peft model under LoRA) in eval mode, holding ``checkpoint``'s weights."""
    built = model.build_model(cfg.model, cfg.trainer.seed, "eager")
    net = lora.apply_lora(built, cfg.model, seed=cfg.trainer.seed)
    target = {"model": trained_state_dict(net)}
    with warnings.catch_warnings():
        # DCP warns that it reads in one process, which is the point here.
        warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")
        dcp.load(target, storage_reader=SafeFileSystemReader(checkpoint / WEIGHTS_DIR), no_dist=True)
    load_trained_state_dict(net, target["model"])
    return net.eval()


def checkpoint_state(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's plain state (``trainer.pt``: step, status, val loss, base model identity)."""
    return load_plain_file(checkpoint / TRAINER_FILE)
