"""Expert LoRA: peft's adapters on fused weights, computed as ``x·Aᵀ·Bᵀ`` beside the frozen product, never folded.

transformers 5 stores a MoE layer's routed experts fused, as ``mlp.experts.gate_up_proj`` ``[E, 2I, h]`` and
``mlp.experts.down_proj`` ``[E, h, I]``. peft adapts such a tensor with a ``ParamWrapper`` (``target_parameters``),
whose forward registers ``W + s·B·A`` over every expert as a parametrization of the tensor the experts' forward
reads. That fold is a tensor the size of the whole expert stack at each forward, and because it needs a gradient,
the backward computes the full expert weight gradient, as full fine-tuning does.

``use_grouped_forward(net)`` gives each outermost ``ParamWrapper`` of a peft model the class
``GroupedLoraParamWrapper``: a subclass with peft's own parameters, names, ``state_dict``, save, load and merge,
that replaces only the forward, and only while one adapter is active and unmerged (else peft's forward runs):

- over a routed-experts module: transformers' ``grouped_mm`` experts forward with a low-rank term. The
  (token, choice) rows are sorted by expert; the frozen ``x·W_eᵀ`` of every expert is one ``torch._grouped_mm``
  over them, as transformers runs it (the same kernel full fine-tuning uses), and the adapter's
  ``s·(dropout(x)·A_eᵀ)·B_eᵀ`` two more over the same rows (``ExpertFactors``), for ``gate_up_proj`` and then
  ``down_proj``; the outputs are weighted by the router and summed per token. ``A`` is a view of peft's
  ``lora_A`` weight; ``B`` is copied out of peft's layout into ``[E, r, out]`` at each forward (the size of the
  adapter: no view of it fits a grouped GEMM). The frozen ``W`` gets no gradient and nothing of its size is
  built. No loop over experts in Python and no host sync: the group offsets are a tensor (``searchsorted``);
- over an ``nn.Linear`` (the dense and shared-expert MLP linears, which ``hpcsweep.train.lora`` has to name by
  parameter, see there): ``x·Wᵀ + s·B(A(dropout(x)))``, which is peft's ``lora.Linear`` forward.

Dropout is each wrapper's ``lora_dropout`` module, applied to the adapter's input as peft's ``lora.Linear`` does
(peft's own ``ParamWrapper`` refuses dropout: its fold cannot apply it per token).

``torch._grouped_mm`` runs where the device and dtype have a kernel (CPU from torch 2.9, CUDA from compute
capability 8.0; fp32, bf16, fp16) and every operand's non-unit stride is a multiple of 16 bytes: the rank is
padded with zero rows to a multiple of 4 (fp32) or 8 (16-bit), which adds nothing. Elsewhere (float64, odd
widths, older GPUs) every product is a zero-padded ``bmm`` over ``[E, most rows of an expert, in]``, whose
size is that path's one host sync per product. The adapters compute in autocast's dtype where autocast is on
(``torch._grouped_mm`` is not an autocast op), else in their weights'.

Written here because neither package does it: peft (0.21) reaches fused experts only through the fold, and
transformers' experts implementations (``eager``, ``batched_mm``, ``grouped_mm`` in ``integrations/moe.py``) take
one weight per expert, with no place for a low-rank term.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import ParamWrapper

from hpcsweep.model.lora_targets import EXPERT_TENSORS


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
    """One wrapper's adapter as grouped-GEMM operands: ``lora_A`` ``[E·r, in]`` is ``E`` blocks ``[r, in]``;
    ``lora_B`` ``[out, r·E]`` holds expert ``e`` in columns ``e, e+E, ...`` (peft's layout), which no view can
    give a grouped GEMM (neither ``r`` nor ``out`` is contiguous), so ``B`` is copied to ``[E, r, out]`` at each
    forward: one copy of the adapter's size, kept for the backward (``hpcsweep.memory_plan.plan`` counts it)."""

    def __init__(self, wrapper: ParamWrapper, adapter: str) -> None:
        self.experts = wrapper.num_experts
        self.weight_a = wrapper.lora_A[adapter].weight
        self.weight_b = wrapper.lora_B[adapter].weight
        self.dropout = wrapper.lora_dropout[adapter]
        self.scaling = wrapper.scaling[adapter]

    def __call__(self, x: torch.Tensor, groups: Groups) -> torch.Tensor:
        """``s·B_e·A_e·dropout(x_i)`` for every row ``x_i`` of ``x`` (sorted by expert, ``groups``), in the
        adapter's compute dtype: autocast's where it is on, else the adapter weights'."""
        dtype = _compute_dtype(x, self.weight_a.dtype)
        a, b = self.operands(dtype)
        low_rank = grouped_mm(self.dropout(x.to(dtype)), a.transpose(1, 2), groups)
        return grouped_mm(low_rank * self.scaling, b, groups)

    def operands(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``A`` as ``[E, r', in]`` and ``B`` as ``[E, r', out]`` in ``dtype``, ``r'`` the rank rounded up to
        what the grouped GEMM's 16-byte strides need (zero rows, which add nothing)."""
        experts, rank = self.experts, self.weight_a.shape[0] // self.experts
        a = self.weight_a.reshape(experts, rank, -1)
        b = self.weight_b.reshape(self.weight_b.shape[0], rank, experts).permute(2, 1, 0)
        padding = -rank % _alignment_elements(dtype)
        if padding:
            a, b = F.pad(a, (0, 0, 0, padding)), F.pad(b, (0, 0, 0, padding))
        return a.to(dtype), b.to(dtype).contiguous()


@dataclass(frozen=True)
class Groups:
    """Rows sorted by expert: ``offsets[e]`` is the end of expert ``e``'s rows (int32, as ``torch._grouped_mm``
    takes them), ``expert_ids`` each row's expert (for the padded fallback)."""

    offsets: torch.Tensor
    expert_ids: torch.Tensor

    @classmethod
    def of(cls, sorted_ids: torch.Tensor, experts: int) -> Groups:
        """From the rows' sorted expert ids, without a host sync (``searchsorted``, not ``bincount``)."""
        bounds = torch.arange(experts, device=sorted_ids.device, dtype=sorted_ids.dtype)
        return cls(torch.searchsorted(sorted_ids, bounds, right=True).to(torch.int32), sorted_ids)


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, groups: Groups) -> torch.Tensor:
    """``x[i] @ weight[e_i]`` for every row ``i`` of ``x`` (``[rows, k]``, sorted by expert; ``weight``
    ``[E, k, n]``), in ``x``'s dtype: ``torch._grouped_mm``, transformers' ``grouped_mm`` experts kernel,
    where this device and dtype have it and the operands meet its stride rules, else a padded ``bmm``."""
    weight = weight.to(x.dtype)
    if _grouped_mm_fits(x, weight):
        return _GROUPED_MM(x, weight, offs=groups.offsets)
    return _padded_bmm(x, weight, groups)


def _padded_bmm(x: torch.Tensor, weight: torch.Tensor, groups: Groups) -> torch.Tensor:
    """The fallback: every expert's rows into ``[E, capacity, k]`` (zero padded), one ``bmm``, the rows taken
    back. Its capacity (the most rows any expert has) is the one host sync of this path."""
    experts = weight.shape[0]
    ends = groups.offsets.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    capacity = int(counts.max()) if x.shape[0] else 0
    position = torch.arange(x.shape[0], device=x.device) - (ends - counts)[groups.expert_ids]
    slots = groups.expert_ids * capacity + position
    padded = x.new_zeros(experts * capacity, x.shape[1]).index_copy(0, slots, x)
    out = torch.bmm(padded.view(experts, capacity, -1), weight)
    return out.reshape(experts * capacity, -1).index_select(0, slots)


_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _alignment_elements(dtype: torch.dtype) -> int:
    """Elements in 16 bytes: ``torch._grouped_mm`` wants every operand's non-unit stride a multiple of them."""
    return max(1, 16 // dtype.itemsize)


def _grouped_mm_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` runs ``x @ weight`` forward and backward: it has a kernel for this device
    and dtype, the rows are contiguous, both widths (``k``, ``n``) are whole 16 bytes (the backward's gradients
    have those strides), ``weight`` has one of its last two dimensions contiguous, and both start 16-aligned."""
    if _GROUPED_MM is None or not _grouped_mm_runs(x.device, x.dtype):
        return False
    align = _alignment_elements(x.dtype)
    rows, cols = weight.stride(1), weight.stride(2)
    k, n = weight.shape[1], weight.shape[2]
    return (
        x.is_contiguous() and k % align == 0 and n % align == 0
        and ((cols == 1 and rows % align == 0) or (rows == 1 and cols % align == 0))
        and x.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0
    )


@functools.cache
def _grouped_mm_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` has a kernel for ``device`` and ``dtype`` (asked once each, by running it:
    CPU has one from torch 2.9, CUDA from compute capability 8.0, and only for fp32, bf16 and fp16)."""
    try:
        x = torch.ones(4, 8, device=device, dtype=dtype)
        _GROUPED_MM(x, torch.ones(2, 8, 8, device=device, dtype=dtype),
                    offs=torch.tensor([1, 4], device=device, dtype=torch.int32))
    except (RuntimeError, NotImplementedError):
        return False
    return True


def _compute_dtype(x: torch.Tensor, weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype an adapter computes in: autocast's on ``x``'s device where it is on (``torch._grouped_mm``
    is not autocast's, so this does what autocast did for the ``F.linear`` of peft's ``lora.Linear``), else
    the adapter weights'."""
    kind = x.device.type
    autocast = torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind)
    return torch.get_autocast_dtype(kind) if autocast else weight_dtype


def experts_forward(
    experts: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    *,
    adapters: dict[str, ExpertFactors],
) -> torch.Tensor:
    """A transformers experts module's forward (``[tokens, h]`` in and out) with ``adapters`` (by tensor name,
    ``gate_up_proj``/``down_proj``) added to each expert's products on the rows routed to it.

    transformers' ``grouped_mm_experts_forward`` with a low-rank term: the (token, choice) rows sorted by
    expert, the frozen products as its ``torch._grouped_mm`` calls on the weights' dtype, each adapter's as
    two more over the same rows (``ExpertFactors``) added in place; no loop over experts, no host sync."""
    num_tokens, top_k = top_k_index.shape
    if top_k_index.numel() == 0:
        return torch.zeros_like(hidden_states)
    sorted_ids, order = torch.sort(top_k_index.reshape(-1), stable=True)
    groups = Groups.of(sorted_ids, experts.num_experts)
    rows = hidden_states[order // top_k]
    gate_up, down = (adapters.get(name) for name in EXPERT_TENSORS)
    # The frozen products' outputs are not saved for their backward: adding the adapter's in place is safe.
    hidden = grouped_mm(rows.to(experts.gate_up_proj.dtype), experts.gate_up_proj.transpose(1, 2), groups)
    if gate_up is not None:
        hidden += gate_up(rows, groups).to(hidden.dtype)
    hidden = experts._apply_gate(hidden)
    out = grouped_mm(hidden.to(experts.down_proj.dtype), experts.down_proj.transpose(1, 2), groups)
    if down is not None:
        out += down(hidden, groups).to(out.dtype)
    weighted = out * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    per_choice = weighted[back]  # (token, choice) order again
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
