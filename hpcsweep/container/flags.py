"""Each runtime's command-line words, written by one pure function each, and the launch they make together.

A Slurm sweep's task runs as ``srun [SRUN_ARGS] PYTHON -u -m submitit.core._submit FOLDER`` (submitit's
batch script), after the script's setup lines. A runtime enters in one of two places: pyxis and Slurm's OCI
support are ``srun`` flags; Apptainer is a command in front of the image's Python. ``ContainerLaunch`` holds
both, the image's Python, and the setup lines a runtime needs.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from hpcsweep.container.mounts import Mount, all_mounts, same_path_mounts
from hpcsweep.container.settings import KEY, ContainerSettings


def pyxis_flags(image: str, mounts: Sequence[Mount], workdir: str | None, forced_env: Sequence[str]) -> list[str]:
    """pyxis's ``srun`` flags.

    The image's own ``ENV`` wins over the job's environment unless a name is listed in ``--container-env``
    (NVIDIA/pyxis#124), so every variable hpcsweep sets (``forced_env``) is listed: a site's ``NCCL_IB_HCA``
    or the code snapshot's ``PYTHONPATH`` must not be undone by the image. The home directory stays out: a
    user's ``~/.local`` packages would shadow the image's.
    """
    flags = [f"--container-image={image}"]
    if mounts:
        flags.append("--container-mounts=" + ",".join(m.text() for m in mounts))
    if workdir:
        flags.append(f"--container-workdir={workdir}")
    if forced_env:
        flags.append("--container-env=" + ",".join(forced_env))
    return [*flags, "--no-container-mount-home"]


def apptainer_words(image: str, mounts: Sequence[Mount], workdir: str | None) -> list[str]:
    """Apptainer's command in front of the image's Python: ``apptainer exec --nv -B ... --pwd DIR IMAGE``.

    Never ``--cleanenv``: it strips the ``SLURM_*`` variables the task's rendezvous is computed from, and
    the launch breaks. Without it the host's environment passes through (the forced variables are
    ``apptainer_setup``'s).
    """
    words = ["apptainer", "exec", "--nv"]
    if mounts:
        words += ["-B", ",".join(m.text() for m in mounts)]
    if workdir:
        words += ["--pwd", workdir]
    return [*words, image]


APPTAINER_CACHE_LINE = 'export APPTAINER_CACHEDIR="${APPTAINER_CACHEDIR:-${TMPDIR:-/tmp}/apptainer-cache-$(id -u)}"'
"""Apptainer's cache off ``$HOME`` (it fills home quotas), unless the site or the user put it elsewhere."""


def apptainer_setup(forced_env: Sequence[str]) -> list[str]:
    """The batch-script lines before an Apptainer task: its cache away from ``$HOME``, and each forced
    variable that is set copied to ``APPTAINERENV_NAME``.

    Apptainer passes the host's environment through (no ``--cleanenv``), but a variable the image sets
    (Docker ``ENV``, ``%environment``) wins over the host's value; an ``APPTAINERENV_NAME`` wins over the
    image's. Not ``--env NAME=VALUE``: it separates variables at commas (``NCCL_IB_HCA=mlx5_0,mlx5_1``), and
    it would set a variable the host leaves unset to an empty value.
    """
    lines = [APPTAINER_CACHE_LINE]
    if forced_env:
        lines.append(f'for name in {" ".join(forced_env)}; do '
                     'value="$(printenv "$name")" && export "APPTAINERENV_$name=$value"; done')
    return lines


def oci_flags(bundle: str) -> list[str]:
    """Slurm's own OCI support: ``--container=BUNDLE``; mounts and the working directory are the bundle's
    ``config.json``'s, and the runtime the one ``oci.conf`` names."""
    return [f"--container={bundle}"]


@dataclass(frozen=True)
class ContainerLaunch:
    """How each task of a sweep starts in its container: ``srun`` flags, words in front of the image's
    Python, that Python, and setup lines for the batch script."""

    runtime: str
    srun_args: tuple[str, ...] = ()
    prefix: tuple[str, ...] = ()
    python: str = "python3"
    setup: tuple[str, ...] = ()

    @property
    def python_command(self) -> str:
        """The shell command that starts the image's Python (submitit's ``python``)."""
        return shlex.join([*self.prefix, self.python])

    def step_prefix(self) -> list[str]:
        """What runs the image's Python inside from a batch script of one task (the token preparation's):
        a job step, ``srun --ntasks=1`` with the flags (pyxis, oci), or the prefix (apptainer)."""
        srun = ["srun", "--ntasks=1", *self.srun_args] if self.srun_args else []
        return [*srun, *self.prefix]


def _unmountable(path: str) -> bool:
    return "," in path or ":" in path


def container_launch(
    settings: ContainerSettings, own_paths: Sequence[tuple[str, str]], forced_env: Sequence[str], cwd: str
) -> ContainerLaunch | None:
    """The launch of ``settings`` (None for ``runtime=none``).

    ``own_paths`` are ``(what, path)``: each path hpcsweep mounts at the same path inside, with what it is
    (``the sweep dir``, ``model.path``, ...), relative ones from ``cwd``, the directory the sweep is
    submitted from, which is also the working directory unless ``workdir`` says otherwise. ``forced_env``:
    the variables whose host values must win over the image's. ``ValueError`` for a path that neither
    pyxis nor Apptainer can mount (a comma or colon in it).
    """
    if settings.runtime == "none":
        return None
    image = str(settings.image)
    if settings.image_is_path:
        image = os.path.normpath(os.path.join(cwd, os.path.expanduser(image)))
    if settings.runtime == "oci":
        return ContainerLaunch("oci", srun_args=tuple(oci_flags(image)), python=settings.python)
    absolute = []
    for what, path in own_paths:
        path = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
        if _unmountable(path):
            raise ValueError(f"{what}={path!r} is not allowed with {KEY}.runtime={settings.runtime}: it is mounted "
                             "at the same path inside, and mounts cannot hold a comma or a colon")
        absolute.append(path)
    mounts = all_mounts(same_path_mounts(absolute), settings.user_mounts())
    workdir = settings.workdir or os.path.normpath(cwd)
    forced = list(dict.fromkeys([*forced_env, *settings.env]))
    if settings.runtime == "pyxis":
        return ContainerLaunch("pyxis", srun_args=tuple(pyxis_flags(image, mounts, workdir, forced)),
                               python=settings.python)
    return ContainerLaunch("apptainer", prefix=tuple(apptainer_words(image, mounts, workdir)), python=settings.python,
                           setup=tuple(apptainer_setup(forced)))
