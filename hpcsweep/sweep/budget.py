"""A sweep's GPU-hour budget before anything runs: the value checked, the worst case said beside it.

The worst case is what the sweep's allocations would hold if every array task ran once to its
time limit: tasks x nodes x GPUs per node x ``timeout_min`` (nodes alone on a partition without
GPUs). With ``trials_per_task`` a task runs several trials one after another within one time
limit, so the sweep has fewer tasks than trials and the worst case counts the tasks. Requeues and
retries may spend more; the budget counts them too (``hpcsweep.results.budget``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcsweep.sweep.allocation import allocation_key, executor_parameters, gpus_asked
from hpcsweep.sweep.hooks import SweepTrial

log = logging.getLogger(__name__)

BUDGET_KEY = "budget_gpu_hours"


def check_budget(params: Mapping[str, Any]) -> float | None:
    """``hydra.launcher.budget_gpu_hours``: None, or a number > 0; ``ValueError`` naming the key otherwise."""
    value = params.get(BUDGET_KEY)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"hydra.launcher.{BUDGET_KEY}={value!r} is not allowed: a number of GPU-hours > 0, or null for no budget"
        )
    return float(value)


def trial_units(trial: SweepTrial, params: Mapping[str, Any]) -> int:
    """What an hour of the trial costs: its GPUs (nodes x GPUs per node), or its nodes without GPUs."""
    gpus = gpus_asked(trial.allocation, params)
    return trial.allocation.nodes * (gpus if gpus else 1)


@dataclass(frozen=True)
class TaskShape:
    """The array tasks of one allocation shape: how many, and the trials they run."""

    nodes: int
    gpus: int
    """GPUs per node (0: a partition without GPUs, counted in node-hours)."""
    trials: int
    tasks: int

    @property
    def units(self) -> int:
        """What an hour of one task costs: its GPUs, or its nodes without GPUs."""
        return self.nodes * (self.gpus if self.gpus else 1)


def task_shapes(trials: Sequence[SweepTrial], params: Mapping[str, Any]) -> list[TaskShape]:
    """The sweep's tasks by allocation shape, as ``slurm_submit.submit_trials`` packs them.

    Trials share a task only when their executor parameters are equal (one array per shape), so
    each shape's trials fill ``ceil(trials / trials_per_task)`` tasks.
    """
    per_task = int(params.get("trials_per_task") or 1)
    groups: dict[tuple, list[SweepTrial]] = {}
    for trial in trials:
        groups.setdefault(allocation_key(executor_parameters(trial.allocation, params)), []).append(trial)
    counts: dict[tuple[int, int], list[int]] = {}
    for group in groups.values():
        shape = (group[0].allocation.nodes, gpus_asked(group[0].allocation, params))
        count = counts.setdefault(shape, [0, 0])
        count[0] += len(group)
        count[1] += math.ceil(len(group) / per_task)
    return [TaskShape(nodes, gpus, n, tasks) for (nodes, gpus), (n, tasks) in sorted(counts.items())]


def worst_case_hours(trials: Sequence[SweepTrial], params: Mapping[str, Any]) -> float:
    """GPU-hours (node-hours without GPUs) if every task ran once to ``timeout_min``."""
    return sum(s.tasks * s.units for s in task_shapes(trials, params)) * float(params["timeout_min"]) / 60.0


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _shape_text(shape: TaskShape, per_task: int) -> str:
    """``3 trials x 2 nodes x 8 GPUs``; packed: ``2 tasks (4 trials, 2 per task) x 1 node x 8 GPUs``."""
    count = (_plural(shape.trials, "trial") if per_task == 1 else
             f"{_plural(shape.tasks, 'task')} ({_plural(shape.trials, 'trial')}, {per_task} per task)")
    size = (f"{_plural(shape.nodes, 'node')} x {_plural(shape.gpus, 'GPU')}" if shape.gpus else
            f"{_plural(shape.nodes, 'node')} (no GPU: node-hours)")
    return f"{count} x {size}"


def worst_case_line(trials: Sequence[SweepTrial], params: Mapping[str, Any], budget: float | None) -> str:
    """``worst case 48 GPU-hours (6 trials x 1 node x 8 GPUs x 60 min); budget 20 GPU-hours: ...``.

    Several shapes: ``[1 trial x 1 node x 8 GPUs + 2 trials x 2 nodes x 4 GPUs] x 60 min``.
    """
    per_task = int(params.get("trials_per_task") or 1)
    shapes = [_shape_text(shape, per_task) for shape in task_shapes(trials, params)]
    shape = shapes[0] if len(shapes) == 1 else "[" + " + ".join(shapes) + "]"
    worst = worst_case_hours(trials, params)
    budget_text = "no budget" if budget is None else f"budget {budget:g} GPU-hours"
    over = "" if budget is None or worst <= budget else ": trials stop, or never start, once the budget is spent"
    return f"worst case {worst:g} GPU-hours ({shape} x {params['timeout_min']} min); {budget_text}{over}"


def announce_budget(trials: Sequence[SweepTrial], params: Mapping[str, Any]) -> float | None:
    """Check the budget and log the worst case beside it; return the budget (None: none). ``ValueError``."""
    budget = check_budget(params)
    log.info("%s", worst_case_line(trials, params, budget))
    return budget


def announce_local_budget(launcher_config: Mapping[str, Any]) -> float | None:
    """A local sweep's budget (``hydra.launcher`` as composed), logged; ``ValueError`` on a bad value.

    Local trials have no time limit, so there is no worst case to say.
    """
    budget = check_budget(launcher_config)
    if budget is not None:
        log.info("budget %g GPU-hours, counted from the trials' wall time (node-hours without GPUs)", budget)
    return budget
