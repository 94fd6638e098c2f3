"""The lm-eval task folder a trial scores on (``tasks.include_path``), read without lm-eval or torch.

The login node checks a sweep's tasks before anything is submitted: lm-eval is installed, the folder
exists, and every name of ``tasks.names`` is a task (or group) one of its YAML files defines. lm-eval's
own task index is not used: importing lm-eval imports torch and the datasets package, which the
login node's submit path leaves out.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from hpcsweep.config import TasksConfig, TrialConfig, tokenizer_folder

INSTALL_LINE = "pip install 'hpcsweep[tasks]' (lm-eval[hf]==0.4.13)"
"""How to install what task scores need."""


class _TaskYamlLoader(yaml.SafeLoader):
    """A safe loader that reads lm-eval's ``!function module.name`` tags as plain strings."""


_TaskYamlLoader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node)
                                      if isinstance(node, yaml.ScalarNode) else None)


def names_in_yaml(values: Any) -> list[str]:
    """The task, group and tag names one lm-eval YAML file defines (pure)."""
    if not isinstance(values, dict):
        return []
    names = [values[key] for key in ("task", "group") if isinstance(values.get(key), str)]
    tags = values.get("tag")
    names += [tags] if isinstance(tags, str) else [t for t in tags or [] if isinstance(t, str)]
    return names


def folder_task_names(include_path: Path) -> list[str]:
    """Every task, group and tag name the YAML files under ``include_path`` define, sorted."""
    names: set[str] = set()
    for path in sorted(include_path.rglob("*.yaml")):
        try:
            values = yaml.load(path.read_text(encoding="utf-8"), Loader=_TaskYamlLoader)
        except yaml.YAMLError as err:
            raise ValueError(f"tasks.include_path={str(include_path)!r} is not allowed: {path} is no YAML: {err}") from None
        names.update(names_in_yaml(values))
    return sorted(names)


def unknown_names(wanted: Iterable[str], known: Iterable[str]) -> list[str]:
    """The names of ``wanted`` that are not in ``known``, in their order."""
    known = set(known)
    return [name for name in wanted if name not in known]


def check_tasks(trial: TrialConfig, *, lm_eval_installed: bool | None = None) -> None:
    """Raise ``ValueError`` naming the key when a trial's tasks cannot run: lm-eval missing (with the
    pip line), no tokenizer, no such folder, a name no YAML file there defines (with the list), or
    FSDP (every rank scores on its whole model: a sharded one cannot); ``trainer.parallel=auto`` that
    chooses FSDP is refused with the memory plan (``hpcsweep.sweep.memory_check.tasks_refusal``)."""
    tasks: TasksConfig = trial.tasks
    if not tasks.names:
        return
    if lm_eval_installed is None:
        lm_eval_installed = importlib.util.find_spec("lm_eval") is not None
    if not lm_eval_installed:
        raise ValueError(f"tasks.names={tasks.names} is not allowed here: lm-evaluation-harness is not installed: "
                         f"{INSTALL_LINE}")
    if tokenizer_folder(trial.data, trial.model) is None:
        raise ValueError(f"tasks.names={tasks.names} is not allowed: task scores need a tokenizer, "
                         "from model.path or data.tokenizer")
    if trial.trainer.parallel == "fsdp":
        raise ValueError("trainer.parallel='fsdp' is not allowed with tasks.names: task scores run on each rank's "
                         "whole model; use trainer.parallel=ddp (or auto, where the trial fits a GPU)")
    folder = Path(str(tasks.include_path)).expanduser()
    if not folder.is_dir():
        raise ValueError(f"tasks.include_path={tasks.include_path!r} is not allowed: no such folder")
    known = folder_task_names(folder)
    unknown = unknown_names(tasks.names, known)
    if unknown:
        raise ValueError(f"tasks.names={tasks.names} is not allowed: {', '.join(unknown)} not defined in "
                         f"{tasks.include_path} (its tasks: {', '.join(known) or 'none'})")
