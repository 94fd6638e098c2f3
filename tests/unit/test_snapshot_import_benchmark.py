"""``benchmarks/snapshot_import.py`` runs, on one light module: its three layouts import the same code from where
they say, so the import-time figures of the snapshot's archive cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "snapshot_import.py"


def test_it_times_the_loose_files_the_archive_and_the_archive_with_bytecode():
    out = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "1", "--modules", "hpcsweep.config"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("snapshot: ") and "archive " in lines[0] and "with .pyc " in lines[0]
    assert lines[1] == "import hpcsweep.config (CPU ms, median of 1):"
    assert [line.split("  ")[1].strip() for line in lines[2:]] == [
        "loose (warm __pycache__)", "archive", "archive with .pyc"]
