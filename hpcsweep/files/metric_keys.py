"""Dotted keys into a trial's metrics.json: ``best_val_loss``, ``val_accuracy``, ``tasks.NAME.METRIC``.

One reading of such a key for every stage that ranks or stops trials by one: the search's
objective and pruning reports, early stopping, ``report --sort`` and ``export --best --by``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

TASKS_KEY = "tasks"
"""metrics.json's task scores: ``{NAME: {METRIC: value}}`` (``hpcsweep.train.scores.task_scorer``)."""


def metric_value(metrics: Mapping[str, Any] | None, key: str) -> float | None:
    """The number at dotted ``key`` in ``metrics`` (``tasks.facts.acc`` is ``metrics["tasks"]["facts"]["acc"]``),
    or None when it is missing or not a number. A key that names a metric whole (``val_loss``) wins over a path."""
    node: Any = metrics or {}
    if isinstance(node, Mapping) and key in node:
        node = node[key]
    else:
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return float(node)


def finite_metric(metrics: Mapping[str, Any] | None, key: str) -> float | None:
    """:func:`metric_value`, or None when it is NaN or infinite (a diverged trial ranks nowhere)."""
    value = metric_value(metrics, key)
    return value if value is not None and math.isfinite(value) else None


def task_score_keys(metrics: Mapping[str, Any] | None) -> list[str]:
    """``tasks.NAME.METRIC`` for every task score in ``metrics``, sorted."""
    scores = (metrics or {}).get(TASKS_KEY)
    if not isinstance(scores, Mapping):
        return []
    return sorted(
        f"{TASKS_KEY}.{name}.{metric}"
        for name, values in scores.items() if isinstance(values, Mapping)
        for metric, value in values.items() if isinstance(value, (int, float)) and not isinstance(value, bool)
    )

