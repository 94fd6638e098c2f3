"""A Hugging Face model folder on the shared file system, read on the login node without torch.

``model.path=DIR`` names a folder as ``save_pretrained`` or ``huggingface-cli download --local-dir``
leaves it: ``config.json``, safetensors weights (``model.safetensors``, or shards named by
``model.safetensors.index.json``) and the tokenizer files. ``read_model_folder`` reads what is there
(the file names, ``config.json``, the index), ``check_model_folder`` refuses what cannot train, each
with one line naming the key, and ``model_identity`` says which model it is: ``config.json``, the
weight files' names and sizes, and a SHA-256 over the index, the safetensors headers and a few kB of
each file's tensor data. A header is a few hundred kB even in a 30 GB folder, so the identity costs
milliseconds, not a read of the weights.

Nothing here imports torch or transformers: the architectures transformers knows are read from its
source (``known_causal_lm_types``).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
"""Pickled PyTorch weights: refused, since loading a pickle runs code and is never memory-mapped."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""Any one of these makes a tokenizer ``AutoTokenizer`` can load (with its ``tokenizer_config.json``)."""
SAMPLE_BYTES = 4096
"""Bytes of tensor data read at each of three places of a weight file for its fingerprint."""
_HEADER_LIMIT = 100 * 2**20
"""A safetensors header longer than this is a damaged file, not a header to hash."""


@dataclass(frozen=True)
class ModelFolder:
    """What a model folder holds, as read from its file names, ``config.json`` and index."""

    key: str
    """How the user named it, for messages: ``model.path=/shared/models/x``."""
    path: Path
    """The folder, resolved."""
    config: dict[str, Any]
    """Its ``config.json``."""
    weight_files: tuple[str, ...]
    """The safetensors files the model loads that are present: ``model.safetensors``, or the shards
    its index names."""
    missing_shards: tuple[str, ...]
    """Shards the index names that are not in the folder."""
    has_index: bool
    pickle_weights: bool
    """It holds ``pytorch_model.bin`` weights."""
    tokenizer_files: tuple[str, ...]

    @property
    def needs_remote_code(self) -> bool:
        """Its ``config.json`` maps the Auto classes to model code the folder ships (``auto_map``)."""
        return bool(self.config.get("auto_map"))

    @property
    def has_weights(self) -> bool:
        return bool(self.weight_files) or self.has_index

    @property
    def vocab_size(self) -> int | None:
        value = self.config.get("vocab_size")
        return value if isinstance(value, int) else None

    @property
    def max_position_embeddings(self) -> int | None:
        value = self.config.get("max_position_embeddings")
        return value if isinstance(value, int) else None


def _refuse(key: str, why: str) -> ValueError:
    return ValueError(f"{key} is not allowed: {why}")


def _read_json(path: Path, key: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _refuse(key, f"its {path.name} is not readable JSON ({err})") from None
    if not isinstance(value, dict):
        raise _refuse(key, f"its {path.name} is not a JSON object")
    return value


def read_model_folder(path: str, key_name: str = "model.path") -> ModelFolder:
    """Read the folder ``model.path`` (or the key ``key_name``) names; ``ValueError`` (one line, naming the key)
    when it is no folder or has no readable ``config.json``."""
    key = f"{key_name}={path}"
    folder = Path(path).expanduser()
    if not folder.exists():
        raise _refuse(key, "no such folder")
    if not folder.is_dir():
        raise _refuse(key, "not a folder (a Hugging Face model folder holds config.json, safetensors and a tokenizer)")
    names = {child.name for child in folder.iterdir()}
    if CONFIG_FILE not in names:
        raise _refuse(key, "it holds no config.json (a Hugging Face model folder holds config.json, "
                           "safetensors weights and the tokenizer files)")
    config = _read_json(folder / CONFIG_FILE, key)
    weight_files: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    if WEIGHTS_FILE in names:
        weight_files = (WEIGHTS_FILE,)
    elif WEIGHTS_INDEX in names:
        weight_map = _read_json(folder / WEIGHTS_INDEX, key).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise _refuse(key, f"its {WEIGHTS_INDEX} has no weight_map")
        shards = sorted({str(shard) for shard in weight_map.values()})
        weight_files = tuple(shard for shard in shards if shard in names)
        missing = tuple(shard for shard in shards if shard not in names)
    return ModelFolder(
        key=key,
        path=folder.resolve(),
        config=config,
        weight_files=weight_files,
        missing_shards=missing,
        has_index=WEIGHTS_INDEX in names and WEIGHTS_FILE not in names,
        pickle_weights=any(name in names for name in PICKLE_WEIGHTS),
        tokenizer_files=tuple(name for name in TOKENIZER_FILES if name in names),
    )


def check_model_folder(folder: ModelFolder, *, trust_remote_code: bool, random_init: bool) -> None:
    """Refuse a folder that cannot train, with one line naming the key and what is allowed.

    In order: model code the folder ships without ``model.trust_remote_code=true``; an architecture
    transformers does not know as a causal LM; weights that are pickles or shards that are missing;
    no weights at all without ``model.random_init=true``; no tokenizer.
    """
    key = folder.key
    if folder.needs_remote_code:
        auto_map = folder.config["auto_map"]
        if not trust_remote_code:
            target = auto_map.get("AutoModelForCausalLM") if isinstance(auto_map, dict) else None
            raise _refuse(
                "model.trust_remote_code=false",
                f"{key} ships its own model code (config.json auto_map"
                + (f": AutoModelForCausalLM -> {target}" if target else "")
                + "); add model.trust_remote_code=true to run it on the compute nodes",
            )
        if not isinstance(auto_map, dict) or "AutoModelForCausalLM" not in auto_map:
            raise _refuse(key, "its config.json auto_map has no AutoModelForCausalLM entry: it is not a causal LM")
    else:
        model_type = folder.config.get("model_type")
        known = known_causal_lm_types()
        if model_type not in known:
            raise _refuse(
                key,
                f"its config.json model_type={model_type!r} is not a causal LM architecture transformers "
                f"{_transformers_version()} knows ({len(known)} do, e.g. deepseek_v3, deepseek_v2, llama, qwen2); "
                "a newer transformers may know it, or a folder with its own code (auto_map) with "
                "model.trust_remote_code=true",
            )
    if not random_init:
        _check_weights(folder)
    if not folder.tokenizer_files:
        raise _refuse(key, f"it has no tokenizer (one of {', '.join(TOKENIZER_FILES)}); copy the model's "
                           "tokenizer files into the folder")


def _check_weights(folder: ModelFolder) -> None:
    key = folder.key
    if folder.missing_shards:
        shown = ", ".join(folder.missing_shards[:3]) + (" ..." if len(folder.missing_shards) > 3 else "")
        raise _refuse(key, f"its {WEIGHTS_INDEX} names {len(folder.missing_shards)} shard(s) that are not "
                           f"there: {shown}; finish the download")
    if folder.has_weights:
        return
    if folder.pickle_weights:
        raise _refuse(key, "its weights are pytorch_model.bin pickles, not safetensors (loading a pickle runs "
                           "code and is never memory-mapped); convert them once with save_pretrained, "
                           "which writes safetensors")
    raise _refuse(key, f"it has no weights ({WEIGHTS_FILE}, or {WEIGHTS_INDEX} and its shards); download "
                       "them, or add model.random_init=true to train its architecture from a random init")


def _transformers_version() -> str:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


@functools.cache
def known_causal_lm_types() -> frozenset[str]:
    """Every ``model_type`` that ``AutoModelForCausalLM`` of the installed transformers can build.

    Read from the literal ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` in transformers' source, never by
    importing it: its auto modules import torch, which the login node does not load.
    """
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        raise RuntimeError("transformers is not installed: model.path needs it")
    source = Path(spec.origin).parent / "models" / "auto" / "modeling_auto.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES" for t in node.targets)
            and isinstance(node.value, ast.Call)
            and node.value.args
        ):
            return frozenset(name for name, _ in ast.literal_eval(node.value.args[0]))
    raise RuntimeError(f"{source} defines no MODEL_FOR_CAUSAL_LM_MAPPING_NAMES literal")


def safetensors_header(path: Path) -> bytes:
    """The JSON header of a safetensors file: the little-endian u64 length in its first 8 bytes, then that
    many bytes. Raises ``ValueError`` for a file too short or with an implausible length."""
    with path.open("rb") as handle:
        prefix = handle.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= _HEADER_LIMIT:
            raise ValueError(f"{path.name} is not a safetensors file (header length {length})")
        header = handle.read(length)
    if len(header) != length:
        raise ValueError(f"{path.name} is not a safetensors file (it ends inside its header)")
    return header


def data_samples(path: Path, header_length: int) -> bytes:
    """``SAMPLE_BYTES`` of a safetensors file's tensor data at its start, middle and end: weights retrained
    or re-saved with the same shapes (an unchanged header) change them, and reading them costs three seeks."""
    start, size = 8 + header_length, path.stat().st_size
    with path.open("rb") as handle:
        samples = []
        for offset in (start, max(start, (start + size) // 2 - SAMPLE_BYTES // 2), max(start, size - SAMPLE_BYTES)):
            handle.seek(offset)
            samples.append(handle.read(SAMPLE_BYTES))
    return b"".join(samples)


def model_identity(folder: ModelFolder) -> dict[str, Any]:
    """Which model a folder holds: ``{"path", "config", "weights": {name: bytes}, "fingerprint_sha256"}``.

    ``fingerprint_sha256`` covers the index (when sharded) and, per weight file in name order, its name,
    its JSON header (every tensor's name, dtype, shape and offsets) and ``data_samples`` of its tensor
    data: a retrained or re-saved checkpoint changes it, a touched mtime does not, and a 30 GB folder is
    fingerprinted in milliseconds. ``None`` without weights.
    """
    digest = hashlib.sha256()
    if folder.has_index:
        digest.update((folder.path / WEIGHTS_INDEX).read_bytes())
    for name in folder.weight_files:
        try:
            header = safetensors_header(folder.path / name)
        except ValueError as err:
            raise _refuse(folder.key, str(err)) from None
        digest.update(name.encode() + b"\0" + len(header).to_bytes(8, "little") + header)
        digest.update(data_samples(folder.path / name, len(header)))
    return {
        "path": str(folder.path),
        "config": folder.config,
        "weights": {name: (folder.path / name).stat().st_size for name in folder.weight_files},
        "fingerprint_sha256": digest.hexdigest() if folder.weight_files else None,
    }


def identity_changes(stored: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between two identities of a model folder, one short phrase each; [] when none.

    The folder's path is not compared: a folder moved whole is the same model.
    """
    changes = []
    old_config, new_config = stored.get("config") or {}, now.get("config") or {}
    for name in sorted(old_config.keys() | new_config.keys()):
        if old_config.get(name) != new_config.get(name):
            changes.append(f"config.json {name}={_short(old_config.get(name))} (now {_short(new_config.get(name))})")
    old_weights, new_weights = stored.get("weights") or {}, now.get("weights") or {}
    for name in sorted(old_weights.keys() | new_weights.keys()):
        before, after = old_weights.get(name), new_weights.get(name)
        if before != after:
            changes.append(f"{name} {_size(before)} (now {_size(after)})")
    if stored.get("fingerprint_sha256") != now.get("fingerprint_sha256"):
        changes.append(
            f"safetensors fingerprint {str(stored.get('fingerprint_sha256'))[:12]} "
            f"(now {str(now.get('fingerprint_sha256'))[:12]})"
        )
    return changes


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _size(size: int | None) -> str:
    return "absent" if size is None else f"{size} bytes"
