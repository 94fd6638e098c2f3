"""One record of a model folder: read once, then carried to whoever needs it.

``read_model_record(path)`` reads the folder ``model.path`` names once (``hpcsweep.model.folder``: its
file names, ``config.json``, the index, and the identity of its weights) into a frozen ``ModelRecord``.
Its JSON form (``to_dict``, ``record_from_dict``) travels in each node's attempt file, so that the resume
guard, the environment record, the workers' checkpoints (the base model's identity) and their memory
plan read this one record instead of reading and fingerprinting the folder again, each on its own.

The record describes the folder as the node found it at the start of its attempt: a folder changed
since the trial dir was trained from it is refused by comparing ``identity`` with the identity that
``environment.json`` recorded (``hpcsweep.trial.identity``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcsweep.model.folder import ModelFolder, model_identity, read_model_folder


@dataclasses.dataclass(frozen=True)
class ModelRecord:
    """A model folder as read once: what it holds, its ``config.json`` and which weights it has."""

    typed: str
    """``model.path`` as the user typed it (relative paths stay relative): what messages and exports name."""
    path: str
    """The folder, resolved to an absolute path when it was read."""
    config: dict[str, Any]
    """Its ``config.json``."""
    weights: dict[str, int]
    """Each safetensors file the model loads that is present, and its size in bytes."""
    fingerprint_sha256: str | None
    """``hpcsweep.model.folder.model_identity``'s fingerprint of the weights; None without weights."""
    missing_shards: tuple[str, ...] = ()
    """Shards the index names that are not in the folder."""
    has_index: bool = False
    """The weights are shards named by ``model.safetensors.index.json``."""
    pickle_weights: bool = False
    """It holds ``pytorch_model.bin`` weights (refused by ``check_model_folder``)."""
    tokenizer_files: tuple[str, ...] = ()

    @property
    def needs_remote_code(self) -> bool:
        """Its ``config.json`` maps the Auto classes to model code the folder ships (``auto_map``)."""
        return self.folder.needs_remote_code

    @property
    def weights_bytes(self) -> int:
        """The bytes of the weight files a trial loads (memory-mapped on each node)."""
        return sum(self.weights.values())

    @property
    def identity(self) -> dict[str, Any]:
        """Which model the folder holds, as ``model_identity`` gives it: what ``environment.json`` and a
        checkpoint record, and what a resume compares (``identity_changes``)."""
        return {"path": self.path, "config": self.config, "weights": dict(self.weights),
                "fingerprint_sha256": self.fingerprint_sha256}

    @property
    def folder(self) -> ModelFolder:
        """The folder as ``read_model_folder`` reads it, for ``check_model_folder``'s refusals."""
        return ModelFolder(
            key=f"model.path={self.typed}", path=Path(self.path), config=self.config,
            weight_files=tuple(self.weights), missing_shards=self.missing_shards, has_index=self.has_index,
            pickle_weights=self.pickle_weights, tokenizer_files=self.tokenizer_files,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every field, tuples as lists."""
        return {field.name: list(value) if isinstance(value, tuple) else value
                for field in dataclasses.fields(self) for value in [getattr(self, field.name)]}


def read_model_record(path: str) -> ModelRecord:
    """Read the folder ``model.path`` names, and fingerprint its weights, once.

    ``ValueError`` naming the key when it is no folder, has no readable ``config.json``, or a weight
    file is not safetensors (``read_model_folder``, ``model_identity``). The folder is not checked for
    training here: ``check_model_folder(record.folder, ...)`` does that.
    """
    folder = read_model_folder(path)
    identity = model_identity(folder)
    return ModelRecord(
        typed=path, path=identity["path"], config=folder.config, weights=identity["weights"],
        fingerprint_sha256=identity["fingerprint_sha256"], missing_shards=folder.missing_shards,
        has_index=folder.has_index, pickle_weights=folder.pickle_weights, tokenizer_files=folder.tokenizer_files,
    )


_TUPLES = ("missing_shards", "tokenizer_files")


def record_from_dict(raw: Mapping[str, Any]) -> ModelRecord:
    """The ``ModelRecord`` of its JSON form; ``ValueError`` naming an unknown or missing field."""
    names = {field.name for field in dataclasses.fields(ModelRecord)}
    required = {field.name for field in dataclasses.fields(ModelRecord)
                if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING}
    unknown, missing = sorted(set(raw) - names), sorted(required - set(raw))
    if unknown or missing:
        raise ValueError(f"model record: unknown field(s) {unknown}, missing field(s) {missing}")
    return ModelRecord(**{key: tuple(value) if key in _TUPLES else value for key, value in raw.items()})
