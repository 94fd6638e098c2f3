"""A trial dir remembers the config it was trained with; resuming it with another one is refused.

The *training identity* of a trial is every config key that changes the weights or the data order.
Resuming a checkpoint under a different identity would silently mix two configs in one result, so
it is refused, naming the keys that differ, unless ``resume.force=true``. Keys outside the identity
may differ freely between runs of one trial dir (``FREE_KEYS``; everything not listed there is part
of the identity, so a key added later is protected by default).

A trial that loads a model folder (``model.path``) is also trained *from* that folder: its identity
(``hpcsweep.model.folder.model_identity``: config.json, weight names and sizes, a fingerprint of the
safetensors headers and data) is recorded in each attempt's ``environment.json``, and resuming after the
folder changed is refused the same way, naming what changed. The path itself may change: a folder
moved whole is the same model. On a node, the identity compared is that of the attempt's model record
(``hpcsweep.model.record``), read once per attempt.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from hpcsweep.config import TrialConfig, config_defaults, trial_config_from_dict, trial_config_to_dict
from hpcsweep.files.trial_files import CONFIG_FILE, TrialFiles
from hpcsweep.model.folder import identity_changes
from hpcsweep.model.record import read_model_record

MODEL_RECORD_KEY = "model"
"""The key of ``environment.json`` that holds the identity of the model folder the attempt trained from."""

FREE_KEYS: tuple[str, ...] = (
    # Logging, telemetry, checkpoints and retention: no effect on the computation or the RNG streams.
    "trainer.log_every",
    "trainer.ckpt_every",
    "trainer.ckpt_every_min",
    "trainer.keep_top_k",
    "trainer.telemetry_every_s",
    # When a stalled run is given up: never what a step computes.
    "trainer.hang_timeout_min",
    # Profiler traces watch the steps, they never change what a step computes.
    "trainer.profile_steps",
    "trainer.profile_memory",
    "trainer.profile_stacks",
    # How bytes move between ranks and where the trial is placed, not what is computed: a
    # resumed trial may need another NCCL setting or other nodes (a requeue moves it anyway).
    "nccl.",
    "topology.",
    # Where metrics are sent: never what a step computes.
    "logging.",
)
"""Keys (or ``group.`` prefixes) that may differ when a trial dir is resumed."""

EVAL_KEYS = ("trainer.eval_every", "trainer.eval_batches")
"""Free unless early stopping is on in either config: then evaluations decide when training ends."""


@dataclasses.dataclass(frozen=True)
class Difference:
    """One training-identity key whose value in the trial dir differs from the one asked for now."""

    key: str
    stored: Any
    now: Any

    def __str__(self) -> str:
        return f"{self.key}={_shown(self.stored)} (now {_shown(self.now)})"


def _shown(value: Any) -> str:
    """A value as it would be typed on the command line."""
    return yaml.safe_dump(value, default_flow_style=True, width=1_000).strip().removesuffix("...").strip()


@dataclasses.dataclass(frozen=True)
class ModelChange:
    """The model folder a trial dir was trained from is not what it was: what differs, one phrase each."""

    path: str
    changes: tuple[str, ...]

    def __str__(self) -> str:
        return f"model.path={self.path} changed since the trial trained from it: {'; '.join(self.changes)}"


class ConfigMismatch(ValueError):
    """A trial dir holds a checkpoint trained with another config; nothing was run."""


def flatten(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``("group.key", value)`` pairs of a nested mapping; lists and dict-valued keys stay whole."""
    for key, value in values.items():
        if isinstance(value, Mapping) and not prefix:
            yield from flatten(value, f"{key}.")
        else:
            yield f"{prefix}{key}", value


def is_free(key: str, stored: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """True when ``key`` may differ between the stored and the new flattened config."""
    if any(key == free or (free.endswith(".") and key.startswith(free)) for free in FREE_KEYS):
        return True
    if key in EVAL_KEYS:
        return not (stored.get("trainer.early_stop_patience") or now.get("trainer.early_stop_patience"))
    if key == "model.path":  # the folder's contents are compared instead (``model_change``)
        return None not in (stored.get(key), now.get(key))
    # The sweep-level check sees "auto" before a node resolves it; the runner checks again after.
    return key == "trainer.nproc_per_node" and "auto" in (stored.get(key), now.get(key))


def config_differences(stored: Mapping[str, Any], now: Mapping[str, Any]) -> list[Difference]:
    """The training-identity keys whose values differ between two plain trial configs."""
    old, new = dict(flatten(stored)), dict(flatten(now))
    # A key added since the trial trained (tasks.*, trainer.early_stop_metric) is read at its default:
    # new keys default to what training did before them.
    defaults = dict(flatten(config_defaults()))
    old.update({key: defaults[key] for key in new.keys() - old.keys() if key in defaults})
    return [
        Difference(key, old.get(key), new.get(key))
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key) and not is_free(key, old, new)
    ]


def differences_text(differences: list[Difference | ModelChange]) -> str:
    """``model.lr=0.0001 (now 0.003), trainer.max_steps=400 (now 200)``."""
    return ", ".join(str(d) for d in differences)


def mismatch_message(trial_dir: Path, differences: list[Difference | ModelChange]) -> str:
    """The one-line refusal naming every differing key with both values, and what changed in the model folder."""
    model_changed = any(isinstance(d, ModelChange) for d in differences)
    return (
        f"trial dir {trial_dir} was trained with a different config: {differences_text(differences)}; "
        + ("put the model folder back as it was, " if model_changed else "")
        + "rerun with the same overrides, or add resume.force=true to resume it with the new config"
    )


def trial_model_identity(config: TrialConfig) -> dict[str, Any] | None:
    """The identity of the model folder ``model.path`` names now; None for the built-in model."""
    path = config.model.path
    return None if path is None else read_model_record(path).identity


def recorded_model_identity(trial_dir: Path) -> dict[str, Any] | None:
    """The identity of the model folder the trial's last attempt trained from (its ``environment.json``)."""
    try:
        record = json.loads(TrialFiles(trial_dir).environment.read_text())
    except (OSError, ValueError):
        return None
    return record.get(MODEL_RECORD_KEY) if isinstance(record, dict) else None


def model_change(
    trial_dir: Path, config: TrialConfig, identity_now: Callable[[TrialConfig], dict[str, Any] | None]
) -> ModelChange | None:
    """How the folder ``model.path`` names differs from the one ``trial_dir`` was trained from; None
    when it does not (or for the built-in model). ``ConfigMismatch`` when the trial dir has no record of it."""
    if config.model.path is None:
        return None
    stored = recorded_model_identity(trial_dir)
    if stored is None:
        raise ConfigMismatch(
            f"trial dir {trial_dir} has no record of the model folder it trained from (environment.json); "
            f"add resume.force=true to resume it from model.path={config.model.path}"
        )
    now = identity_now(config)
    changes = identity_changes(stored, now or {})
    return ModelChange(config.model.path, tuple(changes)) if changes else None


def has_checkpoint(trial_dir: Path) -> bool:
    """True when the trial dir holds a checkpoint, i.e. running it again would resume it."""
    return any(TrialFiles(trial_dir).checkpoints.glob("step*.pt"))


def stored_config(trial_dir: Path) -> dict[str, Any] | None:
    """The normalised config the trial dir was trained with, or None when it has nothing to resume."""
    path = trial_dir / CONFIG_FILE
    if not path.exists() or not has_checkpoint(trial_dir):
        return None
    try:
        return trial_config_to_dict(trial_config_from_dict(yaml.safe_load(path.read_text()) or {}))
    except ValueError as err:
        raise ConfigMismatch(
            f"trial dir {trial_dir} holds a config.yaml this version cannot read ({err}); "
            "add resume.force=true to resume it with the new config"
        ) from None


def resume_differences(
    trial_dir: Path,
    config: TrialConfig,
    identity_now: Callable[[TrialConfig], dict[str, Any] | None] = trial_model_identity,
) -> list[Difference | ModelChange]:
    """How ``config`` differs in training identity from what ``trial_dir`` was trained with, its model
    folder's contents included (``identity_now`` reads them; a sweep passes one that reads each folder once).

    Empty for a new trial dir, or one without a checkpoint. Raises ``ConfigMismatch`` when the
    stored config cannot be read.
    """
    stored = stored_config(trial_dir)
    if stored is None:
        return []
    differences: list[Difference | ModelChange] = [*config_differences(stored, trial_config_to_dict(config))]
    if stored["model"].get("path") is not None:
        change = model_change(trial_dir, config, identity_now)
        differences += [change] if change else []
    return differences


def check_resume(
    trial_dir: Path,
    config: TrialConfig,
    force: bool,
    identity_now: Callable[[TrialConfig], dict[str, Any] | None] = trial_model_identity,
) -> list[Difference | ModelChange]:
    """Raise ``ConfigMismatch`` when ``config`` would resume ``trial_dir`` under another identity.

    With ``force``, return the differences instead (for the caller to log and record). ``identity_now``
    gives the model folder's identity now (an attempt passes its model record's).
    """
    try:
        differences = resume_differences(trial_dir, config, identity_now)
    except ConfigMismatch:
        if force:
            return []
        raise
    if differences and not force:
        raise ConfigMismatch(mismatch_message(trial_dir, differences))
    return differences
