"""Router balance of a MoE model, as its architecture's authors train it (``model.moe``; docs/user/moe.md).

Every router is found through transformers' own record of it: the class a model names for its
``router_logits`` output (``_can_record_outputs``, an ``OutputRecorder``). DeepSeek-V2/V3, Mixtral and
Qwen-MoE routers all return ``(router_logits, weights, chosen experts)``; a forward hook on each keeps
the last training forward's logits (with their graph) and chosen experts, so nothing of the model's
routing code is copied and the model is asked for nothing when it is dense.

- **Auxiliary balance loss** (``model.moe.aux_loss_coef``, null: the folder's ``aux_loss_alpha`` or
  ``router_aux_loss_coef``): DeepSeek-MoE/V2's loss of their ``MoEGate`` (per MoE layer, summed;
  sequence-wise with ``seq_aux``, the default of their configs), DeepSeek-V3's complementary
  sequence-wise loss on its normalised sigmoid scores, and for Mixtral and Qwen-MoE transformers'
  ``load_balancing_loss_func``.
- **Only sample tokens route the balance**: the trainer hands each forward's ``routed_tokens`` (which
  positions hold a sample, and which sample), so padding adds no load, no aux loss and no bias count,
  and each packed sample is a sequence of its own for ``seq_aux``.
- **DeepSeek-V3's aux-loss-free update** (``model.moe.bias_update_rate``, routers with an
  ``e_score_correction_bias``): after each optimizer step the tokens per expert of the step, summed
  over every rank in one all_reduce, move each bias by ``rate x sign(mean load - load)``, as the
  paper's equation and torchtitan's pre-step hook do (torchtitan also centres the update; the paper
  does not, nor do we). The bias is a persistent buffer, so it is in every checkpoint. Under LoRA the
  update is off: an adapter export cannot carry a changed base buffer; the aux loss stands in for it,
  on by default (``LORA_BIAS_ROUTER_AUX_LOSS_COEF`` for a null ``model.moe.aux_loss_coef``).
- **Router statistics** of each log window (``hpcsweep.train.moe.router_stats``); for a model whose own
  code routes, from its gates alone (``hpcsweep.train.moe.own_gate_stats``).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hpcsweep.config import ModelConfig
from hpcsweep.train.moe import router_stats
from hpcsweep.train.moe.routed_tokens import RoutedTokens
from hpcsweep.train.distributed import WorldInfo, take_sums
from hpcsweep.train.moe.own_gate_stats import OwnGateStats, own_gates

log = logging.getLogger(__name__)


@dataclass
class Router:
    """One MoE layer's router and what its last training forward chose."""

    layer: int
    module: torch.nn.Module
    experts: int
    top_k: int
    logits: torch.Tensor | None = None
    """The last training forward's router logits, tokens x experts (with their graph)."""
    chosen: torch.Tensor | None = None
    """The experts each token was sent to, tokens x top_k."""
    sequences: int = 1
    """Sequences in that forward (the router's input is batch x time x hidden for DeepSeek)."""

    @property
    def bias(self) -> torch.Tensor | None:
        """DeepSeek-V3's ``e_score_correction_bias``; None for a router without one."""
        return getattr(self.module, "e_score_correction_bias", None)

    def record(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        # Only training forwards count: evaluation is not routed load to balance. A forward recomputed
        # by gradient checkpointing overwrites the record after it was taken, and the next forward
        # overwrites it again before it is read.
        if module.training:
            self.logits, self.chosen = output[0], output[2]
            hidden = args[0]
            self.sequences = hidden.shape[0] if hidden.dim() == 3 else 1


def _routers(net: torch.nn.Module) -> list[Router]:
    """The routers of ``net`` (a transformers model, under peft or not), by layer; empty when dense."""
    base = net.get_base_model() if hasattr(net, "get_base_model") else net
    recorder = getattr(base, "_can_record_outputs", None) or {}
    target = recorder.get("router_logits")
    router_class = getattr(target, "target_class", None)
    if router_class is None:
        return []
    routers = []
    for name, module in base.named_modules():
        if isinstance(module, router_class):
            layer = router_stats.layer_of(name)
            routers.append(Router(layer=len(routers) if layer is None else layer, module=module,
                                  experts=module.weight.shape[0], top_k=int(module.top_k)))
    return routers


def aux_loss_family(config: Any) -> str:
    """``switch`` (Mixtral, Qwen-MoE: transformers' ``load_balancing_loss_func``) or ``deepseek``."""
    return "switch" if hasattr(config, "router_aux_loss_coef") else "deepseek"


LORA_BIAS_ROUTER_AUX_LOSS_COEF = 0.3
"""The aux loss coefficient that null means under LoRA for a router with DeepSeek-V3's bias, whose update
is then off (docs/user/moe.md, "Under LoRA": on a LoRA trial of an 8-expert V3 folder 0.001 and 0.01
left it collapsed, 0.1 peaked just under the collapse rule, 0.3 at half the ceiling)."""


def effective_aux_loss_coef(cfg: ModelConfig, config: Any, *, bias_router: bool = False) -> float:
    """``model.moe.aux_loss_coef``, or with null the folder's own coefficient (none there: 0, off).

    Under LoRA a ``bias_router`` (DeepSeek-V3's, whose bias update is then off) gets at least
    ``LORA_BIAS_ROUTER_AUX_LOSS_COEF`` for null: the aux loss is then its only balance."""
    if cfg.moe.aux_loss_coef is not None:
        return cfg.moe.aux_loss_coef
    own = getattr(config, "router_aux_loss_coef", None) if aux_loss_family(config) == "switch" else getattr(
        config, "aux_loss_alpha", None)
    if bias_router and cfg.peft != "none":
        return max(float(own or 0.0), LORA_BIAS_ROUTER_AUX_LOSS_COEF)
    return float(own or 0.0)


def whole_rows(router: Router) -> RoutedTokens:
    """Every token of a router's record routes, each row of its forward one sequence (no batch said otherwise)."""
    tokens, rows = router.chosen.shape[0], router.sequences
    sample = torch.arange(rows, device=router.chosen.device).repeat_interleave(tokens // rows)
    return RoutedTokens(None, sample, rows)


def _weights(tokens: RoutedTokens, like: torch.Tensor) -> torch.Tensor:
    """1 for a token that routes, 0 for padding, flattened, in ``like``'s dtype and on its device."""
    if tokens.real is None:
        return torch.ones(tokens.sample.shape[0], dtype=like.dtype, device=like.device)
    return tokens.real.flatten().to(like.dtype)


def expert_counts(router: Router, tokens: RoutedTokens) -> torch.Tensor:
    """The tokens each expert of ``router``'s record got from ``tokens``' samples (padding left out), int64;
    no host sync (a weighted ``index_add_``, not a boolean selection)."""
    weights = _weights(tokens, router.chosen)
    counts = torch.zeros(router.experts, dtype=torch.int64, device=router.chosen.device)
    return counts.index_add_(0, router.chosen.flatten(), weights.repeat_interleave(router.chosen.shape[-1]))


def deepseek_aux_loss(router: Router, tokens: RoutedTokens, *, seq_aux: bool) -> torch.Tensor:
    """One layer's DeepSeek balance loss (without alpha), as their ``MoEGate`` computes it, over the
    sample tokens of ``tokens`` alone.

    Scores are the softmax of the logits (DeepSeek-MoE, V2), or for a V3 router (one with a bias) the
    sigmoid scores normalised per token (the paper's sequence-wise loss). ``f_i`` is expert i's share of
    the choices times ``experts``; the loss is ``sum_i f_i x P_i`` with ``P_i`` its mean score, per
    sequence and then averaged over the sequences with ``seq_aux`` (each packed sample one sequence,
    as it would be run alone), over the whole batch without.
    """
    logits, chosen, experts = router.logits.float(), router.chosen, router.experts
    if router.bias is not None:
        scores = logits.sigmoid()
        scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    else:
        scores = logits.softmax(dim=-1)
    weights = _weights(tokens, scores)
    sample = tokens.sample if seq_aux else torch.zeros_like(tokens.sample)
    sequences, top_k = (tokens.samples if seq_aux else 1), chosen.shape[-1]
    zeros = functools.partial(torch.zeros, dtype=scores.dtype, device=scores.device)
    size = zeros(sequences).index_add_(0, sample, weights)
    score_sums = zeros(sequences, experts).index_add_(0, sample, scores * weights[:, None])
    counts = zeros(sequences * experts).index_add_(
        0, (sample[:, None] * experts + chosen).flatten(), weights.repeat_interleave(top_k)).view(sequences, experts)
    held = size > 0  # a run of padding alone is no sequence
    size = size.clamp(min=1)[:, None]
    per_sequence = (counts / (size * top_k / experts) * score_sums / size).sum(dim=1)
    return (per_sequence * held).sum() / held.sum().clamp(min=1)


def aux_losses(routers: list[Router], config: Any, tokens: RoutedTokens | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The balance loss of one forward over ``routers``' records and ``tokens``' samples (None: every
    token, each row a sequence), without the coefficient, and each layer's own (a vector, one per router).

    DeepSeek's loss is the sum of its layers'. Switch's (Mixtral, Qwen-MoE) is taken over every layer's
    choices at once, as transformers computes it, its padding left out through the attention mask that
    function takes; a layer's own is the same function of that layer alone, a statistic only (no gradient)."""
    if aux_loss_family(config) == "switch":
        from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

        mask = None if tokens is None else tokens.real
        overall = load_balancing_loss_func(tuple(r.logits for r in routers), routers[0].experts, routers[0].top_k,
                                           mask)
        with torch.no_grad():
            per_layer = torch.stack([load_balancing_loss_func((r.logits,), r.experts, r.top_k, mask)
                                     for r in routers])
        return overall, per_layer
    seq_aux = bool(getattr(config, "seq_aux", True))
    per_layer = torch.stack([deepseek_aux_loss(r, whole_rows(r) if tokens is None else tokens, seq_aux=seq_aux)
                             for r in routers])
    return per_layer.sum(), per_layer


def aux_loss(routers: list[Router], config: Any, tokens: RoutedTokens | None = None) -> torch.Tensor:
    """The balance loss of one forward over ``routers``' records, without the coefficient."""
    return aux_losses(routers, config, tokens)[0]


@dataclass
class RouterBalance:
    """The balance of one model's routers, for the trainer: the aux loss after each training forward,
    the bias update before each optimizer step, the statistics of each log window.

    Counts are kept on the model's device, layers x experts, for the step (the bias update) and the
    log window (the statistics); neither is checkpointed: a step never spans a stop, and a window's
    statistics are only a report.
    """

    routers: list[Router]
    config: Any
    aux_loss_coef: float
    bias_update_rate: float
    step_counts: torch.Tensor = field(init=False)
    window_counts: torch.Tensor = field(init=False)
    window_aux: torch.Tensor = field(init=False)
    """The window's sum of the unweighted aux loss, its count of forwards, then each layer's sum, kept on
    the device: no host sync per micro-batch."""

    def __post_init__(self) -> None:
        device = self.routers[0].module.weight.device
        shape = (len(self.routers), max(r.experts for r in self.routers))
        self.step_counts = torch.zeros(shape, dtype=torch.int64, device=device)
        self.window_counts = torch.zeros(shape, dtype=torch.int64, device=device)
        self.window_aux = torch.zeros(2 + len(self.routers), dtype=torch.float64, device=device)
        for router in self.routers:
            router.module.register_forward_hook(router.record)

    def take_aux_loss(self, tokens: RoutedTokens | None = None) -> torch.Tensor | float:
        """After a training forward: the weighted balance loss to add to it (0.0 when off), and count
        the tokens each expert got, from ``tokens``' samples alone (``routed_tokens`` of the forward's
        batch; None: every token, each row a sequence). Call once per forward; a forward with no record
        gives 0.0."""
        if any(r.logits is None for r in self.routers):
            return 0.0
        with torch.no_grad():
            counts = torch.zeros_like(self.step_counts)
            for row, router in enumerate(self.routers):
                counts[row, : router.experts] = expert_counts(router, whole_rows(router) if tokens is None else tokens)
            self.step_counts += counts
            self.window_counts += counts
        if self.aux_loss_coef > 0:
            loss, per_layer = aux_losses(self.routers, self.config, tokens)
            weighted = self.aux_loss_coef * loss
        else:
            with torch.no_grad():
                loss, per_layer = aux_losses(self.routers, self.config, tokens)
            weighted = 0.0
        one = torch.ones(1, dtype=torch.float64, device=self.window_aux.device)
        self.window_aux += torch.cat([loss.detach().double().view(1), one, per_layer.detach().double()])
        for router in self.routers:
            router.logits = router.chosen = None
        return weighted

    def after_optimizer_step(self, world: WorldInfo, *, skipped: bool = False) -> None:
        """DeepSeek-V3's bias update from the step's tokens per expert summed over every rank (one
        all_reduce), then a fresh step. Every rank computes the same update from the same sums, so the
        replicas' biases stay equal with no broadcast. A step the fp16 scaler ``skipped`` (its gradients
        were not finite) moves no bias, as it moved no weight."""
        if self.bias_update_rate > 0 and not skipped:
            counts = self.step_counts.clone()
            if world.world_size > 1:
                dist.all_reduce(counts)
            with torch.no_grad():
                for row, router in enumerate(self.routers):
                    load = counts[row, : router.experts].float()
                    router.bias.add_(self.bias_update_rate * torch.sign(load.mean() - load))
        self.step_counts.zero_()

    def window_report(self, world: WorldInfo) -> dict[str, Any]:
        """The statistics of the log window (counts over every rank, aux loss averaged over ranks), then a fresh window.

        A collective: every rank calls it at the same step."""
        counts, aux = take_sums(world, self.window_counts, self.window_aux)
        loads = {r.layer: counts[row, : r.experts].tolist() for row, r in enumerate(self.routers)}
        sums = aux.tolist()
        forwards = sums[1]
        mean_aux = sums[0] / forwards if forwards else None
        layer_aux = {r.layer: sums[2 + row] / forwards for row, r in enumerate(self.routers)} if forwards else None
        return router_stats.window_stats(
            loads, top_k=self.routers[0].top_k, aux_loss=mean_aux, aux_loss_coef=self.aux_loss_coef,
            bias_update_rate=self.bias_update_rate, layer_aux_loss=layer_aux)


class NoBalance:
    """A dense model's (or one whose routers transformers does not record): nothing to balance or report."""

    def take_aux_loss(self, tokens: RoutedTokens | None = None) -> float:
        return 0.0

    def after_optimizer_step(self, world: WorldInfo, *, skipped: bool = False) -> None:
        pass

    def window_report(self, world: WorldInfo) -> dict[str, Any]:
        return {}


def attach(net: torch.nn.Module, cfg: ModelConfig) -> RouterBalance | OwnGateStats | NoBalance:
    """The balance of ``net``'s routers per ``cfg.moe`` (``NoBalance`` for a dense model), its hooks
    registered. A model whose own code routes (``MoEGate``s that transformers does not record) gets
    router statistics alone (``hpcsweep.train.moe.own_gate_stats``): its code trains its own balance. Call
    after LoRA is applied and before DDP or FSDP wraps the model."""
    routers = _routers(net)
    if not routers:
        gates = own_gates(net)
        config = getattr(net.get_base_model() if hasattr(net, "get_base_model") else net, "config", None)
        if gates:
            alpha = float(getattr(config, "aux_loss_alpha", 0.0) or 0.0)
            log.info("router balance: %d MoE layers routed by the model's own code, which adds its own balance "
                     "loss (aux_loss_alpha %g in its config.json); model.moe.* does not apply; router "
                     "statistics from its gates", len(gates), alpha)
            return OwnGateStats(gates, alpha)
        if any(name in type(m).__name__.lower() for m in net.modules() for name in ("moegate", "router")):
            log.warning("router balance: this model's routers are not recorded by transformers; "
                        "model.moe.* does not apply and no router statistics are kept")
        return NoBalance()
    config = (net.get_base_model() if hasattr(net, "get_base_model") else net).config
    has_bias = all(r.bias is not None for r in routers)
    rate = cfg.moe.bias_update_rate if has_bias and cfg.peft == "none" else 0.0
    coef = effective_aux_loss_coef(cfg, config, bias_router=has_bias)
    if has_bias and cfg.peft != "none":
        log.info("router balance: DeepSeek-V3's bias update is off under LoRA (the base is frozen, and an "
                 "adapter cannot carry a changed base buffer); the aux loss (coefficient %g%s) balances the "
                 "adapters' routing", coef, ", the LoRA default" if cfg.moe.aux_loss_coef is None else "")
    log.info("router balance: %d MoE layers, aux loss coefficient %g, bias update rate %g", len(routers), coef, rate)
    return RouterBalance(routers, config, aux_loss_coef=coef, bias_update_rate=rate)
