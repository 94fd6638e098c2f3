"""Router statistics of a MoE model whose own code routes (a folder's ``auto_map``, such as DeepSeek-MoE-16B).

transformers records no router of such code, so ``hpcsweep.train.moe.load_balance`` finds none to balance.
Its routers are still there: DeepSeek's own code (DeepSeek-MoE, and DeepSeek-V2/V3 as their authors
ship them) names each one ``MoEGate`` and has it return ``(topk_idx, topk_weight, aux_loss)``, the
experts each token went to and, in training, the balance loss the code adds itself (``aux_loss_alpha``
times DeepSeek's loss). A forward hook on each gate keeps its last training forward's choices, so the
same statistics as for transformers' routers (``hpcsweep.train.moe.router_stats``: max/mean load, idle
experts, the aux loss, per layer and overall) reach metrics.json's ``router``, TensorBoard's ``moe/*``
and ``report --efficiency``'s collapse rule. Nothing is added to the loss here: the code trains its
own balance, with its own coefficient.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hpcsweep.train.moe import router_stats
from hpcsweep.train.distributed import WorldInfo, take_sums
from hpcsweep.train.moe.routed_tokens import RoutedTokens

GATE_CLASS = "MoEGate"
"""The class name DeepSeek's own code gives its routers."""


@dataclass
class OwnGate:
    """One MoE layer's gate and what its last training forward chose."""

    layer: int
    module: torch.nn.Module
    experts: int
    top_k: int
    chosen: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    """The code's own balance loss of that forward, its coefficient included; None when it computes none."""

    def record(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        # Training forwards only, as for transformers' routers; a recomputed forward (gradient
        # checkpointing) overwrites the record after it was taken.
        if module.training and isinstance(output, tuple) and len(output) >= 2:
            self.chosen = output[0]
            self.aux_loss = output[2] if len(output) > 2 and isinstance(output[2], torch.Tensor) else None


def own_gates(net: torch.nn.Module) -> list[OwnGate]:
    """The gates of ``net`` (under peft or not) that its own code names ``MoEGate``, by layer."""
    gates = []
    for name, module in net.named_modules():
        if type(module).__name__ != GATE_CLASS:
            continue
        experts, top_k = getattr(module, "n_routed_experts", None), getattr(module, "top_k", None)
        if not experts or not top_k:
            continue
        layer = router_stats.layer_of(name)
        gates.append(OwnGate(layer=len(gates) if layer is None else layer, module=module,
                             experts=int(experts), top_k=int(top_k)))
    return gates


@dataclass
class OwnGateStats:
    """The trainer's balance for such a model: no loss and no update of its own, the statistics of each
    log window (counts over every rank; the aux loss without its coefficient ``alpha``, as
    ``router_stats`` reports DeepSeek's)."""

    gates: list[OwnGate]
    alpha: float
    window_counts: torch.Tensor = field(init=False)
    window_aux: torch.Tensor = field(init=False)
    """Forwards with an aux loss, then each layer's sum of it (without alpha), on the device."""

    def __post_init__(self) -> None:
        device = next(self.gates[0].module.parameters()).device
        self.window_counts = torch.zeros((len(self.gates), max(g.experts for g in self.gates)), dtype=torch.int64,
                                         device=device)
        self.window_aux = torch.zeros(1 + len(self.gates), dtype=torch.float64, device=device)
        for gate in self.gates:
            gate.module.register_forward_hook(gate.record)

    def take_aux_loss(self, tokens: RoutedTokens | None = None) -> float:
        """After a training forward: count the tokens each expert got from ``tokens``' samples (None: every
        token; padding is left out); 0.0, the code adds its own loss (over every token it routes: its
        gates are not told which are padding)."""
        if any(g.chosen is None for g in self.gates):
            return 0.0
        with torch.no_grad():
            for row, gate in enumerate(self.gates):
                chosen = gate.chosen.reshape(-1, gate.top_k).to(self.window_counts.device)
                real = (torch.ones(chosen.shape[0], dtype=torch.int64, device=chosen.device) if tokens is None
                        or tokens.real is None else tokens.real.flatten().to(chosen.device, torch.int64))
                self.window_counts[row, : gate.experts] += torch.zeros(
                    gate.experts, dtype=torch.int64, device=chosen.device).index_add_(
                    0, chosen.flatten(), real.repeat_interleave(gate.top_k))
            if self.alpha > 0 and all(g.aux_loss is not None for g in self.gates):
                layers = torch.stack([g.aux_loss.detach().double().to(self.window_aux.device) for g in self.gates])
                self.window_aux += torch.cat([torch.ones(1, dtype=torch.float64, device=self.window_aux.device),
                                              layers / self.alpha])
        for gate in self.gates:
            gate.chosen = gate.aux_loss = None
        return 0.0

    def after_optimizer_step(self, world: WorldInfo, *, skipped: bool = False) -> None:
        pass  # no bias to update: the code's gates have none that hpcsweep moves

    def window_report(self, world: WorldInfo) -> dict[str, Any]:
        """The log window's statistics, then a fresh window. A collective: every rank calls it at the same step."""
        counts, aux = take_sums(world, self.window_counts, self.window_aux)
        loads = {g.layer: counts[row, : g.experts].tolist() for row, g in enumerate(self.gates)}
        sums = aux.tolist()
        forwards = sums[0]
        layer_aux = {g.layer: sums[1 + row] / forwards for row, g in enumerate(self.gates)} if forwards else None
        return router_stats.window_stats(
            loads, top_k=self.gates[0].top_k, aux_loss=sum(layer_aux.values()) if layer_aux else None,
            aux_loss_coef=self.alpha, bias_update_rate=0.0, layer_aux_loss=layer_aux)
