"""What the login node checks of ``hydra.launcher.container`` before anything is queued: the image and the
mount sources can be read from here (the shared file system the nodes see too), and a local sweep is not
asked for a runtime it cannot use. Each refusal is one ``ValueError`` naming the key."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from hpcsweep.container.settings import KEY, ContainerSettings

RUNTIME_PROGRAMS = {"pyxis": "enroot", "apptainer": "apptainer", "oci": "runc"}
"""The program each runtime runs containers with on a node (Slurm's OCI support: the one this project's
``oci.conf`` names)."""


def image_path(settings: ContainerSettings, cwd: str) -> str | None:
    """The absolute path of the image, bundle or ``.sif`` (relative ones from ``cwd``); None for a registry URI."""
    if settings.runtime == "none" or not settings.image_is_path:
        return None
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(str(settings.image))))


def image_problem(settings: ContainerSettings, path: str) -> str | None:
    """Why the login node cannot use the image at ``path`` for ``settings.runtime``, or None."""
    if not os.path.exists(path):
        return f"{path} does not exist"
    if not os.access(path, os.R_OK):
        return f"{path} cannot be read from this node (permissions)"
    if settings.runtime == "pyxis" and not os.path.isfile(path):
        return f"{path} is not a file: pyxis takes an enroot .sqsh file (enroot import -o IMAGE.sqsh docker://...)"
    if settings.runtime == "oci":
        if not os.path.isdir(path):
            return f"{path} is not a folder: Slurm's OCI support takes a bundle folder (config.json and rootfs)"
        config = os.path.join(path, "config.json")
        if not os.access(config, os.R_OK):
            return f"{path} holds no readable config.json: not an OCI bundle"
    return None


def check_image(settings: ContainerSettings, cwd: str) -> None:
    """``ValueError`` unless the image file or bundle exists and can be read here; a registry URI passes."""
    path = image_path(settings, cwd)
    problem = None if path is None else image_problem(settings, path)
    if problem:
        raise ValueError(f"{KEY}.image={settings.image!r} is not allowed: {problem} (the image must be on storage "
                         "the login node and the nodes share)")


def check_mount_sources(settings: ContainerSettings) -> None:
    """``ValueError`` naming the first of ``mounts`` whose source does not exist here."""
    for index, mount in enumerate(settings.user_mounts()):
        if not os.path.exists(mount.source):
            raise ValueError(f"{KEY}.mounts[{index}]={settings.mounts[index]!r} is not allowed: its source "
                             f"{mount.source} does not exist on this node")


def check_on_login_node(settings: ContainerSettings, cwd: str) -> None:
    """The checks of a Slurm sweep: the image and every mount source are there."""
    check_image(settings, cwd)
    check_mount_sources(settings)


def check_local(settings: ContainerSettings, which: Callable[[str], str | None] = shutil.which) -> None:
    """``ValueError`` for a local sweep (no Slurm controller answered) asked to use a container runtime.

    pyxis is a plugin of Slurm's ``srun`` and Slurm's OCI support runs through ``srun``: neither exists
    without Slurm. Apptainer would need its program here, and running a local sweep's trials in it is not
    built yet. ``which`` finds a program on ``PATH``.
    """
    if settings.runtime == "none":
        return
    program = RUNTIME_PROGRAMS[settings.runtime]
    missing = which(program) is None
    head = f"{KEY}.runtime={settings.runtime!r} is not allowed here: no Slurm controller answered, so the trials " \
           "would run on this machine"
    tail = f"; run the sweep where sbatch reaches a Slurm controller, or set {KEY}.runtime=none"
    if settings.runtime in ("pyxis", "oci"):
        how = "pyxis is a plugin of Slurm's srun" if settings.runtime == "pyxis" else "Slurm's OCI support runs through srun"
        also = f" ({program} is not installed here either)" if missing else ""
        raise ValueError(f"{head}, and {how}{also}{tail}")
    if missing:
        raise ValueError(f"{head}, and {program} is not installed here (not on PATH){tail}")
    raise ValueError(f"{head}, and running a local sweep's trials in Apptainer is not built yet{tail}")
