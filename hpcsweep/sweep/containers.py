"""A Slurm sweep's tasks in the site's container (``hydra.launcher.container``, ``hpcsweep.container``): the
settings checked before anything is queued, the variables forced inside, the paths mounted, and the
settings every job of the submission (the trials' arrays and the token preparation job) is submitted with.

The launch is computed from the launcher settings, the sweep dir, the code snapshot and the paths the app's
trials read (``TrialHook.container_paths``), each time it is needed: the checks before submitting and the
submission compute the same one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcsweep.config import TEMPLATE_KINDS, TrialConfig
from hpcsweep.container.checks import check_local, check_on_login_node
from hpcsweep.container.flags import ContainerLaunch, container_launch
from hpcsweep.container.record import submitted_record, task_workdir
from hpcsweep.container.settings import ContainerSettings, container_settings
from hpcsweep.files.token_cache import glob_patterns
from hpcsweep.model.offline import HUB_OFFLINE_VARIABLES
from hpcsweep.sweep.hooks import SweepTrial, hook_of
from hpcsweep.sweep.snapshot import with_snapshot
from hpcsweep.train.fault import FAULT_VAR
from hpcsweep.trial.budget_watch import POLL_VAR
from hpcsweep.trial.nccl import exported_names

log = logging.getLogger(__name__)

LAUNCH_KEY = "_container_launch"
"""The launcher settings a submission's jobs are submitted with carry their ``ContainerLaunch`` under this
key (``with_container``): ``allocation.executor_parameters`` turns it into submitit's parameters, the token
preparation into its job step. Never recorded (``sweep.json`` keeps the settings as given)."""

RECORD_KEY = "_container_record"
"""The launcher settings each array task is handed carry the container's record under this key
(``record_for_tasks``): the runtime, the image and its identity as the login node saw it at submission, which
each trial's ``environment.json`` repeats (``hpcsweep.container.record``). Never in ``sweep.json``."""

TASK_VARIABLES = ("PYTHONPATH", "PYTHONSAFEPATH", "OMP_NUM_THREADS")
"""Set on a node outside hpcsweep's named facts: the code snapshot's setup lines (``snapshot_setup_lines``)
export the first two, the launch phase ``OMP_NUM_THREADS`` (or keeps the user's)."""


def forced_variables() -> list[str]:
    """Every variable hpcsweep sets on a node, whose host value must win over an image's: the NCCL presets'
    (with their debug and HCA/topology variables), the offline hub's, the code snapshot's ``PYTHONPATH`` and
    ``PYTHONSAFEPATH``, ``OMP_NUM_THREADS``, the documented fault hook and the budget watch's poll."""
    return list(dict.fromkeys([*exported_names(), *HUB_OFFLINE_VARIABLES, *TASK_VARIABLES, FAULT_VAR, POLL_VAR]))


def _has_magic(part: str) -> bool:
    return any(ch in part for ch in "*?[")


def glob_folder(pattern: str) -> str:
    """The folder a ``data.files`` glob reads under: its path up to the first part with a wildcard (a plain
    file's folder)."""
    parts = os.path.expanduser(pattern).split("/")
    static = []
    for part in parts[:-1]:
        if _has_magic(part):
            break
        static.append(part)
    return "/".join(static) or ("/" if pattern.startswith("/") else ".")


def _folder_of(path: str) -> str:
    return os.path.dirname(os.path.expanduser(path)) or "."


def _tracking_folder(uri: str | None) -> str | None:
    """The folder of a local MLflow store (``sqlite:///PATH``, ``file:///PATH``); None for a server or none."""
    if uri is None:
        return None
    if uri.startswith("sqlite:///"):
        return _folder_of(uri.removeprefix("sqlite:///"))
    if uri.startswith("file:"):
        return uri.removeprefix("file:").removeprefix("//") or None
    return None


def trial_paths(trial: TrialConfig) -> list[tuple[str, str]]:
    """What an hpcsweep trial reads or writes outside its sweep dir, each with the key that names it: the
    model folder, a DPO reference folder, the token file's folder, the text, chat or preference files' folders,
    the token cache, the tokenizer and chat template, the lm-eval task folder, the NCCL topology file's folder,
    a local MLflow store."""
    data, paths = trial.data, []
    if trial.model.path:
        paths.append(("model.path", trial.model.path))
    if trial.objective.reference:
        paths.append(("objective.reference", trial.objective.reference))
    if data.kind == "file" and data.path:
        paths.append(("data.path", _folder_of(data.path)))
    if data.kind != "file" and data.files:  # files tokenized into the cache (text, chat, preference)
        paths += [("data.files", glob_folder(pattern)) for pattern in glob_patterns(data.files)]
        paths.append(("data.cache_dir", data.cache_dir))
    if data.tokenizer:
        paths.append(("data.tokenizer", data.tokenizer))
    if data.kind in TEMPLATE_KINDS and data.chat_template:
        paths.append(("data.chat_template", _folder_of(data.chat_template)))
    if trial.tasks.names and trial.tasks.include_path:
        paths.append(("tasks.include_path", trial.tasks.include_path))
    if trial.nccl.topo_file:
        paths.append(("nccl.topo_file", _folder_of(trial.nccl.topo_file)))
    store = _tracking_folder(trial.logging.mlflow.tracking_uri) if "mlflow" in trial.logging.backends else None
    if store:
        paths.append(("logging.mlflow.tracking_uri", store))
    return paths


def settings_of(params: Mapping[str, Any]) -> ContainerSettings:
    """``hydra.launcher.container`` of these launcher settings (absent: ``runtime=none``); ``ValueError``."""
    return container_settings(params.get("container"))


def _submitit_folder(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """submitit's folder (``hydra.launcher.submitit_folder``) up to its first part with a ``%`` (``%j``)."""
    folder = params.get("submitit_folder")
    static = []
    for part in str(folder or "").split("/"):
        if "%" in part:
            break
        static.append(part)
    return [("hydra.launcher.submitit_folder", "/".join(static) or "/")] if folder and static else []


def sweep_launch(
    launcher: Any, trials: Sequence[SweepTrial], params: Mapping[str, Any], sweep_dir: Path,
    code_dir: Path | None, cwd: Path | None = None, create: bool = False,
) -> ContainerLaunch | None:
    """The container launch of this submission (None: no container): the sweep dir, the code snapshot,
    submitit's folder and the app's trials' paths (``hook.container_paths``) mounted at the same paths,
    the working directory where the sweep is submitted from (``cwd``). ``create``: make each of those
    folders that does not exist yet (the token cache before its first entry), as a runtime mounts only what
    exists. ``ValueError`` naming the key."""
    settings = settings_of(params)
    if settings.runtime == "none":
        return None
    cwd = cwd or Path.cwd()
    own = [("the sweep dir", str(sweep_dir)), *_submitit_folder(params)]
    if code_dir is not None:
        own.append(("the code snapshot", str(code_dir)))
    own += hook_of(launcher.task_function).container_paths(trials)
    own = [(what, str(cwd / Path(path).expanduser())) for what, path in own]
    if create:
        for _, path in own:
            Path(path).mkdir(parents=True, exist_ok=True)
    return container_launch(settings, own, forced_variables(), str(cwd))


def check_container(
    launcher: Any, trials: Sequence[SweepTrial], params: Mapping[str, Any], sweep_dir: Path, cwd: Path | None = None
) -> None:
    """A Slurm sweep's container settings, before anything is queued: their values, the image and the mount
    sources readable from here, every path hpcsweep mounts mountable (``ValueError`` naming the key)."""
    settings = settings_of(params)
    check_on_login_node(settings, str(cwd or Path.cwd()))
    sweep_launch(launcher, trials, params, sweep_dir, None, cwd)
    if settings.runtime == "pyxis" and not settings.image_is_path:
        log.warning("hydra.launcher.container.image=%s: every task imports it from the registry, slowly and into "
                    "each node's /run (pyxis#41, #53); import it once to shared storage and name the file: "
                    "enroot import -o IMAGE.sqsh 'docker://%s'", settings.image, settings.image)


def check_local_container(launcher_config: Any) -> None:
    """A local sweep's refusal of ``hydra.launcher.container`` (the auto launcher's, when no Slurm controller
    answered): ``ValueError`` for any runtime but ``none``. ``launcher_config`` is ``hydra.launcher``."""
    from omegaconf import OmegaConf

    values = launcher_config.get("container") if launcher_config is not None else None
    if OmegaConf.is_config(values):
        values = OmegaConf.to_container(values, resolve=True)
    check_local(container_settings(values))  # type: ignore[arg-type]


def with_container(params: Mapping[str, Any], launch: ContainerLaunch | None) -> dict[str, Any]:
    """The launcher settings to submit with, given the launch: its setup lines after the others (the code
    snapshot's, which set what it forces), the launch under ``LAUNCH_KEY``."""
    out = dict(params)
    if launch is not None:
        out["setup"] = [*(params.get("setup") or []), *launch.setup]
        out[LAUNCH_KEY] = launch
    return out


def submission_params(
    launcher: Any, trials: Sequence[SweepTrial], params: Mapping[str, Any], sweep_dir: Path, code_dir: Path | None
) -> dict[str, Any]:
    """The launcher settings a submission's jobs (its arrays, its token preparation) are submitted with: the
    code snapshot's setup lines (``with_snapshot``), then the container's launch (``with_container``), the
    folders it mounts made where missing."""
    launch = sweep_launch(launcher, trials, params, sweep_dir, code_dir, create=True)
    return with_container(with_snapshot(params, code_dir), launch)


def record_for_tasks(params: Mapping[str, Any], cwd: Path | None = None) -> dict[str, Any]:
    """The launcher settings the array tasks are handed (the pickled launcher's): ``params`` with the
    container's record (``submitted_record``) under ``RECORD_KEY``. ``ValueError`` naming the image when it
    cannot be read now (the checks before submitting passed it a moment ago)."""
    settings = settings_of(params)
    try:
        record = submitted_record(settings, str(cwd or Path.cwd()))
    except OSError as err:
        raise ValueError(f"hydra.launcher.container.image={settings.image!r} is not allowed: it cannot be "
                         f"read from this node ({err})") from err
    return {**params, RECORD_KEY: record}


def record_of(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The container record ``record_for_tasks`` put in these settings (None: no container)."""
    record = params.get(RECORD_KEY)
    return dict(record) if isinstance(record, Mapping) else None


def enter_task_workdir(params: Mapping[str, Any]) -> None:
    """In an array task: change to the directory the sweep was submitted from when the runtime started the
    task elsewhere (Slurm OCI: the bundle's ``process.cwd``), so that the sweep's relative paths (Hydra's
    ``multirun/...``) mean what they meant on the login node. ``params``: the settings the task was handed."""
    workdir = task_workdir(record_of(params))
    if workdir is not None:
        os.chdir(workdir)


def launch_of(params: Mapping[str, Any]) -> ContainerLaunch | None:
    """The launch that ``with_container`` put in these settings, if any."""
    launch = params.get(LAUNCH_KEY)
    return launch if isinstance(launch, ContainerLaunch) else None
