"""How well each trial of a sweep uses its hardware, and which trials are the outliers, with why.

``efficiency_of`` reads one trial's metrics.json (the ``telemetry``, ``step_time`` and
``step_time_total`` blocks, ``memory_peak`` and ``memory_plan``); every block may be missing (a trial
from before them), and each fact is then None. ``find_outliers`` is the rule, pure, against the
sweep's median (``docs/user/efficiency.md``):

- throughput: MFU below half the median (tokens/s per GPU, or per worker off GPU, where fewer than
  ``MIN_MEASURED`` trials have an MFU: it is null off GPU and on a GPU of unknown peak);
- GPU utilisation below half the median;
- data waiting: data % of step time above ``max(DATA_PCT_FLOOR, DATA_FACTOR x median)``;
- a slow node: a GPU whose mean SM clock is below ``SLOW_CLOCK_FACTOR`` x the median over every GPU;
- memory: under ``HEADROOM_PCT`` % of the GPU's memory left at the peak (against the GPU, not the median);
- routing: a MoE trial whose routing collapsed (``hpcsweep.results.routing``, against the trial alone);
- logps: a DPO trial whose chosen answers' log-probability (``logps/chosen``, metrics.json ``preference``) fell
  by more than ``CHOSEN_LOGPS_FALL`` of its first log window's (against the trial alone).

A rule against the median needs ``MIN_MEASURED`` trials that have the measure. A trial low on
throughput or utilisation with no direct cause gets the part of its step time that stands out most
against the sweep's median share of that part. Communication is not timed apart: it is inside
forward+backward.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcsweep.results.routing import collapse_reason

MIN_MEASURED = 3
"""Trials that must have a measure before any trial is compared with the sweep's median of it."""
LOW_FACTOR = 0.5
"""MFU, tokens/s per GPU and GPU utilisation below this fraction of the median flag a trial."""
DATA_PCT_FLOOR = 20.0
"""A trial waits on data when its data % is above this and above ``DATA_FACTOR`` x the median."""
DATA_FACTOR = 2.0
SLOW_CLOCK_FACTOR = 0.8
"""A GPU whose mean SM clock is below this fraction of the sweep's median GPU clock runs slow
(boost clocks differ by some 10% with power and temperature; a throttled or misconfigured node by far more)."""
HEADROOM_PCT = 5.0
"""A trial whose peak leaves less than this % of its GPU's memory free is close to running out."""
CHOSEN_LOGPS_FALL = 0.1
"""A DPO trial whose latest ``logps/chosen`` is below its first log window's by more than this fraction of it has
pushed its chosen answers down (both answers fall, the rejected faster): its reward accuracy can still rise."""
CAUSE_EXCESS_POINTS = 10.0
"""A part of the step time names the cause when its share exceeds the sweep's median share of it by this many points."""
STEP_PARTS = ("data", "compute", "optimizer", "checkpoint", "logging", "other")
"""The parts of step time in ``step_time`` (``<part>_s`` seconds, ``<part>_pct`` shares)."""
PART_WORDS = {
    "data": "waits on data",
    "compute": "is forward+backward (gradient communication included)",
    "optimizer": "is the optimizer step",
    "checkpoint": "blocks on checkpoints",
    "logging": "is logging",
    "other": "is outside the timed parts",
}


@dataclass(frozen=True)
class GpuClock:
    """One GPU's mean SM clock over the trial, and the node it is on."""

    index: int
    node: str
    mhz: float


@dataclass(frozen=True)
class TrialEfficiency:
    """What one trial's metrics.json says about how it used its hardware; None where it says nothing."""

    on_gpu: bool = False
    """Whether the trial ran on GPUs (NVML samples, or a CUDA memory peak)."""
    mfu: float | None = None
    tokens_per_device: float | None = None
    """Tokens/s per GPU (per worker off GPU): the trial's tokens/s over its world size."""
    gpu_util_pct: float | None = None
    """Mean NVML utilisation, averaged over the trial's GPUs."""
    cpu_util_pct: float | None = None
    data_pct: float | None = None
    """Share of step time waiting for data: over every run of the trial (``step_time_total``), else the
    last window."""
    step_shares: Mapping[str, float] = field(default_factory=dict)
    """Each part of ``STEP_PARTS`` as % of step time, from the same record as ``data_pct``."""
    peak_memory_gb: float | None = None
    memory_total_gb: float | None = None
    """The GPU's memory: the telemetry's ``mem_total_gb`` (smallest GPU), else the memory plan's GPU."""
    clocks: tuple[GpuClock, ...] = ()
    router_load: float | None = None
    """A MoE trial's worst layer's max/mean expert load over its last log window (metrics.json ``router``)."""
    routing_collapse: str | None = None
    """Why its routing collapsed (``hpcsweep.results.routing``); None when it did not, or it is dense."""
    chosen_logps: tuple[float, float] | None = None
    """A DPO trial's ``logps/chosen`` at its first and at its latest log window (metrics.json ``preference``)."""

    @property
    def headroom_pct(self) -> float | None:
        """Memory left at the peak, as % of the GPU's memory; None unless both are known."""
        if self.peak_memory_gb is None or not self.memory_total_gb:
            return None
        return 100.0 * (1.0 - self.peak_memory_gb / self.memory_total_gb)


def _number(value: Any) -> float | None:
    """``value`` as a finite float; None for null, text, booleans, NaN and infinities."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _stat_mean(stats: Any) -> float | None:
    """The ``mean`` of a telemetry ``STATS`` block (None when the block is null)."""
    return _number(_mapping(stats).get("mean"))


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) / len(known) if known else None


def step_shares(record: Any) -> dict[str, float]:
    """Each part of a ``step_time`` record as % of its time: from the seconds, else from the ``_pct`` keys.

    The seconds are divided by the record's ``seconds`` (else by their sum); a record with no time
    in it gives nothing. ``other`` from ``_pct`` keys is what the named parts leave of 100.
    """
    record = _mapping(record)
    seconds = {part: _number(record.get(f"{part}_s")) for part in STEP_PARTS}
    if seconds["data"] is not None:
        total = _number(record.get("seconds")) or math.fsum(s for s in seconds.values() if s is not None)
        if total > 0:
            return {part: 100.0 * s / total for part, s in seconds.items() if s is not None}
    shares = {part: _number(record.get(f"{part}_pct")) for part in STEP_PARTS if part != "other"}
    known = {part: share for part, share in shares.items() if share is not None}
    if "data" not in known:
        return {}
    return {**known, "other": max(0.0, 100.0 - math.fsum(known.values()))}


def _peak_memory_gb(metrics: Mapping[str, Any]) -> float | None:
    step_peak = _number(_mapping(metrics.get("step_time")).get("peak_memory_gb"))
    if step_peak is not None:
        return step_peak
    peak_bytes = _number(_mapping(metrics.get("memory_peak")).get("bytes"))
    return None if peak_bytes is None else peak_bytes / 2**30


def _ran_on_gpu(metrics: Mapping[str, Any], gpus: Sequence[Any]) -> bool:
    source = _mapping(metrics.get("step_time")).get("peak_memory_source") or _mapping(
        metrics.get("memory_peak")).get("source") or ""
    return bool(gpus) or source == "cuda" or str(source).startswith("torch.cuda")


def efficiency_of(metrics: Mapping[str, Any] | None, tokens_per_s: float | None) -> TrialEfficiency:
    """One trial's efficiency facts from its metrics.json; ``tokens_per_s`` is its whole-run throughput."""
    metrics = metrics or {}
    telemetry = _mapping(metrics.get("telemetry"))
    gpus = [gpu for gpu in telemetry.get("gpus") or [] if isinstance(gpu, Mapping)]
    total_shares = step_shares(metrics.get("step_time_total"))
    shares = total_shares or step_shares(metrics.get("step_time"))
    totals = [t for gpu in gpus if (t := _number(gpu.get("mem_total_gb"))) is not None]
    plan_bytes = _number(_mapping(metrics.get("memory_plan")).get("gpu_memory_bytes"))
    world_size = _number(metrics.get("world_size")) or (len(gpus) or None)
    tokens = _number(tokens_per_s)
    mfu = _number(_mapping(metrics.get("step_time")).get("mfu"))
    clocks = tuple(
        GpuClock(int(gpu.get("index", i)), str(gpu.get("node", "")), mhz)
        for i, gpu in enumerate(gpus) if (mhz := _stat_mean(gpu.get("sm_clock_mhz"))) is not None
    )
    return TrialEfficiency(
        on_gpu=_ran_on_gpu(metrics, gpus),
        mfu=mfu if mfu is not None else _number(metrics.get("mfu")),
        tokens_per_device=None if tokens is None or not world_size else tokens / world_size,
        gpu_util_pct=_mean([_stat_mean(gpu.get("util_pct")) for gpu in gpus]),
        cpu_util_pct=_stat_mean(_mapping(telemetry.get("cpu")).get("util_pct")),
        data_pct=shares.get("data"),
        step_shares=shares,
        peak_memory_gb=_peak_memory_gb(metrics),
        memory_total_gb=min(totals) if totals else (None if plan_bytes is None else plan_bytes / 2**30),
        clocks=clocks,
        router_load=_number(_mapping(metrics.get("router")).get("max_mean_load")),
        routing_collapse=collapse_reason(metrics.get("router")),
        chosen_logps=_chosen_logps(metrics.get("preference")),
    )


def _chosen_logps(record: Any) -> tuple[float, float] | None:
    first, last = (_number(_mapping(record).get(key)) for key in ("logps_chosen_first", "logps_chosen"))
    return None if first is None or last is None else (first, last)


def chosen_logps_fall(trial: TrialEfficiency) -> str | None:
    """Why a DPO trial is flagged for its chosen answers' falling log-probability (``CHOSEN_LOGPS_FALL``), or None."""
    if trial.chosen_logps is None:
        return None
    first, last = trial.chosen_logps
    if not first or last >= first - CHOSEN_LOGPS_FALL * abs(first):
        return None
    return (f"logps/chosen {last:.1f}, {100 * (last - first) / abs(first):.0f}% from {first:.1f} at its first log "
            "window: the chosen answers are pushed down too (its reward accuracy can rise all the same)")


# ----- the outlier rule ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Outlier:
    """One flagged trial: the rules that flagged it (``throughput``, ``util``, ``data``, ``clock``, ``memory``,
    ``routing``, ``logps``), and why."""

    num: int
    kinds: tuple[str, ...]
    text: str
    """``#37: MFU 0.09 (sweep median 0.41): 40% of step time waits on data (sweep median 4%)``."""


@dataclass(frozen=True)
class OutlierReport:
    """The outliers of a sweep, the throughput measure compared, and what could not be compared."""

    measure: str | None
    """``MFU``, ``tokens/s per GPU`` or ``tokens/s per worker``; None when too few trials have any."""
    outliers: list[Outlier]
    notes: list[str]

    def lines(self) -> list[str]:
        """The notes, then one line per outlier (or one saying there are none)."""
        found = [o.text for o in self.outliers]
        return [*self.notes, *(found or ["no efficiency outliers"])]


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (at least one): the middle value, or the mean of the two middle ones.

    Not ``statistics.median``: importing ``statistics`` costs ``status`` 20 ms (it imports ``decimal``)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _median_of(values: Mapping[int, float | None]) -> tuple[dict[int, float], float | None]:
    known = {num: v for num, v in values.items() if v is not None}
    return known, median(known.values()) if len(known) >= MIN_MEASURED else None


def _fmt(value: float, unit: str = "") -> str:
    if unit == "%":
        return f"{value:.0f}%"
    if abs(value) >= 100:
        return f"{value:.0f}{unit}"
    return f"{value:.2g}{unit}" if abs(value) < 1 else f"{value:.1f}{unit}"


def _throughput(trials: Mapping[int, TrialEfficiency]) -> tuple[str | None, dict[int, float], float | None]:
    """The throughput measure: MFU where enough trials have one, else tokens/s per GPU (or worker)."""
    known, middle = _median_of({num: t.mfu for num, t in trials.items()})
    if middle is not None:
        return "MFU", known, middle
    known, middle = _median_of({num: t.tokens_per_device for num, t in trials.items()})
    if middle is None:
        return None, known, None
    per_gpu = all(trials[num].on_gpu for num in known)
    return ("tokens/s per GPU" if per_gpu else "tokens/s per worker"), known, middle


def _breakdown_cause(trial: TrialEfficiency, median_shares: Mapping[str, float]) -> str:
    """The part of ``trial``'s step time that stands out most against the sweep's median share of it."""
    if not trial.step_shares:
        return "no step-time breakdown recorded"
    excess = {part: share - median_shares.get(part, 0.0) for part, share in trial.step_shares.items()
              if part != "compute"}
    part = max(excess, key=excess.__getitem__, default=None)
    if part is not None and excess[part] >= CAUSE_EXCESS_POINTS:
        return f"{_fmt(trial.step_shares[part], '%')} of step time {PART_WORDS[part]}"
    compute = trial.step_shares.get("compute")
    tail = f" ({_fmt(compute, '%')} of step time)" if compute is not None else ""
    return f"no part of the step stands out: forward+backward itself is slow{tail}, kernels or gradient communication"


def _slow_clock_text(trial: TrialEfficiency, sweep_mhz: float) -> str | None:
    slow = [clock for clock in trial.clocks if clock.mhz < SLOW_CLOCK_FACTOR * sweep_mhz]
    if not slow:
        return None
    nodes = ", ".join(dict.fromkeys(clock.node or "?" for clock in slow))
    mean = math.fsum(clock.mhz for clock in slow) / len(slow)
    gpus = "GPU" if len(slow) == 1 else f"{len(slow)} GPUs"
    return f"SM clock {mean:.0f} MHz on {gpus} of {nodes} (sweep median {sweep_mhz:.0f} MHz): a slow node"


def find_outliers(trials: Mapping[int, TrialEfficiency]) -> OutlierReport:
    """The trials that stand out against the sweep's median (module docstring), each with its reason."""
    measure, throughput, throughput_median = _throughput(trials)
    utils, util_median = _median_of({num: t.gpu_util_pct for num, t in trials.items()})
    datas, data_median = _median_of({num: t.data_pct for num, t in trials.items()})
    clocked = [t for t in trials.values() if t.clocks]
    clock_median = (median(c.mhz for t in clocked for c in t.clocks)
                    if len(clocked) >= MIN_MEASURED else None)
    shared = [t.step_shares for t in trials.values() if t.step_shares]
    median_shares = {part: median(s.get(part, 0.0) for s in shared) for part in STEP_PARTS} if shared else {}

    notes = []
    if measure is None:
        notes.append(f"no outliers against the sweep's median: {len(throughput)} trial(s) with a throughput measured "
                     f"(at least {MIN_MEASURED} are needed)")
    else:
        notes.append(f"outliers against the sweep's median; throughput compared by {measure} "
                     f"({len(throughput)} trials measured)"
                     + ("" if measure == "MFU" else ": too few trials have an MFU (null off GPU)"))

    outliers = []
    for num, trial in sorted(trials.items()):
        symptoms: list[tuple[str, str]] = []
        causes: list[tuple[str, str]] = []
        if throughput_median and num in throughput and throughput[num] < LOW_FACTOR * throughput_median:
            symptoms.append(
                ("throughput", f"{measure} {_fmt(throughput[num])} (sweep median {_fmt(throughput_median)})"))
        if util_median and num in utils and utils[num] < LOW_FACTOR * util_median:
            symptoms.append(("util", f"GPU util {_fmt(utils[num], '%')} (sweep median {_fmt(util_median, '%')})"))
        if data_median is not None and num in datas and datas[num] > max(DATA_PCT_FLOOR, DATA_FACTOR * data_median):
            causes.append(("data", f"{_fmt(datas[num], '%')} of step time waits on data "
                                   f"(sweep median {_fmt(data_median, '%')})"))
        slow = _slow_clock_text(trial, clock_median) if clock_median else None
        if slow:
            causes.append(("clock", slow))
        if symptoms and not causes:
            causes.append(("", _breakdown_cause(trial, median_shares)))
        headroom = trial.headroom_pct
        if headroom is not None and headroom < HEADROOM_PCT:
            causes.append(("memory", f"peak memory {trial.peak_memory_gb:.1f} of {trial.memory_total_gb:.1f} GB "
                                     f"({max(headroom, 0.0):.1f}% headroom): close to running out of memory"))
        if trial.routing_collapse:
            causes.append(("routing", trial.routing_collapse))
        fall = chosen_logps_fall(trial)
        if fall:
            causes.append(("logps", fall))
        flagged = [kind for kind, _ in [*symptoms, *causes] if kind]
        if not flagged:
            continue
        head = f"#{num}: " + (", ".join(text for _, text in symptoms) + ": " if symptoms else "")
        outliers.append(Outlier(num, tuple(flagged), head + "; ".join(text for _, text in causes)))
    return OutlierReport(measure, outliers, notes)
