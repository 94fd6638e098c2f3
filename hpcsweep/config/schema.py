"""Every config group by name with its keys and defaults, and a group built from a plain mapping, checked."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from .data import DataConfig
from .logging import LoggingConfig
from .model import ModelConfig
from .nccl import NcclConfig
from .objective import ObjectiveConfig
from .resume import ResumeConfig
from .tasks import TasksConfig
from .topology import TopologyConfig
from .trainer import TrainerConfig
from .validation import _fail


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


_GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "trainer": TrainerConfig,
    "nccl": NcclConfig,
    "topology": TopologyConfig,
    "logging": LoggingConfig,
    "tasks": TasksConfig,
    "objective": ObjectiveConfig,
}


_LAUNCH_GROUPS: dict[str, type] = {"resume": ResumeConfig}
"""Groups of the composed config that steer how a trial starts; never part of ``TrialConfig``."""


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
