"""Warm start (``hydra.sweeper.warm_start``): which trials of earlier sweeps a new search starts from.

Pure: the earlier sweeps come in as their files record them (``hpcsweep.search.earlier_sweeps``
reads them), and out come the trials to seed the new study with and, for every other trial, why
it was left out. A trial is kept when all of these hold:

- **it finished**: ``completed`` or ``stopped_early`` with a finite number for the objective in its
  metrics.json (seeded COMPLETE); or ``pruned`` in a search whose study holds the values it
  reported, when the new pruner is ``sha`` or ``hyperband`` (seeded PRUNED with those values, so
  the pruner's rungs compare new trials with it);
- **its parameters lie inside the new space**: every searched key has a value (from its
  ``config.yaml``, or for a config group from its overrides) that the dimension can sample: one of
  the choices, or inside the interval and on its step, an integer for an integer dimension;
- **its fixed settings are the new search's**: every key of the ``model`` and ``data`` groups,
  ``trainer.max_steps``, and every key that its own overrides or the new search's fixed overrides
  set, except the searched keys (and the keys inside a searched config group) and ``hydra.*`` and
  ``resume.*``, has the same value in its ``config.yaml`` as in the new search's composed config.
  Other keys (``trainer.eval_every``, ``trainer.log_every``, the checkpoint schedule, ...) left at
  their defaults on both sides are not compared: they do not change what a trial learns, or
  stay equal unless one side sets them.

The objective must be the earlier sweep's: a search records its key and direction, and another
one refuses the warm start (:func:`check_objective`); a grid sweep has no direction, and its
trials' values of the key are taken.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcsweep.files.metric_keys import finite_metric
from hpcsweep.search.space import Dimension, SearchSpace

WARM_START_KEY = "hydra.sweeper.warm_start"
FINISHED_STATUSES = ("completed", "stopped_early")
PRUNED_KEEPING_PRUNERS = ("sha", "hyperband")
"""The pruners whose rungs compare a new trial with the values an earlier pruned trial reported."""
NOT_COMPARED_GROUPS = ("hydra", "resume")
"""Top-level keys that never count as fixed settings: how a trial is launched or resumed, not what it trains."""
ALWAYS_COMPARED = ("model", "data", "trainer.max_steps")
_UNSET = object()


@dataclass(frozen=True)
class EarlierTrial:
    """One trial of an earlier sweep, as its trial dir and its sweep's records hold it."""

    sweep_dir: str
    num: int
    status: str | None
    """metrics.json's ``status``; None when the trial has no metrics.json (it never started)."""
    metrics: Mapping[str, Any]
    config: Mapping[str, Any] | None
    """Its ``config.yaml`` (what it trained with); None when it has none."""
    overrides: Mapping[str, Any]
    """Its overrides (``sweep.json``) as key (or config group) -> value, as Hydra parses them."""
    intermediate_values: Mapping[int, float] = field(default_factory=dict)
    """The values it reported to its study by step (a search's trials only)."""

    @property
    def name(self) -> str:
        """How messages name it: ``SWEEP_DIR#NUM``."""
        return f"{self.sweep_dir}#{self.num}"


@dataclass(frozen=True)
class EarlierSweep:
    """A sweep dir named in ``hydra.sweeper.warm_start`` and its trials."""

    sweep_dir: str
    objective: str | None
    """A search's objective key; None for a grid sweep (which optimised nothing)."""
    direction: str | None
    trials: tuple[EarlierTrial, ...]


@dataclass(frozen=True)
class SeedTrial:
    """An earlier trial as the new study receives it."""

    sweep_dir: str
    num: int
    state: str
    """``COMPLETE`` or ``PRUNED``."""
    value: float | None
    params: dict[str, Any]
    intermediate_values: dict[int, float]


@dataclass(frozen=True)
class Dropped:
    """An earlier trial left out, and why: ``kind`` groups the reasons, ``reason`` says it in words."""

    trial: str
    kind: str
    reason: str


@dataclass(frozen=True)
class WarmStart:
    """The trials a search starts from, and those it left out."""

    kept: tuple[SeedTrial, ...]
    dropped: tuple[Dropped, ...]

    def lines(self, sweeps: int) -> list[str]:
        """What the command prints: how many were kept, then each reason with its count and an example."""
        total = len(self.kept) + len(self.dropped)
        lines = [f"warm start: {len(self.kept)} of {total} earlier trials of {sweeps} sweep(s) seed the study"]
        counts = Counter(d.kind for d in self.dropped)
        for kind, count in counts.most_common():
            example = next(d for d in self.dropped if d.kind == kind)
            more = f" (and {count - 1} more)" if count > 1 else ""
            lines.append(f"  dropped {count} {kind}, e.g. {example.trial}: {example.reason}{more}")
        return lines


def check_objective(sweep: EarlierSweep, objective: str, direction: str) -> None:
    """``ValueError`` when an earlier search optimised another metrics key, or in the other direction."""
    if sweep.objective is None:
        return
    if (sweep.objective, sweep.direction) != (objective, direction):
        raise ValueError(
            f"{WARM_START_KEY}={sweep.sweep_dir} is not allowed: that search {sweep.direction}d {sweep.objective} "
            f"and this one would {direction} {objective}; warm start needs the same objective and direction"
        )


def select_trials(
    sweeps: Sequence[EarlierSweep], space: SearchSpace, config: Mapping[str, Any],
    fixed_keys: Sequence[str], objective: str, pruner: str,
) -> WarmStart:
    """The earlier trials to seed a search of ``space`` with, and why each other one is left out.

    ``config`` is the new search's composed trial config (plain values), ``fixed_keys`` the keys
    its fixed overrides set.
    """
    kept: list[SeedTrial] = []
    dropped: list[Dropped] = []
    new_leaves = dict(_leaves(config))
    for sweep in sweeps:
        for trial in sweep.trials:
            outcome = _select(trial, space, new_leaves, fixed_keys, objective, pruner)
            (kept if isinstance(outcome, SeedTrial) else dropped).append(outcome)
    return WarmStart(tuple(kept), tuple(dropped))


def _select(
    trial: EarlierTrial, space: SearchSpace, new_leaves: Mapping[str, Any],
    fixed_keys: Sequence[str], objective: str, pruner: str,
) -> SeedTrial | Dropped:
    state, value = _ending(trial, objective, pruner)
    if state is None:
        return Dropped(trial.name, *value)
    if trial.config is None:
        return Dropped(trial.name, "without config.yaml", "its trial dir has no config.yaml")
    params: dict[str, Any] = {}
    for dim in space.dimensions:
        params[dim.key], outside = _param(trial, dim)
        if outside is not None:
            return Dropped(trial.name, "outside the space", outside)
    difference = _fixed_difference(trial, space, new_leaves, fixed_keys)
    if difference is not None:
        return Dropped(trial.name, "with other fixed settings", difference)
    return SeedTrial(trial.sweep_dir, trial.num, state, value, params, dict(trial.intermediate_values))


def _ending(trial: EarlierTrial, objective: str, pruner: str) -> tuple[str | None, Any]:
    """``(state, value)`` to seed it with, or ``(None, (kind, reason))`` when it did not finish usably."""
    if trial.status in FINISHED_STATUSES:
        value = finite_metric(trial.metrics, objective)
        if value is None:
            # Optuna fails a trial told NaN: a diverged trial is no point of the objective.
            return None, ("without the objective", f"its metrics.json has no finite number {objective}")
        return "COMPLETE", float(value)
    if trial.status == "pruned":
        if pruner not in PRUNED_KEEPING_PRUNERS:
            return None, ("pruned", f"pruned trials seed only a search with pruner sha or hyperband, not {pruner}")
        if not trial.intermediate_values:
            return None, ("pruned", "pruned, and its study holds none of the values it reported")
        return "PRUNED", None
    status = "no metrics.json (it never started)" if trial.status is None else f"status {trial.status}"
    return None, ("not finished", f"{status}, not completed")


def _param(trial: EarlierTrial, dim: Dimension) -> tuple[Any, str | None]:
    """``(value, None)``: the trial's value of a searched key; ``(None, why)`` when it has none inside the dimension."""
    assert trial.config is not None
    value = _lookup(trial.config, dim.key)
    if value is _UNSET or isinstance(value, Mapping):
        # A config group (model=llama_small) is named only by the overrides that chose it.
        value = trial.overrides.get(dim.key, _UNSET)
    if value is _UNSET:
        return None, f"{dim.key} is not in its config.yaml or its overrides"
    if isinstance(value, Mapping) or (isinstance(value, bool) and dim.kind != "categorical"):
        return None, f"{dim.key}={value!r} is not a value {_describe(dim)} can take"
    if dim.kind != "categorical" and not isinstance(value, (int, float)):
        return None, f"{dim.key}={value!r} is not a number, and this search takes {_describe(dim)}"
    if dim.kind == "categorical" and not any(type(value) is type(c) and value == c for c in dim.choices):
        return None, f"{dim.key}={value!r} is not one of {_describe(dim)}"
    if not dim.contains(value):
        return None, f"{dim.key}={value!r} is outside {_describe(dim)}"
    return value, None


def _describe(dim: Dimension) -> str:
    if dim.kind == "categorical":
        return f"choice({', '.join(map(repr, dim.choices))})"
    text = f"interval({dim.low:g}, {dim.high:g})"
    if dim.kind == "int":
        text = f"range({dim.low}, {dim.high + 1}, {dim.step})" if (dim.step or 1) > 1 else f"tag(int, {text})"
    return f"tag(log, {text})" if dim.log else text


def _fixed_difference(
    trial: EarlierTrial, space: SearchSpace, new_leaves: Mapping[str, Any], fixed_keys: Sequence[str]
) -> str | None:
    """The first fixed setting whose value differs from the new search's, in words; None when all agree."""
    assert trial.config is not None
    old_leaves = dict(_leaves(trial.config))
    prefixes = [*ALWAYS_COMPARED, *trial.overrides, *fixed_keys]
    searched = [dim.key for dim in space.dimensions]
    for key in sorted({*old_leaves, *new_leaves}):
        if not _under(key, prefixes) or _under(key, searched) or key.split(".")[0] in NOT_COMPARED_GROUPS:
            continue
        old, new = old_leaves.get(key, _UNSET), new_leaves.get(key, _UNSET)
        if old != new or isinstance(old, bool) != isinstance(new, bool):
            return f"{key}={_shown(old)}, and this search has {_shown(new)}"
    return None


def _under(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


def _shown(value: Any) -> str:
    return "unset" if value is _UNSET else repr(value)


def _lookup(values: Mapping[str, Any], key: str) -> Any:
    node: Any = values
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _UNSET
        node = node[part]
    return node


def _leaves(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every ``(dotted.key, value)`` of a nested mapping; a list is one value."""
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
