"""Model code a folder ships (``auto_map``, ``model.trust_remote_code``) that was written for
transformers 4, run under transformers 5.

DeepSeek-MoE-16B's ``modeling_deepseek.py``, the headline model of this product, fails under
transformers 5 in five ways, each seen with that code:

1. it imports ``is_torch_fx_available`` from ``transformers.utils.import_utils``, which transformers 5
   removed: an ``ImportError`` before the model exists;
2. transformers 5 standardises a config's rope settings, so ``rope_scaling: null`` reads back as
   ``{"rope_theta": ..., "rope_type": "default"}``; the code takes any non-None ``rope_scaling`` for a
   scaling and looks up its ``["type"]``: a ``KeyError`` while the attention layers are built (told
   apart from code written for transformers 5 by what its source reads, ``reads_legacy_rope``);
3. with its config's ``use_cache: true`` the forward wraps the past in
   ``DynamicCache.from_legacy_cache``, which transformers 5 removed: an error at the first step;
4. transformers 5 reads a model's ``_tied_weights_keys`` as a mapping (tied weight -> its source);
   that code declares a list, as transformers 4 did: ``save_pretrained`` (a merged or full export)
   fails with ``'list' object has no attribute 'keys'``;
5. silently: transformers 5's ``from_pretrained`` builds the model on the meta device and gives the
   buffers that are no part of the weights (``persistent=False``: the rotary embedding's ``inv_freq``,
   ``cos_cached``, ``sin_cached``) uninitialised memory, counting on the model's ``_init_weights`` to
   compute them again, as transformers' own models do and code written for transformers 4 does not.
   The model then trains on garbage positions (NaN under ``torch.use_deterministic_algorithms``, which
   fills uninitialised memory with NaN; whatever the allocator held otherwise).

Each fix below gives such code back what transformers 4 gave it, and only for a folder that ships
its own code; a model transformers implements itself is never touched. Training reads no cache, so
the third costs nothing; the fifth builds the model once more with its parameters on the meta
device (no memory, ``accelerate.init_empty_weights``) to take the buffers its own code computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _no_torch_fx() -> bool:
    # transformers 4 answered whether torch.fx could trace; False skips the code's optional
    # ``torch.fx.wrap`` of its mask helper, which only tracing needs.
    return False


def provide_removed_names() -> None:
    """Give ``transformers.utils`` (and its ``import_utils``) back the names transformers 5 removed that
    remote model code imports at its top. Idempotent; a name transformers still has is kept."""
    import transformers.utils as utils
    import transformers.utils.import_utils as import_utils

    for module in (import_utils, utils):
        if not hasattr(module, "is_torch_fx_available"):
            module.is_torch_fx_available = _no_torch_fx


def legacy_rope_scaling(rope: dict[str, Any] | None) -> dict[str, Any] | None:
    """``rope_scaling`` as transformers 4 handed it to model code: None for plain rotary embeddings
    (transformers 5's ``rope_type: default``), else the scaling with its type also under ``type``,
    the key such code reads."""
    if not rope:
        return None
    kind = rope.get("type", rope.get("rope_type"))
    if kind in (None, "default"):
        return None
    return {**rope, "type": kind}


def model_code_source(config: Any) -> str:
    """The text of the ``.py`` file its ``auto_map`` names for the causal LM, in the folder the config
    was read from (``_name_or_path``); empty when there is none to read."""
    target = (getattr(config, "auto_map", None) or {}).get("AutoModelForCausalLM")
    target = target[0] if isinstance(target, (list, tuple)) else target
    folder = getattr(config, "_name_or_path", "") or ""
    if not isinstance(target, str) or "." not in target or "--" in target or not folder:
        return ""
    path = Path(folder) / f"{target.rsplit('.', 1)[0]}.py"
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""


def reads_legacy_rope(source: str) -> bool:
    """Whether model code reads rope settings as transformers 4 gave them: it names ``rope_scaling`` and
    never ``rope_parameters`` (code written for transformers 5, such as a subclass of its own models,
    reads ``rope_parameters`` and must keep it as transformers 5 made it)."""
    return "rope_scaling" in source and "rope_parameters" not in source


def prepare_remote_config(config: Any) -> Any:
    """``config``, read from a folder whose model is its own code, made what that code expects (the
    module docstring's 2 and 3), in place; returned. A config transformers knows is returned as it is."""
    if not getattr(config, "auto_map", None):
        return config
    if reads_legacy_rope(model_code_source(config)):
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
        for key in ("rope_parameters", "rope_scaling"):
            if hasattr(config, key):
                setattr(config, key, legacy_rope_scaling(rope))
    config.use_cache = False
    return config


def restore_computed_buffers(model: Any, config: Any, dtype: Any) -> list[str]:
    """Give ``model`` (loaded by ``from_pretrained`` from a folder with its own code) the values its own
    code computes for its non-persistent buffers (the module docstring's 5), built from ``config`` at
    ``dtype`` as transformers 4's loading built them; returns the buffers' names."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    names = [name for name, _ in model.named_non_persistent_buffers()]
    if not names:
        return names
    with init_empty_weights(include_buffers=False):
        fresh = AutoModelForCausalLM.from_config(config, trust_remote_code=True, dtype=dtype)
    computed = dict(fresh.named_buffers())
    with torch.no_grad():
        for name in names:
            module_name, _, buffer_name = name.rpartition(".")
            module = model.get_submodule(module_name) if module_name else model
            old = getattr(module, buffer_name)
            module.register_buffer(buffer_name, computed[name].to(device=old.device), persistent=False)
    return names


def tied_weights_as_mapping(model: Any) -> None:
    """Each module of ``model`` whose ``_tied_weights_keys`` is transformers 4's list gets transformers 5's
    mapping on the instance (the module docstring's 4): with ``tie_word_embeddings`` every listed weight
    names the input embedding's as its source; without, nothing is tied and the mapping is empty."""
    tie = bool(getattr(model.config, "tie_word_embeddings", False))
    embedding = model.get_input_embeddings().weight if tie else None
    for module in model.modules():
        keys = getattr(module, "_tied_weights_keys", None)
        if not isinstance(keys, (list, tuple)):
            continue
        source = next((name for name, param in module.named_parameters() if param is embedding), None)
        module._tied_weights_keys = {key: source for key in keys} if tie and source else {}
