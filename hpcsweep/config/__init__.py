"""One dataclass per config group, each field documented, each checked in ``__post_init__``.

These dataclasses hold every default; Hydra composes the presets of ``configs/`` over them
(``config_defaults``), and ``trial_config_from_dict`` turns the composed mapping
into these dataclasses. Every error is a ``ValueError`` that names the key (``model.lr``), the value,
and what is allowed, so a bad sweep stops on the login node before anything is submitted.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal


def _fail(key: str, value: Any, allowed: str) -> typing.NoReturn:
    raise ValueError(f"{key}={value!r} is not allowed: {allowed}")


def _check_type(key: str, value: Any, annotation: Any) -> Any:
    """Return ``value`` if it fits ``annotation`` (ints are accepted as floats), else raise."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        choices = typing.get_args(annotation)
        if value not in choices:
            _fail(key, value, "one of " + ", ".join(repr(c) for c in choices))
        return value
    if origin in (typing.Union, types.UnionType):
        mappings = [o for o in typing.get_args(annotation) if typing.get_origin(o) is dict]
        if isinstance(value, Mapping) and len(mappings) == 1:
            # A mapping can only be the mapping option: its own error names the entry at fault.
            return _check_type(key, value, mappings[0])
        errors = []
        for option in typing.get_args(annotation):
            try:
                return _check_type(key, value, option)
            except ValueError as err:
                errors.append(str(err).split(" is not allowed: ", 1)[1])
        _fail(key, value, " or ".join(errors))
    if annotation is type(None):
        if value is not None:
            _fail(key, value, "null")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(key, value, "a number")
        return float(value)
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(key, value, "an integer")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            _fail(key, value, "true or false")
        return value
    if annotation is str:
        if not isinstance(value, str):
            _fail(key, value, "a string")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            _fail(key, value, "a list")
        (item_type,) = typing.get_args(annotation)
        return [_check_type(f"{key}[{i}]", v, item_type) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            _fail(key, value, "a mapping")
        _, value_type = typing.get_args(annotation)
        return {str(k): _check_type(f"{key}.{k}", v, value_type) for k, v in value.items()}
    if dataclasses.is_dataclass(annotation):
        # A nested group (model.lora): its keys are checked as a group's are, named from the top.
        if isinstance(value, annotation):
            return value
        if not isinstance(value, Mapping):
            _fail(key, value, f"a mapping of {key} keys")
        return build_group(annotation, key, value)
    raise TypeError(f"{key}: unsupported annotation {annotation!r}")


@functools.cache
def _schema(cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    # Resolving the annotations costs more than checking a trial's values: a 1,000-trial sweep
    # validates each group 1,000 times.
    return typing.get_type_hints(cls), frozenset(f.name for f in dataclasses.fields(cls) if f.init)


def group_keys(cls: type) -> list[str]:
    """The keys of config dataclass ``cls``, sorted; a nested group's as ``lora`` and ``lora.r``, ...."""
    hints, fields = _schema(cls)
    keys = []
    for name in sorted(fields):
        keys.append(name)
        if dataclasses.is_dataclass(hints[name]):
            keys.extend(f"{name}.{sub}" for sub in group_keys(hints[name]))
    return keys


def build_group(cls: type, group: str, values: Mapping[str, Any]) -> Any:
    """Build dataclass ``cls`` for config group ``group`` (``model``, or nested: ``model.lora``)
    from a plain mapping.

    Unknown keys and values of the wrong type raise ``ValueError`` naming ``group.key``.
    """
    hints, fields = _schema(cls)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(unknown_key_message(f"{group}.{unknown[0]}", {group: group_keys(cls)}, ()))
    checked = {
        name: _check_type(f"{group}.{name}", value, hints[name]) for name, value in values.items()
    }
    return cls(**checked)


def unknown_key_message(
    key: str, keys: Mapping[str, Sequence[str]] | None = None, free_mappings: Iterable[str] | None = None
) -> str | None:
    """Why ``key`` (``model.lrr``) is not a config key, with the closest one; None when it is one.

    The one wording of an unknown key, wherever it is found: on the command line before Hydra
    starts (``hpcsweep.sweep.override_keys``), or in a composed config (``build_group``,
    ``trial_config_from_dict``). ``keys`` maps each group to its keys (default: every group's);
    under a key in ``free_mappings`` (``nccl.overrides``) any sub-key is allowed. Hydra's own
    namespace and config-group choices (``hydra/launcher``) are Hydra's business.
    """
    keys = config_keys() if keys is None else keys
    free = mapping_keys() if free_mappings is None else set(free_mappings)
    if key == "hydra" or key.startswith(("hydra.", "hydra/")) or "/" in key:
        return None
    # The longest group that prefixes the key: a nested group (model.lora) has keys of its own.
    group = max((g for g in keys if key.startswith(f"{g}.")), key=len, default=key.partition(".")[0])
    rest = key[len(group) + 1 :]
    if not rest and group in keys:
        return None  # a config-group choice: model=llama_small
    if group in keys and rest in keys[group]:
        return None  # a key, or a nested group's key (model.lora.r)
    if group in keys and rest.split(".")[0] in keys[group]:
        first = f"{group}.{rest.split('.')[0]}"
        if "." not in rest or first in free:
            return None
    dotted = [f"{g}.{name}" for g, names in keys.items() for name in names]
    last = key.rsplit(".", 1)[-1]
    guesses = [k for k in dotted if k.rsplit(".", 1)[-1] == last]
    if not guesses and group in keys:
        # Within a known group compare the names alone: a shared "model." would match anything.
        guesses = [f"{group}.{name}" for name in difflib.get_close_matches(rest, keys[group], n=1)]
    elif not guesses:
        guesses = difflib.get_close_matches(key, dotted, n=1)
    hint = f"; did you mean {guesses[0]}?" if guesses else ""
    scope = (
        f"keys of {group}: " + ", ".join(keys[group]) if group in keys else "config groups: " + ", ".join(keys)
    )
    return f"{key} is not a config key{hint} ({scope})"


def _require(condition: bool, key: str, value: Any, allowed: str) -> None:
    if not condition:
        _fail(key, value, allowed)


@dataclass(kw_only=True)
class LoraConfig:
    """LoRA adapters through ``peft`` (``model.peft=lora``; see ``hpcsweep.train.lora``)."""

    r: int = 16
    """Rank of each adapter (its ``A`` is r x in, its ``B`` out x r)."""
    alpha: float = 32.0
    """Scale: an adapter adds ``alpha / r`` times ``B @ A`` to its layer's output."""
    dropout: float = 0.0
    """Dropout on each adapter's input."""
    target_modules: list[str] | None = None
    """Names of the modules that get adapters (peft's ``target_modules``: a name matches a module
    whose own name or dotted tail equals it). null: every linear layer of attention and of the MLPs,
    named for the model's architecture (``hpcsweep.model.lora_targets.DEFAULT_LORA_TARGETS``)."""
    experts: bool = True
    """Whether a MoE model's routed experts get adapters too: a rank-r adapter per expert on its fused
    ``gate_up_proj`` and ``down_proj``, run on the tokens routed to it (``hpcsweep.train.expert_lora``).
    false: only ``target_modules`` (attention, dense and shared-expert MLPs) train."""

    def __post_init__(self) -> None:
        _require(self.r >= 1, "model.lora.r", self.r, "an integer >= 1, e.g. 16")
        _require(self.alpha > 0, "model.lora.alpha", self.alpha, "a number > 0, e.g. 2 x model.lora.r")
        _require(0.0 <= self.dropout < 1.0, "model.lora.dropout", self.dropout, "0 <= dropout < 1")
        _require(
            self.target_modules is None or (len(self.target_modules) > 0 and all(self.target_modules)),
            "model.lora.target_modules",
            self.target_modules,
            "null (every attention and MLP linear layer) or a non-empty list of module names, e.g. [q_proj, o_proj]",
        )


@dataclass(kw_only=True)
class MoeConfig:
    """Router balance of a MoE model (``hpcsweep.train.moe_balance``; docs/user/moe.md). A dense model ignores it."""

    aux_loss_coef: float | None = None
    """Weight of the auxiliary balance loss added to the training loss, as the architecture's authors
    define it (DeepSeek-MoE/V2/V3: the sequence-wise loss of ``aux_loss_alpha`` and ``seq_aux``; Mixtral
    and Qwen-MoE: transformers' ``load_balancing_loss_func``). null: the folder's own value
    (``aux_loss_alpha`` or ``router_aux_loss_coef`` in its config.json; none there: off), and under
    ``model.peft=lora`` for a router with DeepSeek-V3's bias at least 0.3 (its bias update is then off;
    ``moe_balance.LORA_BIAS_ROUTER_AUX_LOSS_COEF``); 0: off."""
    bias_update_rate: float = 0.001
    """DeepSeek-V3's aux-loss-free balance (routers with an ``e_score_correction_bias``): before each
    optimizer step each expert's bias moves by this much toward the mean load (its tokens summed over
    every rank). DeepSeek-V3's paper uses 0.001; 0: off. Off under ``model.peft=lora`` (the base is frozen;
    the aux loss stands in for it)."""

    def __post_init__(self) -> None:
        _require(
            self.aux_loss_coef is None or (math.isfinite(self.aux_loss_coef) and self.aux_loss_coef >= 0),
            "model.moe.aux_loss_coef", self.aux_loss_coef,
            "null (the model folder's own value), 0 (off) or a number > 0, e.g. 0.001",
        )
        _require(
            math.isfinite(self.bias_update_rate) and self.bias_update_rate >= 0,
            "model.moe.bias_update_rate", self.bias_update_rate, "0 (off) or a number > 0, e.g. 0.001",
        )


@dataclass(kw_only=True)
class ModelConfig:
    """A causal LM built from a transformers config (never downloaded from a hub)."""

    arch: Literal["deepseek_v3", "llama"] = "deepseek_v3"
    """Which transformers architecture to build."""
    lr: float = 3e-3
    """Peak learning rate. The key users sweep first."""
    vocab_size: int = 256
    """Vocabulary size; must cover the data's token ids."""
    hidden_size: int = 128
    """Width of the residual stream."""
    intermediate_size: int = 256
    """Width of the dense MLP."""
    num_layers: int = 2
    """Number of decoder layers."""
    num_heads: int = 4
    """Number of attention heads."""
    num_kv_heads: int = 4
    """Key/value heads (grouped-query attention when below ``num_heads``)."""
    max_position_embeddings: int = 512
    """Longest sequence the rotary embedding is set up for."""
    dropout: float = 0.0
    """Attention dropout probability."""
    n_routed_experts: int = 4
    """DeepSeek MoE: routed experts per MoE layer."""
    num_experts_per_tok: int = 2
    """DeepSeek MoE: experts each token is routed to."""
    n_shared_experts: int = 1
    """DeepSeek MoE: always-active shared experts."""
    moe_intermediate_size: int = 64
    """DeepSeek MoE: width of each expert's MLP."""
    first_k_dense_replace: int = 1
    """DeepSeek MoE: the first k layers use a dense MLP instead of MoE."""
    q_lora_rank: int | None = None
    """DeepSeek MLA: rank of the query low-rank projection (null: full-rank queries)."""
    kv_lora_rank: int = 32
    """DeepSeek MLA: rank of the compressed key/value latent."""
    qk_rope_head_dim: int = 16
    """DeepSeek MLA: per-head dims that carry rotary position."""
    qk_nope_head_dim: int = 16
    """DeepSeek MLA: per-head dims without position."""
    v_head_dim: int = 32
    """DeepSeek MLA: per-head value dims."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "auto"] = "auto"
    """The attention kernel. ``auto``: ``eager`` on CPU (the math every bit-exact CPU result was
    proved with); on CUDA ``sdpa`` (fused, never the full score matrix), or ``flash_attention_2``
    where the ``flash_attn`` package is installed, precision is bf16/fp16 and the trial is not
    deterministic (see ``hpcsweep.train.gpu_choices``)."""
    # ----- a pretrained model from a local folder (hpcsweep.model.folder) -----
    path: str | None = None
    """A Hugging Face model folder on the shared file system (``config.json``, safetensors weights,
    tokenizer), loaded with ``from_pretrained(local_files_only=True)``; null: the built-in model
    above. With a path the architecture is the folder's: every key of ``FOLDER_ARCHITECTURE_KEYS``
    must keep its default (a changed one is refused, naming it). ``model=pretrained`` sets it."""
    trust_remote_code: bool = False
    """Run the model code a folder ships (a ``config.json`` with an ``auto_map``, as DeepSeek-MoE-16B
    has). Without it such a folder is refused before submit: that code runs on every compute node."""
    random_init: bool = False
    """With ``model.path``: build the folder's architecture from its ``config.json`` at a random init
    (seeded by ``trainer.seed``) and ignore any weights, i.e. pretraining at the folder's size. A
    config-only folder (no weight files) needs it; without it that folder is refused."""
    peft: Literal["none", "lora"] = "none"
    """What trains: ``none``, every parameter; ``lora``, LoRA adapters (``model.lora``) over a frozen base."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """The LoRA adapters' settings (used with ``model.peft=lora``)."""
    moe: MoeConfig = field(default_factory=MoeConfig)
    """Router balance of a MoE model (``model.moe.aux_loss_coef``, ``model.moe.bias_update_rate``)."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, "model.lr", self.lr, "a learning rate > 0, e.g. 3e-4")
        if self.path is not None:
            self._check_folder_keys()
            return
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads"):
            value = getattr(self, name)
            _require(value >= 1, f"model.{name}", value, "an integer >= 1")
        _require(
            self.hidden_size % self.num_heads == 0,
            "model.num_heads",
            self.num_heads,
            f"a divisor of model.hidden_size={self.hidden_size}",
        )
        _require(
            1 <= self.num_kv_heads <= self.num_heads and self.num_heads % self.num_kv_heads == 0,
            "model.num_kv_heads",
            self.num_kv_heads,
            f"a divisor of model.num_heads={self.num_heads}",
        )
        _require(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "0 <= dropout < 1")
        _require(
            1 <= self.num_experts_per_tok <= self.n_routed_experts,
            "model.num_experts_per_tok",
            self.num_experts_per_tok,
            f"1..model.n_routed_experts={self.n_routed_experts}",
        )

    def _check_folder_keys(self) -> None:
        _require(
            bool(self.path), "model.path", self.path,
            "a Hugging Face model folder (model=pretrained model.path=/shared/models/NAME), or null for the built-in model",
        )
        defaults = _model_defaults()
        for name in FOLDER_ARCHITECTURE_KEYS:
            value = getattr(self, name)
            _require(
                value == defaults[name],
                f"model.{name}",
                value,
                f"its default ({defaults[name]!r}) with model.path={self.path}: the architecture comes from "
                "the folder's config.json (model=pretrained leaves every such key at its default)",
            )


FOLDER_ARCHITECTURE_KEYS: tuple[str, ...] = (
    "arch", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
    "max_position_embeddings", "dropout", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
    "moe_intermediate_size", "first_k_dense_replace", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "v_head_dim",
)
"""The ``model.*`` keys of the built-in architecture: with ``model.path`` the folder's ``config.json``
sets them, so each must keep its default."""


@functools.cache
def _model_defaults() -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(ModelConfig)}


CHAT_TEMPLATE_OWN_NAMES = (
    "messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "conversation",
    "conversations", "chat_template", "tokenize", "sanitize_control_tokens", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "bos_token", "eos_token",
    "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "additional_special_tokens",
)
"""Names that ``data.chat_template_kwargs`` may not set: what ``apply_chat_template`` takes itself, and the
variables that it (the messages, the generation prompt) or the tokenizer (its special tokens) gives the template."""


@dataclass(kw_only=True)
class DataConfig:
    """Where training tokens come from and how they are batched."""

    kind: Literal["synthetic", "file", "text", "chat"] = "synthetic"
    """``synthetic``: a built-in corpus with learnable structure; ``file``: a token file at ``path``;
    ``text``: the user's text files (``files``), tokenized once into ``cache_dir``; ``chat``: the user's
    instruction samples (``.jsonl`` ``files``), rendered with the tokenizer's chat template."""
    path: str | None = None
    """The memory-mapped token file (``kind=file``), made by ``scripts/prepare-data``."""
    seq_len: int = 64
    """Tokens per training sequence."""
    batch_size: int = 16
    """Sequences per rank per micro-step."""
    val_fraction: float = 0.05
    """Fraction of the corpus held out for validation."""
    synthetic_tokens: int = 1_000_000
    """Size of the synthetic corpus, in tokens."""
    seed: int = 1234
    """Seed of the synthetic corpus and the sampler."""
    files: str | list[str] | None = None
    """``kind=text``: a glob, or a list of globs, of UTF-8 text files (``.txt``: one document each) and
    JSON lines files (``.jsonl``: one document per line, its ``text`` field)."""
    tokenizer: str | None = None
    """A Hugging Face tokenizer folder for ``kind=text`` (null: the model folder's, ``model.path``). Also
    checked against the tokenizer recorded in a ``kind=file`` token file's header."""
    cache_dir: str = "multirun/token-cache"
    """``kind=text``: where the tokenized corpus is kept, one entry per (tokenizer, corpus). The default
    lies beside Hydra's default sweep dirs (``multirun/DATE/TIME``), relative to where the sweep is
    submitted, so every sweep submitted from there shares it."""
    read_delay_ms: int = 0
    """A test knob, not a tuning one: every training batch read waits this long first, as from slow
    storage, so that a test can make one trial of a sweep wait on data (``data.read_delay_ms=0,0,0,50``
    makes the last of four trials slow). 0: no wait."""
    chat_template: str | None = None
    """``kind=chat``: a Jinja file to render samples with, for a tokenizer whose ``tokenizer_config.json``
    has no ``chat_template`` (null: the tokenizer's own)."""
    train_on: Literal["assistant", "all"] = "assistant"
    """``kind=chat``: ``assistant`` takes the loss on the assistant turns' tokens and their end-of-turn
    token only; ``all`` on every token."""
    max_samples: int | None = None
    """``kind=chat``: use only the first this many samples of the corpus (in file and line order); null: all."""
    overlong: Literal["truncate", "drop", "refuse"] = "drop"
    """``kind=chat``: what becomes of a sample longer than a row (more than ``seq_len + 1`` tokens):
    ``drop`` leaves it out (the count is printed), ``truncate`` keeps its first ``seq_len + 1`` tokens,
    ``refuse`` stops the sweep before any trial starts, naming its file and line."""
    chat_template_kwargs: dict[str, bool | int | float | str | None] | None = None
    """``kind=chat``: variables the chat template reads, its switches (``{enable_thinking: false}`` for
    Qwen 3), given to it wherever it renders: the samples, their cache key, ``chat_prompt`` (a task's
    prompt), the export's model card. Values are true/false, numbers, strings or null; a name must be
    one the template reads (checked before any job), not one transformers or hpcsweep sets
    (``CHAT_TEMPLATE_OWN_NAMES``). null (not {}: Hydra could then only merge into it, never set it whole) or
    {}: the template's own defaults."""
    packing: bool | None = None
    """Pack whole samples (``kind=chat``) or documents (``kind=text``, a long one cut into row-sized
    pieces) into ``seq_len`` rows, each apart: its position ids restart and it attends to no other.
    ``false``: ``kind=chat`` has one sample a row, padded (padding takes no loss); ``kind=text`` reads
    windows across documents. null: true for ``kind=chat``, false otherwise."""

    def __post_init__(self) -> None:
        if self.packing is None:
            self.packing = self.kind == "chat"
        _require(not self.packing or self.kind in ("text", "chat"), "data.packing", self.packing,
                 "false unless data.kind=text or data.kind=chat (packing needs sample boundaries)")
        _require(self.max_samples is None or self.max_samples >= 2, "data.max_samples", self.max_samples,
                 "null or an integer >= 2 (a training and a validation sample)")
        _require(not self.chat_template_kwargs or self.kind == "chat", "data.chat_template_kwargs",
                 self.chat_template_kwargs, "null or {} unless data.kind=chat (only chat samples are rendered by a template)")
        for name, value in (self.chat_template_kwargs or {}).items():
            _require(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None and name not in CHAT_TEMPLATE_OWN_NAMES,
                     "data.chat_template_kwargs", self.chat_template_kwargs,
                     f"names of template variables ({name!r} is not one: a name is letters, digits and _, and not "
                     "one that transformers or hpcsweep gives the template: " + ", ".join(CHAT_TEMPLATE_OWN_NAMES) + ")")
            _require(not isinstance(value, float) or math.isfinite(value), f"data.chat_template_kwargs.{name}", value,
                     "a finite number (the value is part of the JSON cache key and the model card)")
        if self.kind == "file":
            _require(bool(self.path), "data.path", self.path, "a token file path when data.kind=file")
        if self.kind in ("text", "chat"):
            patterns = [self.files] if isinstance(self.files, str) else list(self.files or [])
            _require(
                bool(patterns) and all(patterns), "data.files", self.files,
                "a glob or a list of globs of .jsonl files when data.kind=chat" if self.kind == "chat"
                else "a glob or a list of globs of .txt/.jsonl files when data.kind=text",
            )
            _require(bool(self.cache_dir), "data.cache_dir", self.cache_dir, f"a directory when data.kind={self.kind}")
        _require(self.seq_len >= 2, "data.seq_len", self.seq_len, "an integer >= 2")
        _require(self.batch_size >= 1, "data.batch_size", self.batch_size, "an integer >= 1")
        _require(self.read_delay_ms >= 0, "data.read_delay_ms", self.read_delay_ms, "an integer >= 0 (milliseconds)")
        _require(
            0.0 < self.val_fraction < 0.5,
            "data.val_fraction",
            self.val_fraction,
            "0 < val_fraction < 0.5",
        )


@dataclass(kw_only=True)
class TrainerConfig:
    """How a trial trains: its size on the cluster, optimisation, checkpoints and logging."""

    nodes: int = 1
    """Nodes per trial; drives the Slurm allocation."""
    nproc_per_node: int | Literal["auto"] = "auto"
    """Worker processes per node. ``auto``: one per GPU the node gives the trial (the launcher's
    ``gpus_per_node`` on Slurm), or 1 without GPUs. A number also sets the GPUs asked for."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto``: CUDA when available, else CPU (gloo)."""
    max_steps: int = 200
    """Optimizer steps in the whole trial."""
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    """The optimizer."""
    weight_decay: float = 0.1
    """Decoupled weight decay (AdamW) or L2 (Adam, SGD)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """Adam betas."""
    momentum: float = 0.9
    """SGD momentum."""
    warmup_steps: int = 20
    """Linear warmup steps before the cosine decay."""
    min_lr_ratio: float = 0.1
    """The cosine schedule decays to ``model.lr * min_lr_ratio``."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""
    grad_accum: int = 1
    """Micro-steps accumulated per optimizer step."""
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "auto"
    """``auto``: bf16 autocast on a GPU that has bf16 tensor cores (compute capability 8.0+: A100,
    H100, H200), else fp32 (CPUs and older GPUs). ``bf16``: autocast, ``fp16``: autocast with a
    GradScaler, ``fp32``: no autocast."""
    tf32: bool = True
    """On CUDA, run fp32 matmuls and convolutions on the tensor cores in TF32 (10-bit mantissa
    inputs, fp32 accumulation). No effect on CPU, or on what bf16 autocast already casts."""
    deterministic: bool | Literal["auto"] = "auto"
    """``true``: the same bits on every run and across stop and resume (on CUDA: deterministic
    kernels, ``CUBLAS_WORKSPACE_CONFIG``, fixed DDP buckets; slower). ``false``: the fast path.
    ``auto``: true on CPU, false on CUDA. metrics.json records what a trial ran with."""
    grad_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    loss_chunk_tokens: int = 256
    """The cross-entropy works on this many tokens' logits at a time: the LM head computes each
    chunk's logits from the hidden states, upcasts, uses and frees them (hpcsweep.train.head_loss),
    so no logits tensor of the whole batch exists; for a model that changes its logits after the head,
    the logits are chunked instead (hpcsweep.train.loss). Smaller saves memory (about 12-16 B x chunk
    x vocabulary), larger saves kernel launches; 0 (or a value >= the batch's tokens): one chunk."""
    loss_kernel: Literal["auto", "torch", "liger", "cut_cross_entropy"] = "auto"
    """What computes the training loss at the head: ``torch``, the chunks above; ``liger`` or
    ``cut_cross_entropy``, a fused linear cross-entropy kernel (CUDA, and the ``liger-kernel`` or
    ``cut-cross-entropy`` package installed); ``auto``: a fused kernel on CUDA when one is installed
    (Liger first), else ``torch``."""
    seed: int = 0
    """Seed of model initialisation and dropout."""
    ckpt_every: int = 50
    """Save a checkpoint every this many steps (0: only at the end and on request)."""
    ckpt_every_min: float | None = None
    """Also save every this many minutes (rank 0's clock, since the last save began); null: by steps
    only. With ``ckpt_every`` both apply, whichever comes first."""
    keep_top_k: int = 2
    """Besides ``last``, keep the k checkpoints with the best validation loss."""
    eval_every: int = 25
    """Evaluate on the validation split every this many steps."""
    eval_batches: int = 4
    """Validation batches per evaluation."""
    log_every: int = 10
    """Log training scalars every this many steps."""
    early_stop_patience: int = 0
    """Stop after this many evaluations without improvement (0 disables)."""
    early_stop_min_delta: float = 0.0
    """An improvement smaller than this does not count."""
    early_stop_metric: str = "val_loss"
    """What early stopping watches: ``val_loss``, ``val_accuracy`` (checked every ``trainer.eval_every``
    steps) or a task score ``tasks.NAME.METRIC`` (every ``tasks.every`` steps; NAME one of ``tasks.names``)."""
    early_stop_mode: Literal["min", "max"] = "min"
    """``min``: lower is better (a loss); ``max``: higher is better (an accuracy, a task score)."""
    hang_timeout_min: float = 15.0
    """When no step finishes for this many minutes (an evaluation, a save or the start-up included),
    the trial's stacks go to its log, its workers end, and it fails as a hang, which is retried on
    other nodes (``hydra.launcher.max_retries``). Below ``nccl.pg_timeout_s`` (30 min), so a hung
    collective ends here first. 0 disables; fractions are fine."""
    # How the ranks share the model and its gradients (hpcsweep.train.parallel, docs/user/parallel.md).
    parallel: Literal["auto", "ddp", "fsdp"] = "auto"
    """``ddp``: every rank holds the whole model, gradients and optimizer state. ``fsdp``: FSDP2
    (``fully_shard`` per decoder layer, then the whole model) shards all three over the ranks.
    ``auto``: DDP when the trial fits a GPU with DDP (the memory plan), else FSDP."""
    fsdp_reshard_after_forward: bool = True
    """FSDP: free each layer's gathered parameters after its forward and gather them again for the
    backward (less memory, one more all-gather per layer); false keeps them until the backward."""
    grad_comm: Literal["none", "bf16", "fp16", "powersgd"] = "none"
    """DDP's gradient all-reduce: ``none`` (full precision), ``bf16``/``fp16`` (compressed to half
    precision on the wire), ``powersgd`` (low-rank compression with error feedback). For slow
    interconnects; DDP only."""
    powersgd_rank: int = 4
    """``grad_comm=powersgd``: the rank of its low-rank approximation (lower compresses more)."""
    sync_every: int = 1
    """1: gradients are all-reduced every step. H > 1: local SGD (PyTorch's post-local SGD): after
    ``comm_warmup_steps`` every rank steps on its own gradients and the models are averaged every H
    steps. DDP only."""
    comm_warmup_steps: int = 20
    """Steps of plain all-reduce before ``grad_comm=powersgd`` compresses or ``sync_every`` goes local."""
    # The step-time breakdown (hpcsweep.train.step_timer, docs/user/step-time.md).
    step_timing: bool = True
    """Each log window records where its wall time went (data, forward+backward, optimizer,
    checkpoint, logging, other) and its peak memory: metrics.json ``step_time`` and
    ``step_time_total``, TensorBoard ``time/*_pct`` and ``mem/peak_gb``. False switches it off (the
    overhead benchmark's baseline)."""
    # Per-trial telemetry (hpcsweep.telemetry, docs/user/telemetry.md).
    telemetry_every_s: float = 10.0
    """Seconds between two samples of the trial's GPUs (NVML: utilisation, memory, power, SM clock,
    GPM's SM- and tensor-active %) and its workers' CPU and memory, taken by a thread on each node's
    local rank 0; logged as ``sys/...`` scalars at each log window and summarised in metrics.json's
    ``telemetry``. 0 disables it."""
    # Profiler traces (hpcsweep.train.profiling, docs/user/profiling.md): they never change what a step computes.
    profile_steps: list[int] | None = None
    """``[START, END]``: run ``torch.profiler`` over optimizer steps START..END (1-based, inclusive) and
    write one Chrome/Perfetto trace per rank to ``TRIAL_DIR/profile/steps-START-END/rankR.json``. A
    resumed trial skips a window it has passed and takes the rest of one it stopped inside. null: none
    (a running trial can still be asked for one: ``python -m hpcsweep.profile``)."""
    profile_memory: bool = False
    """Also record memory: allocations in the trace and, on CUDA, an allocator snapshot
    (``rankR-memory.pickle``, for https://pytorch.org/memory_viz)."""
    profile_stacks: bool = False
    """Also record the Python stack of every operator (larger traces, slower steps while profiling)."""

    def __post_init__(self) -> None:
        _require(self.nodes >= 1, "trainer.nodes", self.nodes, "an integer >= 1")
        _require(
            self.nproc_per_node == "auto" or self.nproc_per_node >= 1,
            "trainer.nproc_per_node",
            self.nproc_per_node,
            "auto or an integer >= 1",
        )
        _require(self.max_steps >= 1, "trainer.max_steps", self.max_steps, "an integer >= 1")
        _require(self.grad_accum >= 1, "trainer.grad_accum", self.grad_accum, "an integer >= 1")
        _require(self.loss_chunk_tokens >= 0, "trainer.loss_chunk_tokens", self.loss_chunk_tokens,
                 "an integer >= 0 (tokens per chunk of the loss; 0: one chunk)")
        _require(self.warmup_steps >= 0, "trainer.warmup_steps", self.warmup_steps, "an integer >= 0")
        _require(
            0.0 <= self.min_lr_ratio <= 1.0, "trainer.min_lr_ratio", self.min_lr_ratio, "0..1"
        )
        _require(self.grad_clip >= 0, "trainer.grad_clip", self.grad_clip, "a number >= 0")
        _require(len(self.betas) == 2, "trainer.betas", self.betas, "a list of two numbers")
        for name in ("ckpt_every", "keep_top_k", "early_stop_patience"):
            value = getattr(self, name)
            _require(value >= 0, f"trainer.{name}", value, "an integer >= 0")
        _require(
            self.ckpt_every_min is None or self.ckpt_every_min > 0,
            "trainer.ckpt_every_min",
            self.ckpt_every_min,
            "minutes > 0, or null to save by steps only",
        )
        for name in ("eval_every", "eval_batches", "log_every"):
            value = getattr(self, name)
            _require(value >= 1, f"trainer.{name}", value, "an integer >= 1")
        _require(
            self.hang_timeout_min >= 0, "trainer.hang_timeout_min", self.hang_timeout_min, "minutes >= 0 (0 disables)"
        )
        self._check_parallel()
        _require(self.early_stop_metric in EVAL_METRICS or _task_key(self.early_stop_metric) is not None,
                 "trainer.early_stop_metric", self.early_stop_metric,
                 f"one of {', '.join(EVAL_METRICS)}, or a task score tasks.NAME.METRIC")
        _require(self.telemetry_every_s >= 0, "trainer.telemetry_every_s", self.telemetry_every_s,
                 "seconds >= 0 (0 disables telemetry)")
        self._check_profile()

    def _check_profile(self) -> None:
        steps = self.profile_steps
        _require(steps is None or (len(steps) == 2 and 1 <= steps[0] <= steps[1] <= self.max_steps),
                 "trainer.profile_steps", steps,
                 f"null or [START, END]: two optimizer steps with 1 <= START <= END <= trainer.max_steps={self.max_steps}")

    def _check_parallel(self) -> None:
        _require(self.powersgd_rank >= 1, "trainer.powersgd_rank", self.powersgd_rank, "an integer >= 1")
        _require(self.sync_every >= 1, "trainer.sync_every", self.sync_every, "an integer >= 1 (1: every step)")
        # PowerSGD's error feedback cannot start before DDP has built its buckets, at its second step.
        least = 2 if self.grad_comm == "powersgd" else 0
        _require(self.comm_warmup_steps >= least, "trainer.comm_warmup_steps", self.comm_warmup_steps,
                 f"an integer >= {least}" + (" with trainer.grad_comm='powersgd'" if least else ""))
        if self.parallel == "fsdp":
            _require(self.grad_comm == "none", "trainer.grad_comm", self.grad_comm,
                     "only 'none' with trainer.parallel='fsdp' (grad_comm is a DDP communication hook; FSDP "
                     "reduce-scatters in fp32): set trainer.parallel=ddp or trainer.grad_comm=none")
            _require(self.sync_every == 1, "trainer.sync_every", self.sync_every,
                     "only 1 with trainer.parallel='fsdp' (local SGD averages whole DDP replicas): "
                     "set trainer.parallel=ddp or trainer.sync_every=1")
        _require(self.sync_every == 1 or self.grad_comm == "none", "trainer.sync_every", self.sync_every,
                 f"only 1 with trainer.grad_comm={self.grad_comm!r} (local SGD replaces the all-reduce that "
                 "grad_comm compresses): set one of trainer.sync_every=1 or trainer.grad_comm=none")


EVAL_METRICS = ("val_loss", "val_accuracy")
"""What every evaluation measures (``trainer.eval_every``): ``trainer.early_stop_metric`` may watch these."""


def _task_key(key: str) -> tuple[str, str] | None:
    """``(NAME, METRIC)`` of ``tasks.NAME.METRIC``, else None."""
    parts = key.split(".")
    return (parts[1], parts[2]) if len(parts) == 3 and parts[0] == "tasks" and all(parts) else None


@dataclass(kw_only=True)
class TasksConfig:
    """Task scores from lm-evaluation-harness on the trial's model (``hpcsweep.train.task_scores``,
    docs/user/task-scores.md). Needs ``pip install 'hpcsweep[tasks]'`` and a tokenizer."""

    names: list[str] = field(default_factory=list)
    """lm-eval task names to run, each defined by a YAML file under ``include_path``. Empty: no tasks."""
    include_path: str | None = None
    """A folder of lm-eval task YAML files whose data are local files (``dataset_path: json`` with
    ``dataset_kwargs: {data_files: ...}``): nothing is downloaded, lm-eval's built-in tasks are not read."""
    every: int = 0
    """Run the tasks every this many optimizer steps, and at the end; 0: at the end only."""
    limit: int | None = None
    """At most this many examples of each task (null: all of them)."""
    batch_size: int = 8
    """Requests per forward pass of lm-eval."""

    def __post_init__(self) -> None:
        _require(len(set(self.names)) == len(self.names) and all(self.names), "tasks.names", self.names,
                 "a list of distinct lm-eval task names")
        _require(not self.names or bool(self.include_path), "tasks.include_path", self.include_path,
                 "a folder of lm-eval task YAML files when tasks.names is set")
        _require(self.every >= 0, "tasks.every", self.every, "an integer >= 0 (0: at the end only)")
        _require(self.limit is None or self.limit >= 1, "tasks.limit", self.limit, "null or an integer >= 1")
        _require(self.batch_size >= 1, "tasks.batch_size", self.batch_size, "an integer >= 1")


@dataclass(kw_only=True)
class NcclConfig:
    """The NCCL environment preset a trial runs under (see ``hpcsweep.trial.nccl``)."""

    preset: Literal["a100_ib", "h100_ib", "a100_roce", "ethernet", "none", "auto"] = "auto"
    """Which preset of NCCL variables to export; ``auto``: on a node with an InfiniBand device,
    ``h100_ib`` where the driver names a Hopper GPU and ``a100_ib`` otherwise; ``none`` elsewhere."""
    ib_hca: list[str] = field(default_factory=list)
    """HCAs NCCL may use, e.g. ``[mlx5_0, mlx5_1]`` (exported as ``NCCL_IB_HCA`` with exact
    matching); empty: NCCL chooses. List the compute HCAs to keep NCCL off storage ports."""
    debug: bool = False
    """Also export NCCL_DEBUG=INFO and friends."""
    overrides: dict[str, str] = field(default_factory=dict)
    """Variables that replace or extend the preset's."""
    topo_file: str | None = None
    """A cluster's NCCL topology XML, exported as NCCL_TOPO_FILE."""
    pg_timeout_s: int = 1800
    """Process-group timeout: a hung collective fails the trial after this long."""

    def __post_init__(self) -> None:
        _require(self.pg_timeout_s >= 1, "nccl.pg_timeout_s", self.pg_timeout_s, "seconds >= 1")
        for i, name in enumerate(self.ib_hca):
            _require(
                re.fullmatch(r"[A-Za-z0-9_.-]+(:[0-9]+)?", name) is not None,
                f"nccl.ib_hca[{i}]",
                name,
                "an HCA name as in /sys/class/infiniband, optionally with :port (mlx5_0, mlx5_0:1)",
            )
        _require(
            not (self.ib_hca and self.preset == "ethernet"),
            "nccl.ib_hca",
            self.ib_hca,
            "empty with nccl.preset=ethernet, which turns InfiniBand off",
        )


@dataclass(kw_only=True)
class TopologyConfig:
    """How multi-node trials are placed on the switch tree (see ``hpcsweep.slurm.topology``)."""

    mode: Literal["switches", "pin", "off"] = "switches"
    """``switches``: --switches=K@max_wait; ``pin``: an explicit --nodelist; ``off``: no constraint."""
    max_wait_min: int = 5
    """How long Slurm may hold a trial waiting for the fewest-switch placement."""
    exclude: list[str] = field(default_factory=list)
    """Nodes never to choose."""

    def __post_init__(self) -> None:
        _require(self.max_wait_min >= 0, "topology.max_wait_min", self.max_wait_min, "minutes >= 0")


TRACKER_BACKENDS = ("tensorboard", "mlflow", "wandb")
"""What ``logging.backends`` may name; TensorBoard needs nothing, the others their package
(``pip install -e .[mlflow]``, ``.[wandb]``)."""


@dataclass(kw_only=True)
class MlflowConfig:
    """MLflow tracking (``logging.backends`` names ``mlflow``; see ``hpcsweep.train.trackers``)."""

    tracking_uri: str | None = None
    """Where runs go: ``http(s)://HOST:PORT`` of an MLflow server, ``sqlite:///PATH``, or a
    ``file:`` folder. null: a SQLite store in the sweep dir (``SWEEP_DIR/mlflow.db``), so a sweep
    needs no server."""
    experiment: str | None = None
    """The MLflow experiment every trial of the sweep logs to. null: one experiment per sweep,
    named after the sweep dir."""

    def __post_init__(self) -> None:
        if self.tracking_uri is not None:
            _require(
                tracking_uri_problem(self.tracking_uri) is None,
                "logging.mlflow.tracking_uri",
                self.tracking_uri,
                tracking_uri_problem(self.tracking_uri) or "",
            )
        _require(self.experiment is None or bool(self.experiment.strip()), "logging.mlflow.experiment",
                 self.experiment, "null (one experiment per sweep) or a non-empty name")


def tracking_uri_problem(uri: str) -> str | None:
    """Why ``uri`` is no MLflow tracking URI we can use (None when it is one)."""
    scheme, sep, rest = uri.partition(":")
    allowed = "http://HOST:PORT, https://HOST:PORT, sqlite:///PATH, postgresql://..., mysql://..., or file:///PATH"
    if not sep or not rest:
        return f"a URI: {allowed}"
    base = scheme.split("+", 1)[0]
    if base in ("http", "https"):
        host = rest.removeprefix("//").split("/", 1)[0]
        return None if rest.startswith("//") and host else f"http(s)://HOST[:PORT]: {allowed}"
    if base in ("sqlite", "postgresql", "mysql", "mssql"):
        return None if rest.startswith("//") else f"{base}://...: {allowed}"
    if base == "file":
        return None
    return f"one of the schemes MLflow stores runs in: {allowed}"


@dataclass(kw_only=True)
class WandbConfig:
    """Weights & Biases tracking (``logging.backends`` names ``wandb``)."""

    project: str = "hpcsweep"
    """The W&B project of every trial's run."""
    entity: str | None = None
    """The W&B user or team; null: the account's default."""
    mode: Literal["auto", "offline", "online"] = "auto"
    """``offline``: runs are written under the trial dir, uploaded later with the ``wandb sync``
    command ``status`` and ``report`` print; ``online``: streamed as they run; ``auto``: offline
    when the trial runs on a Slurm node (compute nodes often reach no internet), else online."""


@dataclass(kw_only=True)
class LoggingConfig:
    """Where a trial's metrics go besides metrics.json: TensorBoard, MLflow, W&B (rank 0 only)."""

    backends: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Any of tensorboard, mlflow, wandb. Each trial is one run of each tracker, grouped by sweep,
    continued when the trial is requeued or resumed; a failing tracker never fails the trial."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        allowed = ", ".join(TRACKER_BACKENDS)
        _require(
            len(self.backends) == len(set(self.backends)) and all(b in TRACKER_BACKENDS for b in self.backends),
            "logging.backends", self.backends, f"a list of distinct names among {allowed}, e.g. [tensorboard,mlflow]",
        )


@dataclass(kw_only=True)
class ResumeConfig:
    """How a run treats a trial dir that already holds a checkpoint (see ``hpcsweep.trial.identity``).

    Not part of a trial's config: it says how to start the trial, not how it trains.
    """

    force: bool = False
    """Resume even if the trial dir was trained with another training config (``model.lr``,
    ``trainer.max_steps``, ...); the differences are logged and the old config is kept aside."""


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

    def __post_init__(self) -> None:
        self._check_task_keys()
        if self.model.path is not None:
            return  # the folder's sizes count: hpcsweep.model.folder checks them against the data
        _require(
            self.data.seq_len <= self.model.max_position_embeddings,
            "data.seq_len",
            self.data.seq_len,
            f"at most model.max_position_embeddings={self.model.max_position_embeddings}",
        )
        if self.data.kind in ("text", "chat"):
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


def tokenizer_folder(data: DataConfig, model: ModelConfig) -> str | None:
    """The tokenizer folder a trial's text is tokenized with: ``data.tokenizer``, else the model
    folder's (``model.path``); None when neither is set."""
    return data.tokenizer or model.path


def check_corpus_fits(
    data: DataConfig,
    model_vocab_size: int,
    *,
    num_tokens: int,
    corpus_vocab_size: int,
    source: str,
    vocab_key: str = "model.vocab_size",
) -> None:
    """Raise ``ValueError`` when a corpus of ``num_tokens`` ids below ``corpus_vocab_size`` cannot
    train a model of ``model_vocab_size`` on sequences of ``data.seq_len`` (``source`` names it;
    ``vocab_key`` names where the model's vocabulary comes from)."""
    _require(
        corpus_vocab_size <= model_vocab_size,
        vocab_key,
        model_vocab_size,
        f"{source} needs at least {corpus_vocab_size} (its vocabulary)",
    )
    val_start = int(num_tokens * (1 - data.val_fraction))
    # A window is seq_len inputs plus one target; val_fraction < 0.5 makes validation the smaller split.
    shortest_split = min(val_start, num_tokens - val_start)
    _require(
        data.seq_len + 1 < shortest_split,
        "data.seq_len",
        data.seq_len,
        f"at most {shortest_split - 2}: {source} holds {num_tokens} tokens, its validation split "
        f"(data.val_fraction={data.val_fraction}) {shortest_split}",
    )


_GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "trainer": TrainerConfig,
    "nccl": NcclConfig,
    "topology": TopologyConfig,
    "logging": LoggingConfig,
    "tasks": TasksConfig,
}


_LAUNCH_GROUPS: dict[str, type] = {"resume": ResumeConfig}
"""Groups of the composed config that steer how a trial starts; never part of ``TrialConfig``."""


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


def config_defaults() -> dict[str, dict[str, Any]]:
    """Every group's default values, as plain containers: what Hydra composes the presets over."""
    return {group: dataclasses.asdict(cls()) for group, cls in {**_GROUPS, **_LAUNCH_GROUPS}.items()}


def config_keys() -> dict[str, list[str]]:
    """Every config group and its keys, as users override them (``model`` -> ``lr``, ``lora.r``, ...)."""
    return {group: group_keys(cls) for group, cls in {**_GROUPS, **_LAUNCH_GROUPS}.items()}


def mapping_keys() -> set[str]:
    """The ``group.key`` of every key whose value is a mapping with free keys of its own."""
    return {
        f"{group}.{name}"
        for group, cls in {**_GROUPS, **_LAUNCH_GROUPS}.items()
        for name, hint in typing.get_type_hints(cls).items()
        if typing.get_origin(hint) is dict
    }
