"""Expert LoRA: peft's adapters on fused weights, computed as ``x·Aᵀ·Bᵀ`` beside the frozen product, never folded.

transformers 5 stores a MoE layer's routed experts fused, as ``mlp.experts.gate_up_proj`` ``[E, 2I, h]`` and
``mlp.experts.down_proj`` ``[E, h, I]``. peft adapts such a tensor with a ``ParamWrapper`` (``target_parameters``),
whose forward registers ``W + s·B·A`` over every expert as a parametrization of the tensor the experts' forward
reads. That fold is a tensor the size of the whole expert stack at each forward, and because it needs a gradient,
the backward computes the full expert weight gradient, as full fine-tuning does.

``use_grouped_forward(net)`` gives each outermost ``ParamWrapper`` of a peft model the class
``GroupedLoraParamWrapper``: a subclass with peft's own parameters, names, ``state_dict``, save, load and merge,
that replaces only the forward, and only while one adapter is active and unmerged (else peft's forward runs):

- over a routed-experts module: the tokens are sorted by expert, and for each expert ``e`` with tokens the
  frozen ``x·W_eᵀ`` runs beside ``s·(dropout(x)·A_eᵀ)·B_eᵀ``, for ``gate_up_proj`` and then ``down_proj``; the
  outputs are weighted by the router and summed per token, as transformers' experts implementations do. ``A_e``
  and ``B_e`` are views of peft's ``lora_A``/``lora_B`` weights in peft's layout (``ParamWrapper.get_delta_factors``),
  so the frozen ``W`` gets no gradient and nothing of its size is built;
- over an ``nn.Linear`` (the dense and shared-expert MLP linears, which ``hpcsweep.train.lora`` has to name by
  parameter, see there): ``x·Wᵀ + s·B(A(dropout(x)))``, which is peft's ``lora.Linear`` forward.

Dropout is each wrapper's ``lora_dropout`` module, applied to the adapter's input as peft's ``lora.Linear`` does
(peft's own ``ParamWrapper`` refuses dropout: its fold cannot apply it per token).

Written here because neither package does it: peft (0.21) reaches fused experts only through the fold, and
transformers' experts implementations (``eager``, ``batched_mm``, ``grouped_mm`` in ``integrations/moe.py``) take
one weight per expert, with no place for a low-rank term. The loop over experts is transformers' ``eager`` one:
one host sync per layer for the token counts; each expert's rows are a contiguous slice after the sort.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import ParamWrapper

EXPERT_TENSORS = ("gate_up_proj", "down_proj")
"""The fused parameters of a transformers experts module (``[E, out, in]`` each), in the order they run."""


class GroupedLoraParamWrapper(ParamWrapper):
    """peft's ``ParamWrapper``, whose forward runs the adapter beside the frozen weight instead of folding it in.

    Set as the class of a built wrapper by ``use_grouped_forward``; everything but ``forward`` is peft's.
    """

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        chain = _unfolded_chain(self, kwargs)
        if chain is None:
            return super().forward(x, *args, **kwargs)
        adapter, wrappers, base = chain
        if isinstance(base, torch.nn.Linear):
            return _linear_forward(wrappers["weight"], adapter, base, x)
        return experts_forward(
            base, x, *args, **kwargs,
            adapters={name: ExpertFactors(wrapper, adapter) for name, wrapper in wrappers.items()},
        )


def use_grouped_forward(net: torch.nn.Module) -> int:
    """Give every outermost ``ParamWrapper`` in ``net`` the grouped forward; return how many got it.

    Nested wrappers (one per targeted parameter of a module) are run by the outermost one, so only it changes.
    """
    inner = {id(m.base_layer) for m in net.modules() if isinstance(m, ParamWrapper)}
    outermost = [m for m in net.modules() if isinstance(m, ParamWrapper) and id(m) not in inner]
    for wrapper in outermost:
        wrapper.__class__ = GroupedLoraParamWrapper
    return len(outermost)


class ExpertFactors:
    """One wrapper's adapter as per-expert views of peft's weights: ``lora_A`` ``[E·r, in]`` is ``E`` blocks
    ``[r, in]``; ``lora_B`` ``[out, r·E]`` holds expert ``e`` in columns ``e, e+E, ...`` (peft's layout).

    ``unbind`` keeps the views in one autograd node, whose backward stacks the experts' gradients once.
    """

    def __init__(self, wrapper: ParamWrapper, adapter: str) -> None:
        experts = wrapper.num_experts
        weight_a = wrapper.lora_A[adapter].weight
        weight_b = wrapper.lora_B[adapter].weight
        self.a = weight_a.reshape(experts, -1, weight_a.shape[-1]).unbind(0)
        self.b = weight_b.reshape(weight_b.shape[0], -1, experts).unbind(-1)
        self.dropout = wrapper.lora_dropout[adapter]
        self.scaling = wrapper.scaling[adapter]

    def __call__(self, x: torch.Tensor, expert: int) -> torch.Tensor:
        """``s·B_e·A_e`` applied to ``x`` (the rows routed to ``expert``), in ``x``'s dtype."""
        a = self.a[expert]
        low_rank = F.linear(self.dropout(x.to(a.dtype)), a)
        return (F.linear(low_rank, self.b[expert]) * self.scaling).to(x.dtype)


def experts_forward(
    experts: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    *,
    adapters: dict[str, ExpertFactors],
) -> torch.Tensor:
    """A transformers experts module's forward (``[tokens, h]`` in and out) with ``adapters`` (by tensor name,
    ``gate_up_proj``/``down_proj``) added to each expert's products on the rows routed to it."""
    num_tokens, top_k = top_k_index.shape
    expert_ids = top_k_index.reshape(-1)
    order = torch.argsort(expert_ids, stable=True)
    rows = hidden_states[order // top_k]
    counts = torch.bincount(expert_ids, minlength=experts.num_experts).tolist()
    gate_up, down = adapters.get("gate_up_proj"), adapters.get("down_proj")
    outputs = []
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        x = rows[start : start + count]
        start += count
        hidden = F.linear(x, experts.gate_up_proj[expert])
        if gate_up is not None:
            hidden = hidden + gate_up(x, expert)
        hidden = experts._apply_gate(hidden)
        out = F.linear(hidden, experts.down_proj[expert])
        if down is not None:
            out = out + down(hidden, expert)
        outputs.append(out)
    if not outputs:  # no tokens at all
        return torch.zeros_like(hidden_states)
    weighted = torch.cat(outputs) * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    per_choice = weighted[torch.argsort(order)]  # back to (token, choice) order
    return per_choice.view(num_tokens, top_k, -1).sum(dim=1).to(hidden_states.dtype)


def _linear_forward(wrapper: ParamWrapper, adapter: str, base: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    result = base(x)
    lora_a, lora_b = wrapper.lora_A[adapter], wrapper.lora_B[adapter]
    low_rank = lora_a(wrapper.lora_dropout[adapter](x.to(lora_a.weight.dtype)))
    return result + (lora_b(low_rank) * wrapper.scaling[adapter]).to(result.dtype)


def _unfolded_chain(
    outer: ParamWrapper, kwargs: dict[str, Any]
) -> tuple[str, dict[str, ParamWrapper], torch.nn.Module] | None:
    """``(adapter, wrappers by parameter name, base module)`` when the grouped forward applies to ``outer``'s
    chain of nested wrappers, else None (peft's forward then runs: adapters off, merged, several active,
    mixed batches, or a module layout this forward does not know)."""
    if kwargs.get("adapter_names") is not None or len(outer.active_adapters) != 1:
        return None
    adapter = outer.active_adapters[0]
    wrappers: dict[str, ParamWrapper] = {}
    module: torch.nn.Module = outer
    while isinstance(module, ParamWrapper):
        if module.disable_adapters or module.merged or adapter not in module.lora_A:
            return None
        wrappers[module.parameter_name] = module
        module = module.base_layer
    if isinstance(module, torch.nn.Linear):
        return (adapter, wrappers, module) if set(wrappers) == {"weight"} else None
    if _plain_fused_experts(module) and set(wrappers) <= set(EXPERT_TENSORS):
        # peft's factors are (experts, out, in) only when it swapped its in/out for this layout.
        if all(w._did_swap_in_out_features and w.num_experts == module.num_experts for w in wrappers.values()):
            return adapter, wrappers, module
    return None


def _plain_fused_experts(module: torch.nn.Module) -> bool:
    """A transformers experts module in the layout ``experts_forward`` computes: gated, ``[E, out, in]``, no
    bias, no norm after the experts, every expert on this rank."""
    return (
        hasattr(module, "_apply_gate")
        and all(getattr(module, name, None) is not None and getattr(module, name).dim() == 3 for name in EXPERT_TENSORS)
        and getattr(module, "has_gate", False)
        and not getattr(module, "is_transposed", True)
        and not getattr(module, "has_bias", True)
        and not getattr(module, "has_post_expert_norm", True)
        and not getattr(module, "_is_expert_parallel", True)
    )
