"""The ``tasks`` group: lm-evaluation-harness task scores, and the ``tasks.NAME.METRIC`` key naming one."""

from __future__ import annotations

from dataclasses import dataclass, field

from .validation import _require


def _task_key(key: str) -> tuple[str, str] | None:
    """``(NAME, METRIC)`` of ``tasks.NAME.METRIC``, else None."""
    parts = key.split(".")
    return (parts[1], parts[2]) if len(parts) == 3 and parts[0] == "tasks" and all(parts) else None


@dataclass(kw_only=True)
class TasksConfig:
    """Task scores from lm-evaluation-harness on the trial's model (``hpcsweep.train.scores.task_scorer``,
    docs/user/task-scores.md). Needs ``pip install 'hpcsweep[tasks]'`` and a tokenizer."""

    names: list[str] = field(default_factory=list)
    """lm-eval task names to run, each defined by a YAML file under ``include_path``. Empty: no tasks."""
    include_path: str | None = None
    """A folder of lm-eval task YAML files whose data are local files (``dataset_path: json`` with
    ``dataset_kwargs: {data_files: ...}``): nothing is downloaded, lm-eval's built-in tasks are not read."""
    every: int = 0
    """Run the tasks every this many optimizer steps, and at the end; 0: at the end only."""
    limit: int | None = None
    """At most this many examples of each task (null: all of them)."""
    batch_size: int = 8
    """Requests per forward pass of lm-eval."""

    def __post_init__(self) -> None:
        _require(len(set(self.names)) == len(self.names) and all(self.names), "tasks.names", self.names,
                 "a list of distinct lm-eval task names")
        _require(not self.names or bool(self.include_path), "tasks.include_path", self.include_path,
                 "a folder of lm-eval task YAML files when tasks.names is set")
        _require(self.every >= 0, "tasks.every", self.every, "an integer >= 0 (0: at the end only)")
        _require(self.limit is None or self.limit >= 1, "tasks.limit", self.limit, "null or an integer >= 1")
        _require(self.batch_size >= 1, "tasks.batch_size", self.batch_size, "an integer >= 1")
