"""One dataclass per config group, each field documented, each checked in ``__post_init__``.

These dataclasses hold every default; Hydra composes the presets of ``configs/`` over them
(``config_defaults``), and ``trial_config_from_dict`` turns the composed mapping
into these dataclasses. Every error is a ``ValueError`` that names the key (``model.lr``), the value,
and what is allowed, so a bad sweep stops on the login node before anything is submitted.

One module per group (``model`` with its nested ``lora`` and ``moe``, ``data``, ``trainer``, ``tasks``,
``objective``, ``nccl``, ``topology``, ``logging``, ``resume``), ``trial`` for the ``TrialConfig`` that composes
them, ``schema`` for the groups by name and a group built from a plain mapping, and ``validation`` for the
wording of a refused value. Everything public is re-exported here: import it from ``hpcsweep.config``.
Imports nothing of hpcsweep outside this package; never a stage or a command module.
"""

from __future__ import annotations

from .data import CHAT_TEMPLATE_OWN_NAMES, TEMPLATE_KINDS, DataConfig, check_corpus_fits
from .logging import TRACKER_BACKENDS, LoggingConfig, MlflowConfig, WandbConfig, tracking_uri_problem
from .lora import LoraConfig
from .model import FOLDER_ARCHITECTURE_KEYS, ModelConfig
from .moe import MoeConfig
from .nccl import NcclConfig
from .objective import DPO_LOSSES, ObjectiveConfig
from .resume import ResumeConfig
from .schema import build_group, config_defaults, config_keys, group_keys, mapping_keys, unknown_key_message
from .tasks import TasksConfig
from .topology import TopologyConfig
from .trainer import EVAL_METRICS, TrainerConfig
from .trial import (
    TrialConfig,
    reference_folder,
    resume_config_from_dict,
    tokenizer_folder,
    trial_config_from_dict,
    trial_config_to_dict,
)

__all__ = [
    "CHAT_TEMPLATE_OWN_NAMES",
    "DPO_LOSSES",
    "EVAL_METRICS",
    "FOLDER_ARCHITECTURE_KEYS",
    "TEMPLATE_KINDS",
    "TRACKER_BACKENDS",
    "DataConfig",
    "LoggingConfig",
    "LoraConfig",
    "MlflowConfig",
    "ModelConfig",
    "MoeConfig",
    "NcclConfig",
    "ObjectiveConfig",
    "ResumeConfig",
    "TasksConfig",
    "TopologyConfig",
    "TrainerConfig",
    "TrialConfig",
    "WandbConfig",
    "build_group",
    "check_corpus_fits",
    "config_defaults",
    "config_keys",
    "group_keys",
    "mapping_keys",
    "reference_folder",
    "resume_config_from_dict",
    "tokenizer_folder",
    "trial_config_from_dict",
    "trial_config_to_dict",
    "tracking_uri_problem",
    "unknown_key_message",
]
