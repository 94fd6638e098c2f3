"""DPO and its variants on each pair's summed answer log-probabilities, as TRL's ``DPOTrainer`` defines them.

A pair is a prompt with a chosen and a rejected answer. For each answer the policy (the model that trains) and
the reference give the summed log-probability of its tokens (``answer_logps``): ``pi_c``, ``pi_r``, ``ref_c``,
``ref_r``. With the log-ratios ``r_c = pi_c - ref_c`` and ``r_r = pi_r - ref_r`` and ``delta = r_c - r_r``
(TRL's ``delta_score`` under its default ``f_divergence_type="reverse_kl"``), each ``objective.loss`` is, per
pair (TRL's ``loss_type`` of the same name, ``trl/trainer/dpo_trainer.py``, ``_compute_loss``):

- ``sigmoid`` (DPO): ``-log σ(β·delta)``
- ``hinge`` (SLiC): ``relu(1 - β·delta)``
- ``ipo`` (IPO, Eq. 17): ``(r_c / n_c - r_r / n_r - 1 / (2β))²``, each log-ratio divided by its answer's token
  count (at least 1), as TRL normalises it (the IPO authors' own form)
- ``robust`` (rDPO): ``(-(1 - ε)·log σ(β·delta) + ε·log σ(-β·delta)) / (1 - 2ε)``, ``ε`` the label smoothing,
  the probability that a pair's preference is flipped, in [0, 0.5)

Label smoothing enters ``robust`` only, as in TRL since 0.29 (before it, TRL's ``sigmoid`` also took it: the
conservative DPO of cDPO); with another loss a smoothing other than 0 would change nothing, so ``ObjectiveConfig``
refuses it.

``sft_weight`` adds RPO's term to each pair's loss: the weight times the chosen answer's mean negative
log-likelihood per token, ``-pi_c / n_c``. TRL spells it ``loss_type=["sigmoid", "sft"]`` with ``loss_weights``;
its ``sft`` term is the mean over every chosen token of the batch, this one the mean over each answer's own
tokens (RPO's form): the two agree when the chosen answers have equal lengths.

The metrics are TRL's, per pair (a mean over pairs is TRL's logged value): ``rewards/chosen`` ``β·r_c``,
``rewards/rejected`` ``β·r_r``, ``rewards/accuracies`` 1 where ``β·r_c > β·r_r``, ``rewards/margins``
``β·(r_c - r_r)``, ``logps/chosen`` ``pi_c``, ``logps/rejected`` ``pi_r`` (summed, not length-normalised, for every
loss). The reference's log-probabilities take no gradient, whatever computed them (the same model with its
adapters off, say): the loss is detached from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hpcsweep.config import DPO_LOSSES, ObjectiveConfig

METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected")
"""The metrics TRL's ``DPOTrainer`` logs for every loss, under its names."""


@dataclass(frozen=True)
class PairLosses:
    """Each pair's loss (with its gradient) and each of ``METRICS`` per pair (detached)."""

    losses: torch.Tensor
    metrics: dict[str, torch.Tensor]


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    chosen_tokens: torch.Tensor,
    rejected_tokens: torch.Tensor,
    objective: ObjectiveConfig,
) -> PairLosses:
    """The loss of each pair under ``objective`` (its ``beta``, ``loss``, ``label_smoothing`` and ``sft_weight``,
    checked by ``ObjectiveConfig``; the module docstring gives each loss's formula) and TRL's metrics.

    Every tensor is ``[pairs]``: the summed log-probabilities of the chosen and rejected answers under the
    policy and the reference, and the answers' token counts (``AnswerLogps.tokens``).
    """
    if objective.kind != "dpo" or objective.loss not in DPO_LOSSES:
        raise ValueError(f"objective.kind={objective.kind!r}, objective.loss={objective.loss!r}: DPO's loss needs "
                         f"objective.kind='dpo' and a loss of {', '.join(DPO_LOSSES)}")
    shapes = {tuple(t.shape) for t in (policy_chosen, policy_rejected, reference_chosen, reference_rejected,
                                       chosen_tokens, rejected_tokens)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"every tensor must be [pairs]: got shapes {sorted(shapes)}")
    beta, loss = objective.beta, objective.loss
    chosen_ratio = policy_chosen - reference_chosen.detach()
    rejected_ratio = policy_rejected - reference_rejected.detach()
    delta = chosen_ratio - rejected_ratio
    chosen_count = chosen_tokens.clamp(min=1).to(delta.dtype)
    if loss == "sigmoid":
        losses = -F.logsigmoid(beta * delta)
    elif loss == "hinge":
        losses = torch.relu(1 - beta * delta)
    elif loss == "ipo":
        rejected_count = rejected_tokens.clamp(min=1).to(delta.dtype)
        losses = (chosen_ratio / chosen_count - rejected_ratio / rejected_count - 1 / (2 * beta)) ** 2
    else:
        smoothing = objective.label_smoothing
        losses = ((1 - smoothing) * -F.logsigmoid(beta * delta) + smoothing * F.logsigmoid(-beta * delta)) / (
            1 - 2 * smoothing)
    if objective.sft_weight:
        losses = losses + objective.sft_weight * (-policy_chosen / chosen_count)
    chosen_rewards = beta * chosen_ratio.detach()
    rejected_rewards = beta * rejected_ratio.detach()
    metrics = {
        "rewards/chosen": chosen_rewards,
        "rewards/rejected": rejected_rewards,
        "rewards/accuracies": (chosen_rewards > rejected_rewards).to(chosen_rewards.dtype),
        "rewards/margins": chosen_rewards - rejected_rewards,
        "logps/chosen": policy_chosen.detach(),
        "logps/rejected": policy_rejected.detach(),
    }
    return PairLosses(losses, metrics)
