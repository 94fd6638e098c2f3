"""Sharded checkpoint storage on ``torch.distributed.checkpoint`` (DCP): every rank writes its part.

A state dict goes to a directory as DCP writes it: one ``__RANK_0.distcp`` file per rank and a
``.metadata`` index that rank 0 writes last. Tensors every rank holds alike (DDP's replicated
weights and optimizer state) are written once, DCP's planner sharing them out among the ranks;
keys only one rank holds (its RNG state) are written by that rank. On load each rank reads the
keys it asks for and nothing else.

Saves run in a background thread on a process group of their own (gloo), so their collectives
never interleave with training's: the caller stages the state to CPU memory first, synchronously
(``stage``), then trains on while the thread writes. One save runs at a time.

DCP unpickles ``.metadata`` with plain ``pickle``; :class:`SafeFileSystemReader` allows only the
classes DCP's metadata is made of, as ``torch.load(weights_only=True)`` does for tensor files
(DCP already loads its tensor and byte items that way).
"""

from __future__ import annotations

import enum
import logging
import pickle
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

log = logging.getLogger(__name__)

_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "StorageMeta", "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


def _enum_member(enum_class: Any, name: Any) -> Any:
    """``getattr`` as unpickling calls it: only for a member of an enum among DCP's metadata classes.

    Some Pythons pickle an enum member as ``getattr(EnumClass, "NAME")`` (Debian 12's 3.11.2 does;
    3.11.7 pickles it by value): a checkpoint written under one must resume under the other, but a
    general ``getattr`` would let a crafted file reach anything."""
    allowed = (isinstance(enum_class, enum.EnumMeta)
               and (enum_class.__module__, enum_class.__qualname__) in _METADATA_CLASSES)
    if not allowed or not isinstance(name, str) or name not in enum_class.__members__:
        raise pickle.UnpicklingError(f"getattr({enum_class!r}, {name!r}) is not part of DCP metadata: refused")
    return enum_class[name]


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP metadata: refused")


def read_metadata(directory: Path) -> Any:
    """The DCP ``Metadata`` of ``directory``, unpickling only DCP's own metadata classes."""
    with open(directory / ".metadata", "rb") as f:
        return _MetadataUnpickler(f).load()


class SafeFileSystemReader(dcp.FileSystemReader):
    """DCP's file reader, with ``.metadata`` read by :func:`read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("rank") is not None:
            raise ValueError("per-rank DCP metadata (use_collectives=False) is not used by hpcsweep")
        metadata = read_metadata(Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp.metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _PausingWriter(dcp.FileSystemWriter):
    """A writer that runs ``pause`` once this rank's shard is written (``HPCSWEEP_FAULT=hang_in_save``)."""

    def __init__(self, path: Path, pause: Callable[[], None]) -> None:
        super().__init__(path)
        self._pause = pause

    def write_data(self, plan: Any, planner: Any) -> Any:
        written = super().write_data(plan, planner)  # a torch.futures.Future
        written.wait()
        self._pause()
        return written


def check_complete(directory: Path) -> str | None:
    """Why the DCP checkpoint in ``directory`` cannot be loaded, or None when it can.

    Checks the index and that every file it names is there and long enough: what a killed or
    truncated write leaves. The bytes themselves are checked as they load.
    """
    try:
        metadata = read_metadata(directory)
    except FileNotFoundError:
        return f"{directory}: no .metadata (the save did not finish)"
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as err:
        return f"{directory}/.metadata: {type(err).__name__}: {err}"
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        path = directory / name
        size = path.stat().st_size if path.exists() else -1
        if size < end:
            return f"{path}: {'missing' if size < 0 else f'{size} bytes, the index needs {end}'}"
    return None


class CheckpointStore(Protocol):
    """Where sharded state dicts go: the seam between ``CheckpointManager`` and DCP."""

    def stage(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A CPU copy of ``state`` that training may not change (every rank, synchronously)."""

    def write(self, parts: Mapping[Path, Mapping[str, Any]], then: Callable[[], None], *, step: int) -> Future:
        """Write each staged state dict to its directory, one after the other, then call ``then``;
        in the background. A collective: every rank calls it with the same directories."""

    def read(self, directory: Path, target: dict[str, Any]) -> None:
        """Fill ``target`` in place with the values of its keys saved in ``directory`` (a collective)."""

    def close(self) -> None:
        """Release the thread and staging memory (after the last write has finished)."""


class DcpStore:
    """:class:`CheckpointStore` on DCP's file system writer and reader.

    ``world_size > 1`` creates a gloo process group for checkpoint collectives (a collective
    itself). ``pin_memory`` stages into pinned memory, reused from save to save (CUDA).
    """

    def __init__(
        self, world_size: int, *, pin_memory: bool, pause: tuple[int, Callable[[], None]] | None = None
    ) -> None:
        self.group = dist.new_group(backend="gloo") if world_size > 1 else None
        if self.group is None:
            # DCP warns on every save and load of a single process, which is what no_dist asks for.
            warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")
        self.rank = dist.get_rank() if world_size > 1 else 0
        self._stager = DefaultStager(StagingOptions(pin_memory, False, False, False))
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpcsweep-checkpoint")
        self._pause_at = pause

    def stage(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return self._stager.stage(dict(state))

    def write(self, parts: Mapping[Path, Mapping[str, Any]], then: Callable[[], None], *, step: int) -> Future:
        def run() -> None:
            for directory, state in parts.items():
                dcp.save(
                    dict(state), storage_writer=self._writer(directory, step), process_group=self.group,
                    no_dist=self.group is None,
                )
            then()

        return self._thread.submit(run)

    def read(self, directory: Path, target: dict[str, Any]) -> None:
        dcp.load(
            target, storage_reader=SafeFileSystemReader(directory), process_group=self.group, no_dist=self.group is None
        )

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self._stager.close()

    def _writer(self, directory: Path, step: int) -> dcp.FileSystemWriter:
        if self._pause_at is None or self._pause_at[0] != step:
            return dcp.FileSystemWriter(directory)
        return _PausingWriter(directory, self._pause_at[1])


