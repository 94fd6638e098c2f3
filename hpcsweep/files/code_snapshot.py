"""Where a sweep's code snapshot lives and what its ``SNAPSHOT.json`` says.

The login node writes the snapshot (``hpcsweep.sweep.snapshot``); every trial reads this record
back to say in its ``environment.json`` which code it ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The snapshot's folder inside SWEEP_DIR; array tasks put it first on PYTHONPATH.
SNAPSHOT_DIR = ".code"
SNAPSHOT_FILE = "SNAPSHOT.json"
# hpcsweep's own packages inside the snapshot: one zip archive that Python imports from (zipimport).
ARCHIVE_FILE = "hpcsweep.zip"


def snapshot_dir_of(module_file: str | Path) -> Path | None:
    """The snapshot folder ``module_file`` was imported from, or None when it is not in one.

    A module imported from the snapshot's archive has a path through it
    (``.code/hpcsweep.zip/hpcsweep/...``), so the archive's folder is found the same way.
    """
    for parent in Path(module_file).resolve().parents:
        if parent.name == SNAPSHOT_DIR and (parent / SNAPSHOT_FILE).is_file():
            return parent
    return None


def read_snapshot_record(code_dir: Path) -> dict[str, Any]:
    """``path``, ``commit`` and ``diff_sha256`` of the snapshot at ``code_dir``, from its ``SNAPSHOT.json``."""
    record = json.loads((code_dir / SNAPSHOT_FILE).read_text())
    return {"path": str(code_dir), "commit": record.get("commit"), "diff_sha256": record.get("diff_sha256")}
