"""Which hpcsweep a trial ran: its version and the commit of its install, editable or not.

``git_commit`` in ``environment.json`` is the checkout the imported code sits in, null when a sweep runs
from a data folder with hpcsweep installed elsewhere. This record names hpcsweep itself wherever it is:
the git checkout its package lies in (an editable install, or a checkout on the path), else the commit
pip recorded for an install from a repository (PEP 610 ``direct_url.json``: ``vcs_info.commit_id``).
A sweep's code snapshot records it when it is taken, so a trial that imports the snapshot names the
hpcsweep that was submitted, not the checkout as it is when the trial starts.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

GIT_TIMEOUT_S = 10
INSTALL_RECORD_KEY = "hpcsweep"
"""The key of this record in ``environment.json`` and in a code snapshot's ``SNAPSHOT.json``."""


def _git(folder: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def install_record(version: str, package_dir: Path | None, direct_url: str | None,
                   git: Callable[..., str | None] = _git) -> dict[str, Any]:
    """``{"version", "commit", "dirty", "source"}`` of an hpcsweep whose package lies in ``package_dir``
    (None: not on a file system, a zip) and whose distribution's ``direct_url.json`` is ``direct_url``.

    ``source`` says where the commit came from: ``git checkout DIR``, ``pip install from URL``, or why
    there is none. ``git`` runs ``git -C FOLDER ARGS...`` (the test seam)."""
    folders = [package_dir] if package_dir is not None else []
    url = json.loads(direct_url) if direct_url else {}
    if url.get("dir_info", {}).get("editable") and url.get("url", "").startswith("file://"):
        folders.append(Path(unquote(urlparse(url["url"]).path)))
    for folder in folders:
        top = git(folder, "rev-parse", "--show-toplevel")
        commit = git(folder, "rev-parse", "HEAD") if top else None
        if commit:
            status = git(folder, "status", "--porcelain", "--untracked-files=no")
            return {"version": version, "commit": commit, "dirty": None if status is None else bool(status),
                    "source": f"git checkout {top}"}
    vcs = url.get("vcs_info") or {}
    if vcs.get("commit_id"):
        return {"version": version, "commit": vcs["commit_id"], "dirty": False,
                "source": f"pip install from {url.get('url')}"}
    return {"version": version, "commit": None, "dirty": None,
            "source": "unknown: installed from no git checkout or repository"}


def this_install() -> dict[str, Any]:
    """:func:`install_record` of the hpcsweep imported here."""
    import importlib.metadata

    import hpcsweep

    package_dir = Path(hpcsweep.__file__).resolve().parent
    try:
        direct_url = importlib.metadata.distribution("hpcsweep").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        direct_url = None
    # Imported from a zip (a code snapshot's archive): no folder git could read.
    return install_record(hpcsweep.__version__, package_dir if package_dir.is_dir() else None, direct_url)


def recorded_install(code_dir: Path | None) -> dict[str, Any]:
    """The hpcsweep a trial runs: the one its code snapshot ``code_dir`` recorded when it was taken, else
    the one imported here (a local trial, or a snapshot taken before it recorded hpcsweep)."""
    from hpcsweep.files.code_snapshot import SNAPSHOT_FILE

    if code_dir is not None:
        recorded = json.loads((code_dir / SNAPSHOT_FILE).read_text()).get(INSTALL_RECORD_KEY)
        if recorded:
            return dict(recorded)
    return this_install()
