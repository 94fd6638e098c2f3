"""What a trial's ``environment.json`` says of its container: the runtime and image it was submitted with and
the image's identity as the login node saw it then (``submitted_record``), and what ran inside, seen from
the trial's own process (the OS release here, ``read_os_release``, beside the Python and torch that
``hpcsweep.trial.records`` records).

The identity is taken on the login node because the image is rarely visible inside its own container (a
Slurm OCI bundle never is); what ran inside is taken on the node, so that a record says where the trial
really ran, not where it was asked to.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from collections.abc import Mapping
from typing import Any

from hpcsweep.container.checks import image_path
from hpcsweep.container.settings import ContainerSettings

OS_RELEASE = "/etc/os-release"
OS_RELEASE_KEYS = ("PRETTY_NAME", "ID", "VERSION_ID")
"""The fields of ``/etc/os-release`` a record keeps."""


def _mtime(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="seconds")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def image_identity(settings: ContainerSettings, cwd: str) -> dict[str, Any] | None:
    """The image as it is now: a file's (``.sqsh``, ``.sif``) size and mtime; an OCI bundle's
    ``config.json`` size, mtime and SHA-256 (its root file system is too large to hash at every submit);
    a registry URI's text. None without a container. ``OSError`` when the image cannot be read."""
    if settings.runtime == "none":
        return None
    path = image_path(settings, cwd)
    if path is None:
        return {"kind": "uri", "uri": str(settings.image)}
    if os.path.isdir(path):
        config = os.path.join(path, "config.json")
        info = os.stat(config)
        return {"kind": "bundle", "path": path, "config_json": {
            "size": info.st_size, "mtime": _mtime(info.st_mtime), "sha256": _sha256(config)}}
    info = os.stat(path)
    return {"kind": "file", "path": path, "size": info.st_size, "mtime": _mtime(info.st_mtime)}


def submitted_record(settings: ContainerSettings, cwd: str) -> dict[str, Any] | None:
    """``runtime``, ``image`` (as given), ``identity`` (``image_identity``) and ``workdir`` of a submission
    from ``cwd``; None for ``runtime=none``. ``workdir`` is where each task works inside: ``workdir`` or
    ``cwd``, where the sweep's relative paths point (Slurm OCI starts a task in its bundle's ``process.cwd``,
    so its tasks change there themselves: ``task_workdir``)."""
    if settings.runtime == "none":
        return None
    return {"runtime": settings.runtime, "image": str(settings.image), "identity": image_identity(settings, cwd),
            "workdir": settings.workdir or os.path.normpath(cwd)}


def task_workdir(record: Mapping[str, Any] | None) -> str | None:
    """The directory a task must change to itself as it starts: the submission's ``workdir`` under Slurm
    OCI, whose tasks start in the bundle's ``process.cwd``; None where the runtime starts it there (pyxis's
    ``--container-workdir``, Apptainer's ``--pwd``) or without a container."""
    if not record or record.get("runtime") != "oci":
        return None
    return record.get("workdir")


def parse_os_release(text: str) -> dict[str, str]:
    """``/etc/os-release``'s ``OS_RELEASE_KEYS`` (``PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"``), unquoted."""
    found = {}
    for line in text.splitlines():
        name, eq, value = line.strip().partition("=")
        if eq and name in OS_RELEASE_KEYS:
            found[name] = value.strip().strip("'\"")
    return found


def read_os_release(path: str = OS_RELEASE) -> str | None:
    """The text of ``/etc/os-release`` here, None when there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def container_of(record: Mapping[str, Any] | None) -> str | None:
    """The line that names a trial's image in a model card (``oci image /path/bundle``), from its
    ``environment.json``'s ``container``; None when it ran in none."""
    if not record:
        return None
    identity = record.get("identity") or {}
    where = identity.get("path") or identity.get("uri") or record.get("image")
    return f"{record.get('runtime')} image {where}"
