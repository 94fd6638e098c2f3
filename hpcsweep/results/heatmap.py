"""``report --plot``'s heat map: utilisation by trial (rows) over wall time since each trial's start (columns).

A trial's row is its ``sys/gpu{i}/util`` scalars, every GPU's points pooled so that a cell is the
mean over its GPUs; a trial without any GPU sample falls back to ``sys/cpu/util`` (the label and the
title say so). A trial starts at its earliest event of any tag. Time is cut into equal columns
over the longest trial, ``HEATMAP_BINS`` at most and each at least ``SAMPLE_SPAN_FACTOR`` sampling
intervals wide; a cell is the mean of the samples in it, blank where there are none (the trial had
ended, or stopped sampling). The binning is pure (:func:`utilisation_grid`); matplotlib is imported only to draw.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpcsweep.results.event_reader import ScalarSeries

GPU_UTIL_TAG = re.compile(r"sys/gpu\d+/util")
CPU_UTIL_TAG = "sys/cpu/util"
HEATMAP_BINS = 60
"""Columns of the heat map at most: enough to see a trial stall."""
SAMPLE_SPAN_FACTOR = 1.5
"""A column spans at least this many sampling intervals: a sampler thread's interval jitters, and
a column narrower than the gap between two samples would be blank for no reason."""
HEATMAP_SUFFIX = "-heatmap"
"""``--plot FILE.png`` writes the heat map beside it as ``FILE-heatmap.png``: the sweep figure is
one row of panels, and a hundred trials need a figure of their own height."""


@dataclass(frozen=True)
class TrialUtilisation:
    """One trial's utilisation samples: ``gpu`` or ``cpu``, seconds since its start, and % values."""

    source: str
    seconds: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class UtilisationGrid:
    """The heat map's data: one row per trial with samples (by trial number), ``NaN`` where a cell has none."""

    nums: list[int]
    sources: list[str]
    span_s: float
    """Seconds the columns cover together."""
    cells: np.ndarray


def trial_utilisation(scalars: Mapping[str, ScalarSeries]) -> TrialUtilisation | None:
    """The utilisation samples of one trial's scalars: its GPUs', else its CPU's; None without either."""
    gpu_series = [series for tag, series in scalars.items() if GPU_UTIL_TAG.fullmatch(tag)]
    source, chosen = ("gpu", gpu_series) if any(s.values for s in gpu_series) else ("cpu", [scalars.get(CPU_UTIL_TAG)])
    chosen = [series for series in chosen if series is not None and series.values]
    if not chosen:
        return None
    start = min(min(series.wall_times) for series in scalars.values() if series.wall_times)
    seconds = np.concatenate([np.asarray(series.wall_times, dtype=float) for series in chosen]) - start
    values = np.concatenate([np.asarray(series.values, dtype=float) for series in chosen])
    return TrialUtilisation(source, seconds, values)


def column_width(trials: list[TrialUtilisation], span_s: float, bins: int) -> float:
    """Seconds a column covers: the span over ``bins``, widened to ``SAMPLE_SPAN_FACTOR`` sampling
    intervals (the largest trial's median), so that a trial still sampling never leaves a blank cell."""
    intervals = [float(np.median(np.diff(times))) for u in trials if len(times := np.unique(u.seconds)) > 1]
    return max(span_s / bins, SAMPLE_SPAN_FACTOR * max(intervals, default=0.0))


def utilisation_grid(
    scalars: Mapping[int, Mapping[str, ScalarSeries]], bins: int = HEATMAP_BINS
) -> UtilisationGrid | None:
    """The heat map's cells from every trial's scalars; None when no trial has a utilisation sample."""
    trials = {num: u for num, trial in sorted(scalars.items()) if (u := trial_utilisation(trial)) is not None}
    if not trials:
        return None
    span = max(float(u.seconds.max()) for u in trials.values()) or 1.0
    width = column_width(list(trials.values()), span, bins)
    columns = max(1, math.ceil(span / width - 1e-9))
    cells = np.full((len(trials), columns), np.nan)
    for row, u in enumerate(trials.values()):
        column = np.minimum((u.seconds / width).astype(int), columns - 1)
        sums, counts = np.zeros(columns), np.zeros(columns)
        np.add.at(sums, column, u.values)
        np.add.at(counts, column, 1)
        filled = counts > 0
        cells[row, filled] = sums[filled] / counts[filled]
    return UtilisationGrid(list(trials), [u.source for u in trials.values()], columns * width, cells)


def time_unit(span_s: float) -> tuple[str, float]:
    """The x-axis unit for a span: seconds up to 10 minutes, minutes up to 5 hours, else hours."""
    if span_s <= 600:
        return "s", 1.0
    return ("min", 60.0) if span_s <= 5 * 3600 else ("h", 3600.0)


def heatmap_title(sources: list[str]) -> str:
    """What the heat map shows: GPU utilisation, CPU utilisation (no GPU samples), or both, marked per row."""
    if "cpu" not in sources:
        return "GPU utilisation by trial (mean over its GPUs)"
    if "gpu" not in sources:
        return "CPU utilisation by trial (no GPU samples: sys/cpu/util)"
    return "GPU utilisation by trial (mean over its GPUs); rows marked cpu: CPU utilisation (no GPU samples)"


def heatmap_figure(grid: UtilisationGrid) -> Any:
    """The matplotlib figure of ``grid``: trials down, wall time across, 0-100% in colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit, divisor = time_unit(grid.span_s)
    rows = len(grid.nums)
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.28 * min(rows, 200)))
    top = max(100.0, float(np.nanmax(grid.cells)))  # CPU utilisation may count more than one core
    colours = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    image = ax.imshow(np.ma.masked_invalid(grid.cells), aspect="auto", interpolation="nearest", cmap=colours,
                      vmin=0.0, vmax=top, extent=(0.0, grid.span_s / divisor, rows, 0.0))
    mixed = len(set(grid.sources)) > 1
    if rows <= 60:
        ax.set_yticks([i + 0.5 for i in range(rows)],
                      [f"#{num}" + (" cpu" if mixed and source == "cpu" else "")
                       for num, source in zip(grid.nums, grid.sources)])
    ax.set_xlabel(f"wall time since the trial's start ({unit})")
    ax.set_ylabel("trial")
    ax.set_title(heatmap_title(grid.sources), fontsize="medium")
    fig.colorbar(image, ax=ax, label="utilisation %")
    fig.tight_layout()
    return fig


def heatmap_path(plot_path: Path) -> Path:
    """``FILE.png`` -> ``FILE-heatmap.png``, beside it."""
    return plot_path.with_name(plot_path.stem + HEATMAP_SUFFIX + (plot_path.suffix or ".png"))


def plot_heatmap(scalars: Mapping[int, Mapping[str, ScalarSeries]], path: Path) -> bool:
    """Write the heat map as a PNG at ``path``; False, writing nothing, when no trial has a utilisation sample."""
    grid = utilisation_grid(scalars)
    if grid is None:
        return False
    import matplotlib.pyplot as plt

    fig = heatmap_figure(grid)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
