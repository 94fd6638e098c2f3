"""What a trial's container sees of the host: the user's ``hydra.launcher.container.mounts`` and the paths
hpcsweep mounts itself, each at the same path inside, so that every path a trial's config or files name means
the same inside as on the login node."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MODES = ("ro", "rw")
"""The mount flags accepted: the ones pyxis and Apptainer both spell the same way."""


@dataclass(frozen=True)
class Mount:
    """``source`` on the host at ``target`` inside, read-only when ``mode`` is ``ro``."""

    source: str
    target: str
    mode: str | None = None

    def text(self) -> str:
        """``SRC:DST`` or ``SRC:DST:ro``, as pyxis's ``--container-mounts`` and Apptainer's ``-B`` both take it."""
        return ":".join([self.source, self.target, *([self.mode] if self.mode else [])])


def parse_mount(text: str, key: str) -> Mount:
    """``SRC:DST``, ``SRC:DST:ro`` or ``SRC:DST:rw``; ``ValueError`` naming ``key`` (the list entry) otherwise.

    Both paths absolute; no comma in either (both runtimes separate mounts at commas) and no colon (which
    separates the parts).
    """
    parts = text.split(":") if isinstance(text, str) else []
    allowed = ("SRC:DST or SRC:DST:ro (SRC and DST absolute paths, with no comma or colon in them; "
               f"mode {' or '.join(MODES)})")
    if len(parts) not in (2, 3) or any("," in part for part in parts):
        raise ValueError(f"{key}={text!r} is not allowed: {allowed}")
    source, target, *mode = parts
    if not (os.path.isabs(source) and os.path.isabs(target)) or (mode and mode[0] not in MODES):
        raise ValueError(f"{key}={text!r} is not allowed: {allowed}")
    return Mount(os.path.normpath(source), os.path.normpath(target), mode[0] if mode else None)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def same_path_mounts(paths: Iterable[str]) -> list[Mount]:
    """Each of ``paths`` (absolute) mounted at its own path, read-write: duplicates dropped and a path inside
    another one folded into it (mounting ``/s`` already shows ``/s/.code``), in path order."""
    kept: list[str] = []
    for path in sorted({os.path.normpath(p) for p in paths}):
        if not any(_inside(path, folder) for folder in kept):
            kept.append(path)
    return [Mount(path, path) for path in kept]


def _depth(path: str) -> int:
    return len([part for part in path.split("/") if part])


def all_mounts(own: Sequence[Mount], user: Sequence[Mount]) -> list[Mount]:
    """The user's mounts and hpcsweep's own, in the order to mount them: a folder before what is inside it,
    so that a read-write cache inside a read-only data mount stays writable. An own mount at a target the
    user mounts already is left to the user's."""
    targets = {m.target for m in user}
    mounts = [*user, *(m for m in own if m.target not in targets)]
    return sorted(mounts, key=lambda m: _depth(m.target))
