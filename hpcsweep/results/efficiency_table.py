"""The cells of ``report --efficiency``: one row per trial, ``-`` wherever its metrics.json says nothing."""

from __future__ import annotations

from collections.abc import Sequence

from hpcsweep.results.efficiency import OutlierReport, find_outliers
from hpcsweep.results.table import TrialRow


def device_word(rows: Sequence[TrialRow]) -> str:
    """What tokens/s are divided by: ``GPU``, ``worker`` (no trial ran on a GPU) or ``GPU|worker`` (some did)."""
    kinds = {row.efficiency.on_gpu for row in rows if row.efficiency.tokens_per_device is not None}
    return "GPU|worker" if len(kinds) > 1 else ("worker" if kinds == {False} else "GPU")


def hours_word(rows: Sequence[TrialRow], local: bool) -> str:
    """What the hours columns count: ``CPU`` for a local sweep whose trials measured ran without a GPU
    (worker-hours on CPUs), else ``GPU`` (on Slurm, node-hours count for a partition without GPUs)."""
    measured = [row for row in rows if row.efficiency.on_gpu or row.efficiency.peak_memory_gb is not None]
    return "CPU" if local and measured and not any(row.efficiency.on_gpu for row in measured) else "GPU"


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _memory(row: TrialRow) -> str:
    """``78.5/80.0``: the peak against the GPU's memory in GB (``0.4/-`` on CPU: a peak RSS, no GPU)."""
    peak, total = row.efficiency.peak_memory_gb, row.efficiency.memory_total_gb
    if peak is None:
        return "-"
    return f"{peak:.1f}/{_cell(total, 1)}"


def efficiency_cells(
    rows: Sequence[TrialRow], keys: Sequence[str] = (), hours: str = "GPU"
) -> tuple[list[str], list[list[str]]]:
    """The header and cells of the efficiency table, one row per trial in ``rows``' order: its number,
    its values of the swept ``keys`` (as the results table shows them), then how it used its hardware;
    ``hours`` names the unit of the hours column (``hours_word``)."""
    header = ["#", *keys, "status", "MFU", f"tok/s/{device_word(rows)}", "GPU-util%", "data%", "GB(peak/GPU)",
              f"{hours}-h", "load(max/mean)"]
    cells = [
        [
            str(row.num),
            *(row.overrides.get(k, "") for k in keys),
            row.status,
            _cell(row.efficiency.mfu, 3),
            _cell(row.efficiency.tokens_per_device, 0),
            _cell(row.efficiency.gpu_util_pct, 0),
            _cell(row.efficiency.data_pct, 1),
            _memory(row),
            _cell(row.gpu_hours, 3),
            _cell(row.efficiency.router_load, 2),
        ]
        for row in rows
    ]
    return header, cells


def sweep_outliers(rows: Sequence[TrialRow]) -> OutlierReport:
    """The outlier rule (``hpcsweep.results.efficiency.find_outliers``) over every trial of ``rows``."""
    return find_outliers({row.num: row.efficiency for row in rows})
