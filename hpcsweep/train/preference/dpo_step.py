"""One micro-batch of ``objective=dpo``: the reference's and the policy's answer log-probabilities, and DPO's loss.

The policy is the model that trains. Under LoRA the reference is the same model with its adapters off (peft's
``disable_adapter()``, TRL's and LLaMA-Factory's route: no second copy of the weights), run first, without
gradients; under full fine-tuning the model it started from is gone, and the rows carry the reference's
log-probabilities, computed once per sweep by the preparation job (``hpcsweep.prepare.reference_logps``,
``Batch.reference``): no reference forward at all. Adapters off means every adapter: peft's ``lora.Linear`` and ``ParamWrapper`` read the flag, and
hpcsweep's grouped expert LoRA (``hpcsweep.train.moe.expert_lora``) hands a disabled wrapper back to peft's forward,
which then runs the frozen experts alone. The reference runs before the policy because both forwards route: a MoE
router records the last training forward, and the policy's record is the one the balance loss and the bias update
must read (``hpcsweep.train.moe.load_balance``), so the trainer takes the aux loss after ``pair_losses`` as it does
after a next-token forward.

Each answer's log-probability is taken at the LM head from its hidden states, a chunk of answer tokens at a time
(``HeadLoss.answer_logps``), or from the logits where the head cannot take it (``answer_logps``). The loss of a
micro-batch is the mean of its pairs' losses (``dpo_loss``); TRL's metrics are summed per window
(``PreferenceWindow``) and averaged over every pair of every rank when logged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hpcsweep.config import ObjectiveConfig
from hpcsweep.train.distributed import WorldInfo, mean_over_ranks
from hpcsweep.train.preference.answer_logps import AnswerLogps, answer_logps
from hpcsweep.train.preference.dpo_loss import METRICS, PairLosses, dpo_loss

Forward = Callable[[torch.nn.Module], torch.Tensor]
"""``forward(net)``: the logits of the micro-batch through ``net`` (or, inside ``HeadLoss.answer_logps``, the head's
stand-in for them)."""


class PreferenceStep:
    """DPO's loss of a micro-batch of pairs for one model (a peft model: its adapters are the difference from the
    reference, or a full fine-tuning one whose rows carry the reference's log-probabilities: ``precomputed``).
    ``head_loss``: the model's ``HeadLoss`` (None: the logits are not the head's output); ``chunk_tokens``:
    ``trainer.loss_chunk_tokens`` as resolved for the logits' path."""

    def __init__(self, objective: ObjectiveConfig, model: torch.nn.Module, head_loss: Any,
                 chunk_tokens: Callable[[int], int], *, precomputed: bool = False) -> None:
        if not precomputed and not hasattr(model, "disable_adapter"):
            raise ValueError("objective=dpo: a model without LoRA adapters needs its reference log-probabilities "
                             "precomputed (hpcsweep.prepare.reference_logps)")
        self.objective, self.model, self.head_loss, self.chunk_tokens = objective, model, head_loss, chunk_tokens
        self.precomputed = precomputed

    def logps(self, batch: Any, net: torch.nn.Module, forward: Forward) -> AnswerLogps:
        """Each answer's summed log-probability in ``batch`` (``Batch.answers``: ``2 x pairs`` answers) through
        ``net``, with gradients where they are enabled."""
        count = 2 * batch.pairs
        if self.head_loss is not None:
            with self.head_loss.answer_logps(batch.targets, batch.answers, count) as taken:
                forward(net)
            assert taken.logps is not None
            return taken.logps
        logits = forward(net)
        return answer_logps(logits, batch.targets, batch.answers >= 0, batch.answers,
                            chunk_tokens=self.chunk_tokens(int((batch.answers >= 0).sum())), answers=count)

    def reference_logps(self, batch: Any, forward: Forward) -> AnswerLogps:
        """The reference's: the rows' precomputed ones, else the model with every adapter off, without gradients."""
        if self.precomputed:
            if batch.reference is None:
                raise ValueError("objective=dpo: these rows carry no precomputed reference log-probabilities")
            taken = batch.answers[batch.answers >= 0]
            return AnswerLogps(batch.reference.to(torch.float32),
                               torch.bincount(taken, minlength=2 * batch.pairs))
        with torch.no_grad(), self.model.disable_adapter():
            return self.logps(batch, self.model, forward)

    def pair_losses(self, batch: Any, net: torch.nn.Module, forward: Forward) -> PairLosses:
        """Each pair's DPO loss (with the policy's gradient) and TRL's metrics: the reference first (see the module)."""
        reference = self.reference_logps(batch, forward)
        policy = self.logps(batch, net, forward)
        return losses_of(policy, reference, self.objective)


def losses_of(policy: AnswerLogps, reference: AnswerLogps, objective: ObjectiveConfig) -> PairLosses:
    """``dpo_loss`` of answers numbered as ``Batch.answers`` numbers them: pair ``p``'s chosen ``2p``, rejected ``2p + 1``."""
    return dpo_loss(policy.logps[0::2], policy.logps[1::2], reference.logps[0::2], reference.logps[1::2],
                    policy.tokens[0::2], policy.tokens[1::2], objective)


class PreferenceWindow:
    """TRL's metrics (``dpo_loss.METRICS``) summed over the pairs of a log window, on the device (no host sync a
    micro-batch)."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(len(METRICS) + 1, dtype=torch.float64, device=device)

    def add(self, pairs: PairLosses) -> None:
        """Count one micro-batch's pairs."""
        per_pair = torch.stack([pairs.metrics[name].double() for name in METRICS])
        self.sums += torch.cat([per_pair.sum(dim=1), per_pair.new_tensor([per_pair.shape[1]])])

    def take(self, world: WorldInfo) -> dict[str, float]:
        """Each metric's mean over every pair of the window on every rank (a collective), then a fresh window."""
        totals = (mean_over_ranks(world, self.sums) * world.world_size).tolist()
        self.sums.zero_()
        count = totals[-1]
        return {name: value / count for name, value in zip(METRICS, totals)} if count else {}
