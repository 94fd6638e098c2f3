"""A search sweep's settings and where its files live in SWEEP_DIR.

The sweeper validates ``hydra.sweeper.*`` into ``SearchSettings`` and writes them with the space
into ``SWEEP_DIR/search/search.json``; every array task and every worker that reports to the
study reads them back from there, so all agree on one study, sampler and pruner.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from hpcsweep.files.atomic import atomic_write_json
from hpcsweep.search.space import SearchSpace, space_from_dict

SEARCH_DIR = "search"
SETTINGS_FILE = "search.json"
JOURNAL_FILE = "study.journal"
TRIALS_DIR = "trials"
STUDY_NAME = "search"
SAMPLERS = ("tpe", "random", "cmaes", "qmc")
PRUNERS = ("none", "median", "sha", "hyperband")
DIRECTIONS = ("minimize", "maximize")


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """The validated ``hydra.sweeper`` settings of a search (see ``SearchSweeperConf`` for each key)."""

    n_trials: int = 16
    sampler: str = "tpe"
    pruner: str = "none"
    objective: str = "best_val_loss"
    direction: str = "minimize"
    seed: int | None = None
    n_startup_trials: int = 5
    n_warmup_steps: int = 0
    min_resource: int | None = None
    max_resource: int | None = None
    reduction_factor: int = 3
    heartbeat_interval_s: int = 30
    grace_period_s: int = 300
    warm_start: tuple[str, ...] = ()
    """Earlier sweep dirs whose finished trials seed the study when it is created (``hpcsweep.search.warm_start``)."""
    pruner_startup_trials: int | None = None
    """The median pruner's start-up where the sweeper lowered it (:func:`with_pruner_startup`), not a
    ``hydra.sweeper`` key; None: ``n_startup_trials``, as the sampler's."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "warm_start", _sweep_dirs(self.warm_start))
        for name, allowed in (("sampler", SAMPLERS), ("pruner", PRUNERS), ("direction", DIRECTIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"hydra.sweeper.{name}={getattr(self, name)!r} is not allowed: one of {', '.join(allowed)}"
                )
        for name, least in (("n_trials", 1), ("n_startup_trials", 0), ("n_warmup_steps", 0),
                            ("reduction_factor", 2), ("heartbeat_interval_s", 1), ("grace_period_s", 1)):
            _whole(name, getattr(self, name), least)
        for name in ("min_resource", "max_resource", "seed"):
            if getattr(self, name) is not None:
                _whole(name, getattr(self, name), 0 if name == "seed" else 1)
        if (self.pruner == "hyperband" and self.min_resource is not None and self.max_resource is not None
                and self.min_resource > self.max_resource):
            raise ValueError(
                f"hydra.sweeper.min_resource={self.min_resource} is not allowed: "
                f"at most max_resource={self.max_resource}"
            )
        if self.grace_period_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"hydra.sweeper.grace_period_s={self.grace_period_s} is not allowed: "
                f"more than heartbeat_interval_s={self.heartbeat_interval_s}"
            )
        if not self.objective:
            raise ValueError("hydra.sweeper.objective='' is not allowed: a metrics.json key such as best_val_loss")
        if self.pruner != "none" and self.n_trials == 1 and not self.warm_start:
            raise ValueError(
                f"hydra.sweeper.pruner={self.pruner} is not allowed with n_trials=1: a pruner stops a trial "
                "by the trials beside it, and one trial has none; set pruner=none, more n_trials or warm_start"
            )


def _sweep_dirs(value: Any) -> tuple[str, ...]:
    """``warm_start`` as a tuple of paths: null is none, one path is a list of one."""
    if value is None:
        return ()
    paths = (value,) if isinstance(value, str) else value
    if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) and p for p in paths):
        raise ValueError(f"hydra.sweeper.warm_start={value!r} is not allowed: a list of sweep dirs, [DIR, ...]")
    return tuple(paths)


def _whole(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"hydra.sweeper.{name}={value!r} is not allowed: a whole number >= {least}")


def with_trial_steps(settings: SearchSettings, steps: Sequence[tuple[int, int]]) -> SearchSettings:
    """``settings`` with the pruner's unset rungs taken from the trials' ``(first, last)`` objective steps.

    Left to Optuna, Hyperband's last rung and successive halving's first are estimated from the
    first trial to finish, and nothing is pruned before one has: in an array that starts
    ``array_parallelism`` trials at once, the whole first wave would run to the end. Hyperband's
    first rung stays at Optuna's 1: a trial's first evaluation then passes the low rungs of every
    bracket at once, which prunes sooner than starting them at the first evaluation.
    """
    if not steps:
        return settings
    first = min(step for step, _ in steps)
    last = max(step for _, step in steps)
    if settings.pruner == "hyperband" and settings.max_resource is None:
        return replace(settings, max_resource=max(last, settings.min_resource or 1))
    if settings.pruner == "sha" and settings.min_resource is None:
        return replace(settings, min_resource=first)
    return settings


def median_startup(settings: SearchSettings) -> int:
    """The trials that must complete before the median pruner prunes (warm-start trials count)."""
    return settings.n_startup_trials if settings.pruner_startup_trials is None else settings.pruner_startup_trials


def with_pruner_startup(settings: SearchSettings) -> SearchSettings:
    """``settings`` with the median pruner's start-up lowered where ``n_startup_trials`` leaves it no
    trial to prune: Optuna's median pruner acts once that many trials have completed, so at 5 (the
    default) a search of 4 trials never prunes. Lowered to a quarter of ``n_trials`` (at least 1), for
    the pruner alone: TPE and CMA-ES keep ``n_startup_trials`` random trials. Finished ``warm_start``
    trials count towards the start-up too, so lowering it there changes nothing they already pass."""
    if settings.pruner != "median" or settings.n_startup_trials < settings.n_trials:
        return settings
    return replace(settings, pruner_startup_trials=max(1, settings.n_trials // 4))


def settings_from_mapping(raw: Mapping[str, Any]) -> SearchSettings:
    """``SearchSettings`` from ``hydra.sweeper``'s keys (others, such as ``_target_``, are ignored);
    ``warm_start``'s paths are made absolute, from the working directory."""
    names = {f.name for f in fields(SearchSettings)}
    settings = SearchSettings(**{k: v for k, v in raw.items() if k in names})
    # Absolute, so that running the sweep dir again from elsewhere names the same sweeps.
    return replace(settings, warm_start=tuple(str(Path(p).expanduser().resolve()) for p in settings.warm_start))


@dataclass(frozen=True)
class SearchFiles:
    """Where a search sweep keeps its study, its settings and each trial's chosen parameters."""

    sweep_dir: Path

    @property
    def root(self) -> Path:
        """``SWEEP_DIR/search``."""
        return Path(self.sweep_dir) / SEARCH_DIR

    @property
    def journal(self) -> Path:
        """The Optuna journal: ``optuna.load_study(study_name="search", storage=JournalStorage(JournalFileBackend(path)))``."""
        return self.root / JOURNAL_FILE

    @property
    def settings(self) -> Path:
        """``search.json``: the settings and the space."""
        return self.root / SETTINGS_FILE

    def trial(self, num: int) -> Path:
        """Trial ``num``'s record: its study trial number and parameters, once chosen."""
        return self.root / TRIALS_DIR / f"{num}.json"


@dataclass(frozen=True)
class SearchPlan:
    """What ``search.json`` holds: the settings and the space."""

    settings: SearchSettings
    space: SearchSpace

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form :func:`parse_plan` reads."""
        return {"settings": asdict(self.settings), "space": self.space.to_dict(), "study_name": STUDY_NAME}


def write_plan(files: SearchFiles, plan: SearchPlan) -> None:
    """Write ``search.json`` atomically."""
    atomic_write_json(files.settings, plan.to_dict())


def parse_plan(text: str) -> SearchPlan:
    """The plan in the text of ``search.json``."""
    raw = json.loads(text)
    return SearchPlan(SearchSettings(**raw["settings"]), space_from_dict(raw["space"]))


def read_plan(files: SearchFiles) -> SearchPlan | None:
    """The sweep's plan, or None when the sweep is not a search."""
    try:
        return parse_plan(files.settings.read_text())
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class TrialChoice:
    """One array task's study trial: its number in the study and the parameters it runs with."""

    num: int
    study_trial: int
    params: dict[str, Any]
    overrides: list[str]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form :func:`parse_choice` reads."""
        return asdict(self)


def parse_choice(text: str) -> TrialChoice:
    """A ``trials/<num>.json`` record."""
    return TrialChoice(**json.loads(text))


def read_choice(files: SearchFiles, num: int) -> TrialChoice | None:
    """Trial ``num``'s recorded choice, or None before it was made."""
    try:
        return parse_choice(files.trial(num).read_text())
    except FileNotFoundError:
        return None


def write_choice(files: SearchFiles, choice: TrialChoice) -> None:
    """Record a trial's choice atomically (other nodes and the report read it)."""
    atomic_write_json(files.trial(choice.num), choice.to_dict())


def read_choices(sweep_dir: Path) -> dict[int, TrialChoice]:
    """Every recorded choice of a sweep (none for a grid sweep), by trial number."""
    found = {}
    for path in (Path(sweep_dir) / SEARCH_DIR / TRIALS_DIR).glob("*.json"):
        choice = parse_choice(path.read_text())
        found[choice.num] = choice
    return found
