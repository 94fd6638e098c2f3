"""Count what this process opens in a folder, by name: Python's ``open`` audit event, so every reader is
seen whatever name it imported its function under (no monkeypatching), and nothing else is slowed.

An audit hook cannot be removed, so one hook is added the first time and serves every ``opens_in``.
Opens by native code (safetensors' memory map, tokenizers) raise no audit event and are not counted.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

_WATCHED: list[tuple[str, collections.Counter]] = []
_HOOKED = False


def _on_event(event: str, args: tuple) -> None:
    if event != "open" or not _WATCHED or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.fsdecode(args[0])
    for folder, counts in _WATCHED:
        if os.path.dirname(os.path.abspath(path)) == folder:
            counts[os.path.basename(path)] += 1


@contextlib.contextmanager
def opens_in(folder: Path) -> Iterator[collections.Counter]:
    """A ``Counter`` of the files of ``folder`` (not its subfolders) opened while the block runs, by name."""
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_on_event)
        _HOOKED = True
    watched = (str(folder.resolve()), collections.Counter())
    _WATCHED.append(watched)
    try:
        yield watched[1]
    finally:
        _WATCHED.remove(watched)
