"""A sweep's GPU-hour budget before anything runs: the value checked, the worst case said beside it.

The worst case is what the sweep would spend if every trial ran to its time limit once: trials x
nodes x GPUs per node x ``timeout_min`` (nodes alone on a partition without GPUs). Requeues and
retries may spend more; the budget counts them too (``hpcsweep.results.budget``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hpcsweep.sweep.allocation import gpus_asked
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


def worst_case_hours(trials: Sequence[SweepTrial], params: Mapping[str, Any]) -> float:
    """GPU-hours (node-hours without GPUs) if every trial ran once to ``timeout_min``."""
    return sum(trial_units(trial, params) for trial in trials) * float(params["timeout_min"]) / 60.0


def worst_case_line(trials: Sequence[SweepTrial], params: Mapping[str, Any], budget: float | None) -> str:
    """``worst case 48.0 GPU-hours (6 trials x 1 node x 8 GPUs x 60 min); budget 20.0 GPU-hours``."""
    shapes = sorted({(t.allocation.nodes, gpus_asked(t.allocation, params)) for t in trials})
    shape = " + ".join(
        f"{nodes} node{'s' if nodes > 1 else ''} x {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else
        f"{nodes} node{'s' if nodes > 1 else ''} (no GPU: node-hours)"
        for nodes, gpus in shapes
    )
    worst = worst_case_hours(trials, params)
    budget_text = "no budget" if budget is None else f"budget {budget:g} GPU-hours"
    over = "" if budget is None or worst <= budget else ": trials stop, or never start, once the budget is spent"
    return (f"worst case {worst:g} GPU-hours ({len(trials)} trials x {shape} x {params['timeout_min']} min); "
            f"{budget_text}{over}")


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
