"""The report's PNG: the metric against each swept parameter, and the best trials' val-loss curves."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcsweep.results.event_reader import ScalarSeries
from hpcsweep.results.table import TrialRow

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


def sweep_figure(
    rows: Sequence[TrialRow],
    scalars: Mapping[int, Mapping[str, ScalarSeries]],
    keys: Sequence[str],
    metric: str,
    top: int,
    extra_panels: Sequence[Callable[[Any], None]] = (),
) -> Any:
    """The matplotlib figure: one panel per swept key, then the val-loss curves of the ``top``
    first rows that have one (the title says how many that is), then one panel per ``extra_panels``
    function (each draws on the axes it is given: a search's optimisation history)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(keys) + 1 + len(extra_panels)
    fig, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 4), squeeze=False)
    measured = [row for row in rows if getattr(row, metric) is not None and row.status != "failed"]
    for ax, key in zip(axes[0], keys):
        texts = [row.overrides.get(key, "") for row in measured]
        numbers = numeric_values(texts)
        ys = [getattr(row, metric) for row in measured]
        if numbers is None:
            labels = sorted(set(texts))
            ax.scatter([labels.index(t) for t in texts], ys)
            ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        else:
            ax.scatter(numbers, ys)
            if wants_log_axis(numbers):
                ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
    curves = axes[0][len(keys)]
    for ax, draw in zip(axes[0][len(keys) + 1:], extra_panels):
        draw(ax)
    with_curves: list[tuple[TrialRow, ScalarSeries]] = []
    for row in rows:
        series = scalars.get(row.num, {}).get("val/loss")
        if row.status != "failed" and series and series.steps and len(with_curves) < top:
            with_curves.append((row, series))
    for row, series in with_curves:
        label = " ".join(f"{k}={row.overrides.get(k, '')}" for k in keys) or f"#{row.num}"
        curves.plot(series.steps, series.values, marker=".", label=f"#{row.num} {label}")
    curves.set_xlabel("step")
    curves.set_ylabel("val/loss")
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
