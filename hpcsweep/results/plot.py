"""The report's PNG: the metric against each swept parameter (every trial that has it, pruned ones
marked), and the best trials' curves of that metric (val/loss for a loss)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcsweep.results.event_reader import ScalarSeries
from hpcsweep.files.metric_keys import TASKS_KEY
from hpcsweep.results.table import TrialRow, row_metric

LOG_SPAN = 10.0
"""A numeric parameter whose values are all > 0 and span at least this factor (max/min) is
plotted on a log axis: a decade or more, as a learning rate swept 1e-4,3e-4,1e-3 does."""


def numeric_values(texts: Sequence[str]) -> list[float] | None:
    """The override values as numbers, or None when any is not a number."""
    try:
        return [float(text) for text in texts]
    except ValueError:
        return None


def wants_log_axis(values: Sequence[float]) -> bool:
    """True when every value is > 0 and max/min is at least ``LOG_SPAN`` (learning rates, weight decays).

    Compared in log space with a little slack, so 3e-5..3e-4 (a ratio of 9.999999999999998 in
    floating point) counts as the decade it is.
    """
    if not values or min(values) <= 0:
        return False
    return math.log10(max(values) / min(values)) >= math.log10(LOG_SPAN) - 1e-9


def curve_tag(metric: str) -> str:
    """The TensorBoard scalar whose curve shows ``metric`` over steps: ``tasks/NAME/METRIC`` for a task
    score, ``val/accuracy`` for val_accuracy, else ``val/loss``."""
    if metric.startswith(f"{TASKS_KEY}."):
        return metric.replace(".", "/", 2)
    return "val/accuracy" if metric == "val_accuracy" else "val/loss"


def sweep_figure(
    rows: Sequence[TrialRow],
    scalars: Mapping[int, Mapping[str, ScalarSeries]],
    keys: Sequence[str],
    metric: str,
    top: int,
    extra_panels: Sequence[Callable[[Any], None]] = (),
) -> Any:
    """The matplotlib figure: one panel per swept key, ``metric`` (a row field or ``tasks.NAME.METRIC``)
    of every trial that has it and did not fail, pruned ones marked; then the curves of
    ``curve_tag(metric)`` of the ``top`` first rows that have one (the title says how many that is),
    then one panel per ``extra_panels`` function (each draws on the axes it is given: a search's
    optimisation history)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(keys) + 1 + len(extra_panels)
    fig, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 4), squeeze=False)
    measured = [row for row in rows if row_metric(row, metric) is not None and row.status != "failed"]
    for ax, key in zip(axes[0], keys):
        texts = [row.overrides.get(key, "") for row in measured]
        numbers = numeric_values(texts)
        labels = sorted(set(texts))
        xs = numbers if numbers is not None else [labels.index(t) for t in texts]
        for pruned, style in ((False, {"label": "trial"}),
                              (True, {"marker": "x", "color": "tab:red", "label": "pruned (value when pruned)"})):
            chosen = [(x, row_metric(row, metric)) for x, row in zip(xs, measured) if (row.status == "pruned") == pruned]
            if chosen:
                ax.scatter([x for x, _ in chosen], [y for _, y in chosen], **style)
        if numbers is None:
            ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        elif wants_log_axis(numbers):
            ax.set_xscale("log")
        if any(row.status == "pruned" for row in measured):
            ax.legend(fontsize="small")
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
    curves = axes[0][len(keys)]
    for ax, draw in zip(axes[0][len(keys) + 1:], extra_panels):
        draw(ax)
    tag = curve_tag(metric)
    with_curves: list[tuple[TrialRow, ScalarSeries]] = []
    for row in rows:
        series = scalars.get(row.num, {}).get(tag)
        if row.status != "failed" and series and series.steps and len(with_curves) < top:
            with_curves.append((row, series))
    for row, series in with_curves:
        label = " ".join(f"{k}={row.overrides.get(k, '')}" for k in keys) or f"#{row.num}"
        curves.plot(series.steps, series.values, marker=".", label=f"#{row.num} {label}")
    curves.set_xlabel("step")
    curves.set_ylabel(tag)
    curves.set_title(f"top {len(with_curves)} by {metric}")
    curves.grid(True, alpha=0.3)
    if curves.lines:
        curves.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_sweep(
    rows: Sequence[TrialRow],
    scalars: Mapping[int, Mapping[str, ScalarSeries]],
    keys: Sequence[str],
    metric: str,
    top: int,
    path: Path,
    extra_panels: Sequence[Callable[[Any], None]] = (),
) -> None:
    """Write :func:`sweep_figure` as a PNG."""
    import matplotlib.pyplot as plt

    fig = sweep_figure(rows, scalars, keys, metric, top, extra_panels)
    fig.savefig(path, dpi=100)
    plt.close(fig)
