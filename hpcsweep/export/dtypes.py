"""The dtype each exported tensor is written in: the base's own, or ``--dtype``.

A trial's model is rebuilt for export in fp32 (the master weights a trial trains), but a bf16 base
should come back as bf16, not twice its size. By default every tensor takes the dtype it has in the
base folder's safetensors headers (so a tensor that transformers keeps in fp32 in a bf16 model, such
as DeepSeek-V3's router ``gate.weight`` and ``e_score_correction_bias``, stays fp32); a tensor the
base does not hold under that name takes the folder's ``dtype`` (``torch_dtype``) from config.json.
``--dtype`` casts every floating tensor to one dtype, except the modules the model class keeps in
fp32 (``_keep_in_fp32_modules_strict``, ``_keep_in_fp32_modules``) when that dtype is a half one.
A model built from the config has no folder: fp32, as it trained.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from hpcsweep.model.folder import safetensors_header

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""``--dtype`` choices and the torch dtype (``torch.<name>``) each means."""
HALF = ("bfloat16", "float16")
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def header_dtypes(folder: Path) -> dict[str, str]:
    """Tensor name -> torch dtype name (``bfloat16``) of every floating tensor in ``folder``'s safetensors."""
    dtypes: dict[str, str] = {}
    for path in sorted(folder.glob("*.safetensors")):
        header = json.loads(safetensors_header(path))
        for name, entry in header.items():
            if name != "__metadata__" and entry.get("dtype") in _SAFETENSORS_DTYPES:
                dtypes[name] = _SAFETENSORS_DTYPES[entry["dtype"]]
    return dtypes


def folder_dtype(config: Mapping[str, object], tensors: Mapping[str, str]) -> str:
    """The folder's main dtype: config.json's ``dtype`` (``torch_dtype`` before transformers 5), else
    the dtype most of its tensors have, else float32."""
    named = config.get("dtype") or config.get("torch_dtype")
    if isinstance(named, str) and named in _SAFETENSORS_DTYPES.values():
        return named
    if tensors:
        values = list(tensors.values())
        return max(set(values), key=values.count)
    return "float32"


def kept_in_fp32(name: str, modules: Iterable[str]) -> bool:
    """Whether tensor ``name`` belongs to a module the model class keeps in fp32 (matched as
    transformers matches them: a whole dotted part of the name)."""
    return any(f".{module}." in f".{name}." for module in modules)


def export_dtypes(
    names: Iterable[str], base: Mapping[str, str], main: str, override: str | None, keep_fp32: Iterable[str]
) -> dict[str, str]:
    """Tensor name -> torch dtype name to write: ``override`` (a torch dtype name) for all when given,
    fp32 kept where the model keeps it; else the base's own dtype per tensor, ``main`` for the rest."""
    keep = tuple(keep_fp32)
    chosen = {}
    for name in names:
        if override is not None:
            chosen[name] = "float32" if override in HALF and kept_in_fp32(name, keep) else override
        elif name in base:
            chosen[name] = base[name]
        else:
            chosen[name] = "float32" if main in HALF and kept_in_fp32(name, keep) else main
    return chosen


def keep_fp32_modules(model_class: type) -> list[str]:
    """The module names ``model_class`` keeps in fp32 whatever the load dtype."""
    modules: list[str] = []
    for attribute in ("_keep_in_fp32_modules_strict", "_keep_in_fp32_modules"):
        modules += list(getattr(model_class, attribute, None) or [])
    return modules


def cast_model(net, dtypes: Mapping[str, str]) -> None:
    """Cast ``net``'s floating parameters and buffers in place, each to ``dtypes[name]`` (from fp32,
    so a tensor kept in fp32 never passes through a half dtype)."""
    import torch

    for name, tensor in [*net.named_parameters(), *net.named_buffers()]:
        if tensor.is_floating_point() and name in dtypes:
            tensor.data = tensor.data.to(getattr(torch, dtypes[name]))
