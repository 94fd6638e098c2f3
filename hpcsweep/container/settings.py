"""``hydra.launcher.container``: the runtime each task of a Slurm sweep runs in, its image, and what it sees
of the host. Every value is checked here, without touching the file system (``checks`` does that)."""

# No ``from __future__ import annotations`` and ``Optional``, not ``X | None``: ``ContainerSettings`` is also the
# launcher's structured config (hydra_plugins/hpcsweep_plugins/config.py), whose annotations OmegaConf reads.
import os
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Optional

from hpcsweep.config.validation import _fail, _require
from hpcsweep.container.mounts import Mount, parse_mount

KEY = "hydra.launcher.container"
RUNTIMES = ("none", "pyxis", "apptainer", "oci")
SQUASHFS_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")
"""What an enroot image file's name ends with (``enroot import -o IMAGE.sqsh``)."""
_URI_SCHEMES = ("docker://", "dockerd://")
"""The prefixes enroot (and so pyxis) takes before a registry image; pyxis also takes it without one."""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _is_name(text: Any) -> bool:
    return isinstance(text, str) and _NAME.fullmatch(text) is not None


def is_image_path(image: str) -> bool:
    """Whether pyxis's ``image`` names a squashfs file rather than a registry image: a path that starts with
    ``/``, ``./``, ``../`` or ``~``, or a name ending in ``.sqsh``/``.squashfs``/``.sqfs``."""
    return image.startswith(("/", "./", "../", "~")) or image.endswith(SQUASHFS_SUFFIXES)


def pyxis_uri_problem(uri: str) -> str | None:
    """Why pyxis would not find the registry image ``uri``, or None.

    enroot writes an image as ``[USER@][REGISTRY#]IMAGE[:TAG]``: ``#`` ends the registry. A first part with a
    dot, a port or ``localhost`` before a ``/`` is a registry written the way ``docker pull`` takes it, which
    enroot reads as an image on Docker Hub, and Docker Hub answers 401 (NVIDIA/pyxis#39, #89).
    """
    scheme = next((s for s in _URI_SCHEMES if uri.startswith(s)), "")
    rest = uri[len(scheme):]
    if not rest or any(ch.isspace() for ch in rest):
        return "a registry image [USER@][REGISTRY#]IMAGE[:TAG], or the path of an enroot .sqsh file"
    if "#" in rest or "/" not in rest:
        return None
    first = rest.split("/", 1)[0].rpartition("@")[2]  # USER@ aside
    if "." in first or ":" in first or first == "localhost":
        head, tail = rest.split("/", 1)
        return (f"'#' separates the registry from the image in pyxis's URIs: {scheme}{head}#{tail} (with '/', "
                "enroot looks for the image on Docker Hub, which answers 401)")
    return None


@dataclass(kw_only=True)
class ContainerSettings:
    """The container a Slurm sweep's tasks run in (docs/user/containers.md). ``runtime=none``: none, each
    node's own Python environment runs them."""

    runtime: str = "none"
    """``none``; ``pyxis`` (``srun --container-image``, enroot); ``apptainer`` (``apptainer exec``); ``oci``
    (Slurm's own OCI support, ``srun --container``, with the runtime its ``oci.conf`` names)."""
    image: Optional[str] = None
    """pyxis: an enroot ``.sqsh`` file (imported once: ``enroot import -o IMAGE.sqsh docker://...``) or a
    registry URI (``nvcr.io#nvidia/pytorch:24.05-py3``: ``#`` after the registry); apptainer: a ``.sif`` file
    (or a sandbox folder); oci: the bundle folder (``config.json`` and ``rootfs``). Files are read from the
    login node's shared file system, and relative paths from where the sweep is submitted."""
    mounts: list[str] = field(default_factory=list)
    """More host paths to see inside, ``SRC:DST`` or ``SRC:DST:ro``, besides those hpcsweep mounts itself at
    the same path: the sweep dir, the code snapshot, the model folder, the data and the token cache.
    oci: none; the bundle's ``config.json`` lists its mounts."""
    workdir: Optional[str] = None
    """The working directory inside (absolute); null: the directory the sweep is submitted from, where the
    config's relative paths point. oci: none; the bundle's ``config.json`` sets it."""
    env: list[str] = field(default_factory=list)
    """More host variables whose values win over the image's (names, such as ``NCCL_SOCKET_IFNAME``), besides
    those hpcsweep sets: NCCL's, the offline hub's, ``PYTHONPATH``, ``OMP_NUM_THREADS``."""
    python: str = "python3"
    """The image's Python command, which runs each task (and the token preparation job); a name on the
    image's ``PATH`` or an absolute path inside."""

    def __post_init__(self) -> None:
        _require(self.runtime in RUNTIMES, f"{KEY}.runtime", self.runtime, f"one of {', '.join(RUNTIMES)}")
        if self.runtime == "none":
            for name, value in self._set_keys():
                _fail(f"{KEY}.{name}", value, f"unset while {KEY}.runtime=none (no container); set runtime to use it")
            return
        _require(isinstance(self.image, str) and bool(self.image.strip()), f"{KEY}.image", self.image,
                 f"the image to run with {KEY}.runtime={self.runtime} (docs/user/containers.md)")
        self._check_image()
        for index, text in enumerate(self.mounts):
            parse_mount(text, f"{KEY}.mounts[{index}]")
        if self.workdir is not None:
            _require(isinstance(self.workdir, str) and os.path.isabs(self.workdir) and "," not in self.workdir,
                     f"{KEY}.workdir", self.workdir, "an absolute path inside the container, or null")
        if self.runtime == "oci":
            _require(not self.mounts, f"{KEY}.mounts", self.mounts,
                     "empty with runtime=oci: Slurm's OCI support takes mounts from the bundle's config.json")
            _require(self.workdir is None, f"{KEY}.workdir", self.workdir,
                     "null with runtime=oci: Slurm's OCI support takes it from the bundle's config.json "
                     "(process.cwd)")
        for index, name in enumerate(self.env):
            _require(_is_name(name), f"{KEY}.env[{index}]", name, "a variable name (letters, digits, _)")
        _require(isinstance(self.python, str) and bool(self.python) and not any(
            ch.isspace() or ord(ch) < 32 for ch in self.python), f"{KEY}.python", self.python,
            "one word: the Python on the image's PATH (python3) or its absolute path inside")

    def _set_keys(self) -> list[tuple[str, Any]]:
        def default(f: Any) -> Any:
            return f.default_factory() if f.default is MISSING else f.default

        return [(f.name, getattr(self, f.name)) for f in fields(self)
                if f.name != "runtime" and getattr(self, f.name) != default(f)]

    def _check_image(self) -> None:
        image, key = str(self.image), f"{KEY}.image"
        is_uri = "://" in image
        if self.runtime == "pyxis" and not is_image_path(image):
            problem = pyxis_uri_problem(image)
            if problem:
                _fail(key, image, problem)
        elif self.runtime == "apptainer" and is_uri:
            _fail(key, image, "a .sif file on shared storage, built once (apptainer build IMAGE.sif "
                  f"{image}), not a URI that every task would pull")
        elif self.runtime == "oci" and is_uri:
            _fail(key, image, "an OCI bundle folder (config.json and rootfs) on shared storage")

    @property
    def image_is_path(self) -> bool:
        """Whether ``image`` names a file or folder (not a registry image that pyxis pulls)."""
        return self.runtime in ("apptainer", "oci") or (self.runtime == "pyxis" and is_image_path(str(self.image)))

    def user_mounts(self) -> list[Mount]:
        """``mounts``, parsed."""
        return [parse_mount(text, f"{KEY}.mounts[{i}]") for i, text in enumerate(self.mounts)]


def container_settings(values: Mapping[str, Any] | None) -> ContainerSettings:
    """The settings of ``hydra.launcher.container`` (absent or null: ``runtime=none``); ``ValueError`` naming
    the key of an unknown or refused value."""
    values = dict(values or {})
    known = {f.name for f in fields(ContainerSettings)}
    for name in values:
        _require(name in known, f"{KEY}.{name}", values[name], f"a key of {KEY}: {', '.join(sorted(known))}")
    for name in ("mounts", "env"):
        if values.get(name) is None:
            values.pop(name, None)
        elif not isinstance(values[name], (list, tuple)):
            _fail(f"{KEY}.{name}", values[name], "a list")
        else:
            values[name] = list(values[name])
    return ContainerSettings(**values)
