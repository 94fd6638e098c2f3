"""Pure statistics of telemetry samples: mean, p5, max, energy and GPU-hours.

A sample stands for the interval that ends at it (the first one: since sampling started), as
NVML's utilisation and Hopper's power reading are averages over the time before the reading.
So the energy is the sum of power × that interval, and a GPU's hours run from the start of sampling
to its last sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import numpy as np

DIGITS = 3
"""Decimals kept in metrics.json: telemetry is not that precise."""


class Stats(TypedDict):
    """Mean, 5th percentile and maximum of one field's samples."""

    mean: float
    p5: float
    max: float


def stats(values: Sequence[float | None] | np.ndarray) -> Stats | None:
    """Mean, 5th percentile (linear interpolation, numpy's default) and max; None without a value.

    None or NaN values (a field not read at that time) are left out.
    """
    array = np.asarray(values, dtype=float)
    kept = array[~np.isnan(array)]
    if kept.size == 0:
        return None
    return {"mean": round(float(kept.mean()), DIGITS), "p5": round(float(np.percentile(kept, 5)), DIGITS),
            "max": round(float(kept.max()), DIGITS)}


def sample_intervals(start: float, times: Sequence[float] | np.ndarray) -> np.ndarray:
    """The interval each sample stands for: since the previous sample, the first since ``start``."""
    t = np.asarray(times, dtype=float)
    return np.diff(t, prepend=start)


def energy_j(start: float, times: Sequence[float] | np.ndarray,
             power_w: Sequence[float | None] | np.ndarray) -> float | None:
    """Joules: each sample's power times the interval it stands for; None unless every sample has a power."""
    power = np.asarray(power_w, dtype=float)
    if power.size == 0 or np.isnan(power).any():
        return None
    return round(float(np.dot(sample_intervals(start, times), power)), DIGITS)


def gpu_hours(start: float, times: Sequence[float] | np.ndarray) -> float:
    """Hours from the start of sampling to the last sample (0 without one)."""
    if len(times) == 0:
        return 0.0
    return round(max(0.0, float(times[-1]) - start) / 3600.0, 6)


def max_stats(parts: Sequence[Stats | None]) -> Stats | None:
    """The largest mean, p5 and max over several nodes' stats (None where no node has any)."""
    known = [p for p in parts if p is not None]
    if not known:
        return None
    return {key: max(p[key] for p in known) for key in ("mean", "p5", "max")}  # type: ignore[return-value]
