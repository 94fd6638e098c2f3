"""The zip archive that holds hpcsweep's own packages inside a code snapshot (``.code/hpcsweep.zip``).

Why one archive rather than loose files: every rank of every trial imports hpcsweep, and from loose
files each process looks up and opens every module it imports (70 to 120 of them in a trial's processes,
each a ``.py`` and its ``__pycache__`` entry) on the shared file system (NFS, Lustre), where each lookup
is a round trip to the metadata server. From a zip on ``PYTHONPATH`` (Python's zipimport) a process
opens one file and reads its table of contents once. It is also smaller: the sources deflate from about
1.2 MB to under 0.5 MB.

The archive holds sources only, no ``.pyc``: zipimport cannot write bytecode, so each process compiles
what it imports, about 60 ms of CPU a process (``benchmarks/snapshot_import.py``, figures in
``benchmarks/README.md``); compiled files would triple the archive, and a ``.pyc`` only serves the one
Python version that wrote it.

The archive is deterministic: the same files give the same bytes (fixed timestamps, sorted names).
"""

from __future__ import annotations

import stat
import zipfile
from collections.abc import Mapping
from pathlib import Path

# A fixed timestamp (zip's earliest), so that an archive's bytes depend on its files' contents only.
ENTRY_TIME = (1980, 1, 1, 0, 0, 0)
FILE_MODE = 0o644
DIR_MODE = 0o755
# The MS-DOS directory flag in a zip entry's external attributes.
DOS_DIRECTORY = 0x10


def folders_of(names: list[str]) -> list[str]:
    """Every folder holding one of ``names`` (paths with ``/``), each once, ending in ``/``, sorted.

    zipimport finds a namespace package's portion (``hydra_plugins``, which Hydra's plugin scan
    walks) only through such a folder entry: without one, the scan misses the launchers.
    """
    return sorted({name.rsplit("/", depth)[0] + "/" for name in names for depth in range(1, name.count("/") + 1)})


def write_archive(path: Path, members: Mapping[str, bytes]) -> None:
    """Write ``members`` (name inside the archive -> content) as a deflated zip at ``path``, with an
    entry for every folder."""
    with zipfile.ZipFile(path, "w") as archive:
        for folder in folders_of(list(members)):
            info = zipfile.ZipInfo(folder, ENTRY_TIME)
            info.external_attr = (stat.S_IFDIR | DIR_MODE) << 16 | DOS_DIRECTORY
            archive.writestr(info, b"")
        for name in sorted(members):
            info = zipfile.ZipInfo(name, ENTRY_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (stat.S_IFREG | FILE_MODE) << 16
            archive.writestr(info, members[name])
