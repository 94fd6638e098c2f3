"""One GPU-hour figure everywhere: the GPU-hours a sweep's allocations held.

A GPU-hour is one GPU allocated for one hour. On Slurm it is each run's elapsed time times the GPUs
of its allocation (``sacct``'s ``ElapsedRaw`` x the ``gres/gpu`` of ``AllocTRES``), summed over
every run of every array task of the sweep, requeues and retries included; locally it is each
run's wall time times the GPUs it held (the trial's ``usage.json``). On a partition without GPUs
the same sums count node-hours. Every figure counts these: the budget's worst case before submit
(tasks x nodes x GPUs x time limit, ``hpcsweep.sweep.budget``), the budget's watch, ``status``'s
``GPU-hours spent`` and ``report``'s total. A trial packed with others into one array task
(``trials_per_task``) shares that task's allocation: the report's ``GPU-h`` column gives each
trial its tasks' allocated hours, a shared task's divided between the trials that ran in it in
proportion to their own share (at least a second's worth each: ``metrics.json`` times are whole
seconds), so the column adds up to the total. ``own GPU-h`` is the trial's own compute,
labelled as such: its latest run's wall time times its workers (``metrics.json``'s
``started_at`` to ``updated_at`` x ``world_size``), without the time its allocation spent on
startup, on the other trials of its task, on earlier runs, or on GPUs no worker used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

MIN_SHARE_HOURS = 1.0 / 3600.0
"""The least own share a trial that ran counts for when a task is divided: one second of one GPU."""


def allocated_hours_by_trial(
    task_hours: Mapping[str, float], trial_tasks: Mapping[int, Sequence[str]], own_hours: Mapping[int, float | None]
) -> dict[int, float]:
    """Each trial's part of its tasks' allocated GPU-hours (pure).

    ``task_hours``: array task id -> GPU-hours of every run of it; ``trial_tasks``: trial number ->
    the task ids of its attempts; ``own_hours``: trial number -> its own share (None: it has not
    run). A task of several trials is divided between those that ran in proportion to their own
    shares (at least ``MIN_SHARE_HOURS`` each), or evenly when none of them has run yet. A trial
    whose tasks accounting does not know gets nothing.
    """
    sharing: dict[str, list[int]] = {}
    for num, tasks in trial_tasks.items():
        for task in dict.fromkeys(tasks):
            sharing.setdefault(task, []).append(num)
    allocated = {num: 0.0 for num in trial_tasks}
    for task, nums in sharing.items():
        hours = task_hours.get(task, 0.0)
        weights = [0.0 if own_hours.get(num) is None else max(own_hours[num] or 0.0, MIN_SHARE_HOURS) for num in nums]
        total = sum(weights)
        for num, weight in zip(nums, weights):
            allocated[num] += hours * (weight / total if total > 0 else 1.0 / len(nums))
    return allocated
