"""The report's PNG: the metric against each swept parameter, and the best trials' val-loss curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from hpcsweep.event_reader import ScalarSeries
from hpcsweep.report_data import TrialRow

LOG_SPAN = 10.0
"""A positive numeric parameter spanning more than this factor is plotted on a log axis."""


def numeric_values(texts: Sequence[str]) -> list[float] | None:
    """The override values as numbers, or None when any is not a number."""
    try:
        return [float(text) for text in texts]
    except ValueError:
        return None


def wants_log_axis(values: Sequence[float]) -> bool:
    """True for positive values spanning more than ``LOG_SPAN`` (learning rates, weight decays)."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > LOG_SPAN


def plot_sweep(
    rows: Sequence[TrialRow],
    scalars: Mapping[int, Mapping[str, ScalarSeries]],
    keys: Sequence[str],
    metric: str,
    top: int,
    path: Path,
) -> None:
    """Write the PNG: one panel per swept key, then the curves of the ``top`` first rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(keys) + 1
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
    curves = axes[0][-1]
    for row in [row for row in rows if row.status != "failed"][:top]:
        series = scalars.get(row.num, {}).get("val/loss")
        if series and series.steps:
            label = " ".join(f"{k}={row.overrides.get(k, '')}" for k in keys) or f"#{row.num}"
            curves.plot(series.steps, series.values, marker=".", label=f"#{row.num} {label}")
    curves.set_xlabel("step")
    curves.set_ylabel("val/loss")
    curves.set_title(f"top {top} by {metric}")
    curves.grid(True, alpha=0.3)
    if curves.lines:
        curves.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
