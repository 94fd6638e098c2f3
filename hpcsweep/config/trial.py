"""The trial config composed of every group, and its conversion from and to plain containers."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .data import DataConfig, check_corpus_fits
from .logging import LoggingConfig
from .model import ModelConfig
from .nccl import NcclConfig
from .objective import ObjectiveConfig
from .resume import ResumeConfig
from .schema import _GROUPS, _LAUNCH_GROUPS, build_group, unknown_key_message
from .tasks import TasksConfig, _task_key
from .topology import TopologyConfig
from .trainer import TrainerConfig
from .validation import _fail, _require


@dataclass(kw_only=True)
class TrialConfig:
    """Everything one trial needs, validated."""

    model: ModelConfig
    data: DataConfig
    trainer: TrainerConfig
    nccl: NcclConfig
    topology: TopologyConfig
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)

    def __post_init__(self) -> None:
        self._check_task_keys()
        self._check_objective_data()
        if self.model.path is not None:
            return  # the folder's sizes count: hpcsweep.model.folder checks them against the data
        _require(
            self.data.seq_len <= self.model.max_position_embeddings,
            "data.seq_len",
            self.data.seq_len,
            f"at most model.max_position_embeddings={self.model.max_position_embeddings}",
        )
        if self.data.kind in ("text", "chat", "preference"):
            _require(
                tokenizer_folder(self.data, self.model) is not None,
                "data.tokenizer",
                self.data.tokenizer,
                f"a Hugging Face tokenizer folder when data.kind={self.data.kind} and no model.path names one",
            )
        if self.data.kind == "synthetic":
            check_corpus_fits(
                self.data,
                self.model.vocab_size,
                num_tokens=self.data.synthetic_tokens,
                corpus_vocab_size=self.model.vocab_size,
                source=f"the synthetic corpus (data.synthetic_tokens={self.data.synthetic_tokens})",
            )

    def _check_objective_data(self) -> None:
        """DPO trains on preference pairs, and preference pairs train only with DPO; early stopping watches what the
        objective's evaluation measures."""
        _require(self.objective.kind != "dpo" or self.data.kind == "preference", "data.kind", self.data.kind,
                 "preference when objective=dpo (DPO trains on chosen and rejected answers: data=preference)")
        _require(self.data.kind != "preference" or self.objective.kind == "dpo", "objective.kind", self.objective.kind,
                 "dpo when data.kind=preference (next-token training has no use for the rejected answers)")
        metric = self.trainer.early_stop_metric
        _require(not metric.startswith("val_reward_") or self.objective.kind == "dpo", "trainer.early_stop_metric",
                 metric, "val_loss, val_accuracy or a task score unless objective=dpo (only DPO measures rewards)")
        _require(not (metric == "val_accuracy" and self.objective.kind == "dpo"), "trainer.early_stop_metric",
                 metric, "val_loss, val_reward_accuracy, val_reward_margin or a task score with objective=dpo (DPO's "
                 "evaluation measures rewards, not next-token accuracy)")
        self._check_reference_route()

    def _check_reference_route(self) -> None:
        """The reference is precomputed from a folder, or is the model with its LoRA adapters off: one of them
        must be there (``reference_folder``)."""
        objective, model = self.objective, self.model
        if objective.kind != "dpo":
            return
        if objective.precompute_reference is False:
            _require(model.peft == "lora", "objective.precompute_reference", False,
                     "true or null with model.peft=none: a full fine-tuning trial keeps no copy of the model it "
                     "started from, so its reference's log-probabilities are computed once by the preparation job")
            _require(objective.reference is None, "objective.precompute_reference", False,
                     f"true or null with objective.reference={objective.reference!r}: another folder's "
                     "log-probabilities are computed once by the preparation job (the trial holds only its own model)")
        if objective.precompute_reference and reference_folder(self) is None:
            _fail("objective.precompute_reference", True,
                  "false or null here: no folder holds the reference to compute it from (model.path is "
                  f"{'null' if model.path is None else 'not loaded: model.random_init=true'} and objective.reference "
                  "is null)")

    def _check_task_keys(self) -> None:
        """A task score watched by early stopping is one the trial measures, more than once."""
        trainer, tasks = self.trainer, self.tasks
        task = _task_key(trainer.early_stop_metric)
        if task is None:
            return
        _require(task[0] in tasks.names, "trainer.early_stop_metric", trainer.early_stop_metric,
                 f"a score of a task in tasks.names={tasks.names}")
        _require(trainer.early_stop_patience == 0 or tasks.every > 0, "tasks.every", tasks.every,
                 f"a number of steps > 0 when early stopping watches {trainer.early_stop_metric} "
                 "(0 runs the tasks at the end only)")


def reference_folder(trial: TrialConfig) -> str | None:
    """The folder whose answer log-probabilities a DPO trial reads, computed once by the preparation job
    (``hpcsweep.prepare.reference_logps``): ``objective.reference``, else the folder the trial starts from
    (``model.path``, unless ``model.random_init``), unless ``objective.precompute_reference=false``; None: none
    (not DPO, or a LoRA trial whose reference is its model with the adapters off, each step)."""
    objective, model = trial.objective, trial.model
    if objective.kind != "dpo" or objective.precompute_reference is False:
        return None
    if objective.reference is not None:
        return objective.reference
    return model.path if model.path and not model.random_init else None


def tokenizer_folder(data: DataConfig, model: ModelConfig) -> str | None:
    """The tokenizer folder a trial's text is tokenized with: ``data.tokenizer``, else the model
    folder's (``model.path``); None when neither is set."""
    return data.tokenizer or model.path


def trial_config_from_dict(values: Mapping[str, Any]) -> TrialConfig:
    """Validate a composed config (as plain containers) and build the ``TrialConfig``.

    The ``hydra`` and ``resume`` keys, when present, are ignored.
    """
    unknown = sorted(set(values) - set(_GROUPS) - set(_LAUNCH_GROUPS) - {"hydra"})
    if unknown:
        raise ValueError(unknown_key_message(unknown[0]) or f"{unknown[0]} is not a config group")
    groups = {}
    for name, cls in _GROUPS.items():
        group_values = values.get(name) or {}
        if not isinstance(group_values, Mapping):
            _fail(name, group_values, f"a mapping of {name} keys")
        groups[name] = build_group(cls, name, group_values)
    return TrialConfig(**groups)


def trial_config_to_dict(config: TrialConfig) -> dict[str, Any]:
    """The plain-container form of a ``TrialConfig`` (what ``config.yaml`` in a trial dir holds)."""
    return dataclasses.asdict(config)


def resume_config_from_dict(values: Mapping[str, Any]) -> ResumeConfig:
    """Validate the ``resume`` group of a composed config (absent: the defaults)."""
    group_values = values.get("resume") or {}
    if not isinstance(group_values, Mapping):
        _fail("resume", group_values, "a mapping of resume keys")
    return build_group(ResumeConfig, "resume", group_values)
