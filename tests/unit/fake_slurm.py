"""Slurm client commands on PATH that print literal text and log their arguments.

They stand in for ``sacct``, ``squeue`` and ``scontrol`` so that the status/report commands run
their real ``hpcsweep.slurm.commands`` calls (argument lists, exit codes) without a cluster.
The real commands' output and flags are covered by ``tests/cluster/test_report_status.py``.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

COMMANDS = ("sacct", "squeue", "scontrol")


class FakeSlurm:
    """Set what each command prints with ``answer``; read back how it was called with ``calls``."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        bin_dir.mkdir()
        for command in COMMANDS:
            out, log = bin_dir / f"{command}.out", bin_dir / f"{command}.log"
            script = bin_dir / command
            script.write_text(
                "#!/bin/sh\n"
                f"echo \"$*\" >> {shlex.quote(str(log))}\n"
                f"[ -f {shlex.quote(str(out))} ] || {{ echo '{command}: not answered in this test' >&2; exit 1; }}\n"
                f"cat {shlex.quote(str(out))}\n"
            )
            script.chmod(0o755)

    def answer(self, command: str, text: str) -> None:
        """What ``command`` prints from now on (exit 0)."""
        (self.bin_dir / f"{command}.out").write_text(text)

    def calls(self, command: str) -> list[str]:
        """The argument strings ``command`` was called with, oldest first."""
        log = self.bin_dir / f"{command}.log"
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """Fake ``sacct``/``squeue``/``scontrol`` first on PATH for this test."""
    fake = FakeSlurm(tmp_path / "fake-slurm-bin")
    monkeypatch.setenv("PATH", f"{fake.bin_dir}{os.pathsep}{os.environ['PATH']}")
    return fake
