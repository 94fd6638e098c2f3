"""The ``objective`` group: what a trial's loss is, next-token cross-entropy or DPO on preference pairs."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, fields
from typing import Literal

from .validation import _require

_DpoLoss = Literal["sigmoid", "ipo", "hinge", "robust"]
DPO_LOSSES: tuple[str, ...] = typing.get_args(_DpoLoss)
"""The DPO variants ``objective.loss`` names, in TRL's words (``DPOConfig.loss_type``)."""


@dataclass(kw_only=True)
class ObjectiveConfig:
    """What a trial trains for. ``objective=dpo`` trains on ``data=preference`` pairs, with TRL's ``DPOTrainer``
    losses and names (``hpcsweep.train.preference.dpo_loss``, docs/user/preference-tuning.md); every other key
    here is DPO's, so with ``next_token`` each keeps its default."""

    kind: Literal["next_token", "dpo"] = "next_token"
    """``next_token``: the cross-entropy of each next token (of the answers only, for ``data=chat``); ``dpo``:
    Direct Preference Optimization on the chosen and rejected answers of ``data=preference``."""
    beta: float = 0.1
    """``objective=dpo``: how far the trained model may move from the reference (TRL's ``beta``: higher, less
    far); for ``objective.loss=ipo`` the regulariser τ. A number > 0."""
    loss: _DpoLoss = "sigmoid"
    """``objective=dpo``: the variant, TRL's ``loss_type``: ``sigmoid`` (DPO), ``ipo`` (IPO, on log-ratios
    normalised by each answer's length), ``hinge`` (SLiC), ``robust`` (rDPO, for preferences that may be
    flipped: ``objective.label_smoothing``)."""
    label_smoothing: float = 0.0
    """``objective.loss=robust``: the probability that a pair's preference is flipped, 0 <= it < 0.5 (TRL's
    ``label_smoothing``; the rDPO paper suggests 0.1). The other losses take none (TRL's ``sigmoid`` has not
    since TRL 0.29): 0."""
    sft_weight: float = 0.0
    """``objective=dpo``: the weight of the chosen answer's mean negative log-likelihood per token added to each
    pair's loss (RPO; TRL's ``loss_type=["sigmoid", "sft"]`` with ``loss_weights=[1, w]``). A number >= 0; 0:
    none."""
    reference: str | None = None
    """``objective=dpo``: the model the trained one is compared with. null: the model the trial starts from
    (``model.path``'s weights); a path: another Hugging Face folder with the same vocabulary, as a supervised
    fine-tuning trial's merged export."""
    precompute_reference: bool | None = None
    """``objective=dpo``: whether the reference's answer log-probabilities are computed once, by the sweep's
    preparation job, for every trial and later sweep on the same folder and pairs (TRL's
    ``precompute_ref_log_probs``), so no trial runs a reference forward. null: yes wherever a folder holds the
    reference (``objective.reference``, else ``model.path`` unless ``model.random_init``); false: each step runs
    the model with its LoRA adapters off (``model.peft=lora`` and no ``objective.reference`` only); true: yes,
    refused where no folder holds the reference. ``hpcsweep.config.trial.reference_folder`` decides."""

    def __post_init__(self) -> None:
        _require(math.isfinite(self.beta) and self.beta > 0, "objective.beta", self.beta, "a number > 0")
        _require(0 <= self.label_smoothing < 0.5, "objective.label_smoothing", self.label_smoothing,
                 "0 <= objective.label_smoothing < 0.5 (the probability that a preference is flipped)")
        _require(not self.label_smoothing or self.loss == "robust", "objective.label_smoothing",
                 self.label_smoothing, f"0 unless objective.loss=robust (objective.loss={self.loss} takes no label "
                 "smoothing)")
        _require(math.isfinite(self.sft_weight) and self.sft_weight >= 0, "objective.sft_weight", self.sft_weight,
                 "a number >= 0 (0: no SFT term)")
        _require(self.reference is None or bool(self.reference.strip()), "objective.reference", self.reference,
                 "null (the model the trial starts from) or a Hugging Face model folder")
        if self.kind == "next_token":
            default = ObjectiveConfig(kind="dpo")
            for field in fields(self):
                value = getattr(self, field.name)
                _require(field.name == "kind" or value == getattr(default, field.name), f"objective.{field.name}",
                         value, f"{getattr(default, field.name)!r} (its default) unless objective=dpo: "
                         "objective.kind=next_token takes no DPO setting")
