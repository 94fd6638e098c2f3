"""The Optuna study of a search sweep: a journal file in SWEEP_DIR, its sampler, pruner and heartbeat.

``JournalFileBackend`` appends every operation to one file under its lock (a symlink created
atomically, so it holds on NFS and Lustre too), and every process replays the file: array tasks
and workers on any node share one history with no database server and no driver process.

Optuna's heartbeat (``record_heartbeat``, ``fail_stale_trials``) is only built into its RDB storage;
``HeartbeatJournalStorage`` adds it to the journal: a running trial's task records a heartbeat as
a trial system attribute, and a trial whose last heartbeat is older than the grace period (its
task was SIGKILLed, or its node lost) is failed by the next task that asks for a trial. The file
stays a plain journal: ``optuna.load_study`` and ``optuna-dashboard`` open it as usual.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.storages import JournalStorage
# Optuna exports no public name for the heartbeat interface that fail_stale_trials checks for.
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from hpcsweep.files.metric_keys import metric_value
from hpcsweep.search.settings import STUDY_NAME, SearchFiles, SearchSettings, median_startup
from hpcsweep.search.space import Dimension, SearchSpace
from hpcsweep.search.warm_start import SeedTrial

HEARTBEAT_ATTR = "hpcsweep:heartbeat"
"""The trial system attribute holding the time (``time.time()``) of its last heartbeat."""
NUM_ATTR = "hpcsweep_num"
"""The user attribute naming the sweep's trial (Hydra's job number, the array task) a study trial runs."""
WARM_START_ATTR = "hpcsweep_warm_start"
"""The user attribute of a study trial seeded by warm start: the earlier trial, ``{"sweep_dir": str, "num": int}``."""

optuna.logging.set_verbosity(optuna.logging.WARNING)


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """A journal storage with Optuna's heartbeat: stale running trials can be failed."""

    def __init__(self, backend: JournalFileBackend, heartbeat_interval_s: int, grace_period_s: int) -> None:
        super().__init__(backend)
        self._heartbeat_interval_s = heartbeat_interval_s
        self._grace_period_s = grace_period_s

    def record_heartbeat(self, trial_id: int) -> None:
        self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.time()
        return [
            trial._trial_id
            for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
            if now - last_heartbeat(trial) > self._grace_period_s
        ]

    def get_heartbeat_interval(self) -> int | None:
        return self._heartbeat_interval_s

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        return None


def last_heartbeat(trial: FrozenTrial) -> float:
    """When ``trial`` last showed it was alive: its last heartbeat, else its start."""
    beat = trial.system_attrs.get(HEARTBEAT_ATTR)
    if isinstance(beat, (int, float)):
        return float(beat)
    return trial.datetime_start.timestamp() if trial.datetime_start else 0.0


def open_storage(files: SearchFiles, settings: SearchSettings) -> HeartbeatJournalStorage:
    """The study's storage (the journal file is created on first write)."""
    files.root.mkdir(parents=True, exist_ok=True)
    backend = JournalFileBackend(str(files.journal))
    return HeartbeatJournalStorage(backend, settings.heartbeat_interval_s, settings.grace_period_s)


def distribution(dim: Dimension) -> BaseDistribution:
    """The Optuna distribution of one dimension."""
    if dim.kind == "float":
        return FloatDistribution(dim.low, dim.high, log=dim.log)
    if dim.kind == "int":
        return IntDistribution(dim.low, dim.high, log=dim.log, step=dim.step or 1)
    return CategoricalDistribution(dim.choices)


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """The space as the fixed distributions ``study.ask`` takes."""
    return {dim.key: distribution(dim) for dim in space.dimensions}


def build_sampler(settings: SearchSettings, num: int) -> optuna.samplers.BaseSampler:
    """The sampler of array task ``num``.

    With a seed, each task's sampler gets its own seed, derived from ``(seed, num)``: tasks released
    in the same second would otherwise draw the same random start-up points (and ``seed + num``
    would make seeds 0 and 1 share all but one task's draws). QMC indexes its sequence by the
    study's trial number instead, so every task shares the seed.
    """
    seed = None if settings.seed is None else task_seed(settings.seed, num)
    if settings.sampler == "tpe":
        # constant_liar: trials still running count as bad guesses, so parallel tasks spread out.
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=settings.n_startup_trials)
    if settings.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if settings.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=settings.n_startup_trials)
    return optuna.samplers.QMCSampler(seed=settings.seed, scramble=True)


def task_seed(seed: int, num: int) -> int:
    """A 32-bit seed for task ``num`` of a search seeded ``seed`` (string seeding hashes it with SHA-512)."""
    return random.Random(f"{seed}:{num}").getrandbits(32)


SAMPLER_PACKAGES = {"cmaes": "cmaes", "qmc": "scipy"}
"""Samplers that need a package Optuna does not install."""


def check_sampler_available(settings: SearchSettings) -> None:
    """``ValueError`` when the sampler needs a package this environment lacks (before anything is submitted)."""
    import importlib.util

    package = SAMPLER_PACKAGES.get(settings.sampler)
    if package and importlib.util.find_spec(package) is None:
        raise ValueError(
            f"hydra.sweeper.sampler={settings.sampler} is not allowed here: it needs the package {package} "
            f"(pip install {package}); tpe and random need nothing more"
        )


def build_pruner(settings: SearchSettings) -> optuna.pruners.BasePruner:
    """The pruner; every process builds the same one from the same settings."""
    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=median_startup(settings), n_warmup_steps=settings.n_warmup_steps
        )
    if settings.pruner == "sha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=settings.min_resource or "auto", reduction_factor=settings.reduction_factor
        )
    if settings.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=settings.min_resource or 1,
            max_resource=settings.max_resource or "auto",
            reduction_factor=settings.reduction_factor,
        )
    return optuna.pruners.NopPruner()


def create_study(files: SearchFiles, settings: SearchSettings) -> optuna.Study:
    """Create the study in the journal, or open it when a rerun of the sweep dir finds it there."""
    return optuna.create_study(
        storage=open_storage(files, settings),
        study_name=STUDY_NAME,
        direction=settings.direction,
        load_if_exists=True,
    )


def seed_study(study: optuna.Study, trials: Sequence[SeedTrial], space: SearchSpace, settings: SearchSettings) -> None:
    """Add warm start's earlier trials to a new study, as finished trials of the space's distributions.

    The sweeper calls it on the login node once the study is created and before it submits, so
    they are in the journal before the first array task asks for a trial; the search's
    ``n_trials`` new trials come after them. A trial with reported values also gets the rungs the
    search's successive-halving or Hyperband pruner compares new trials with.
    """
    dists = distributions(space)
    pruner = build_pruner(settings)
    first = len(study.get_trials(deepcopy=False))
    study.add_trials([
        optuna.trial.create_trial(
            state=TrialState[trial.state], value=trial.value, params=trial.params, distributions=dists,
            user_attrs={WARM_START_ATTR: {"sweep_dir": trial.sweep_dir, "num": trial.num}},
            system_attrs=completed_rungs(pruner, study, first + i, trial.intermediate_values),
            intermediate_values=trial.intermediate_values,
        )
        for i, trial in enumerate(trials)
    ])


def completed_rungs(
    pruner: optuna.pruners.BasePruner, study: optuna.Study, number: int, values: Mapping[int, float]
) -> dict[str, float]:
    """The ``completed_rung_N`` system attributes that successive halving (alone, or in study trial
    ``number``'s Hyperband bracket) would have given a trial that reported ``values`` and went on
    at every rung; {} for another pruner.

    Successive halving compares a trial at a rung only with the trials holding that rung's
    attribute: without them, a seeded trial's reported values would count for nothing.
    """
    from types import SimpleNamespace

    if isinstance(pruner, optuna.pruners.HyperbandPruner):
        # Optuna sizes the brackets on the first prune; a trial's bracket is a hash of the study's
        # name and the trial's number, the only attribute of the trial that _get_bracket_id reads.
        if not pruner._pruners:
            pruner._try_initialization(study)
        if not pruner._pruners:
            return {}
        halving = pruner._pruners[pruner._get_bracket_id(study, SimpleNamespace(number=number))]
    elif isinstance(pruner, optuna.pruners.SuccessiveHalvingPruner):
        halving = pruner
    else:
        return {}
    if not isinstance(halving._min_resource, int):
        return {}
    rungs: dict[str, float] = {}
    for step in sorted(values):
        while step >= halving._min_resource * halving._reduction_factor ** (
            halving._min_early_stopping_rate + len(rungs)
        ):
            rungs[f"completed_rung_{len(rungs)}"] = values[step]
    return rungs


def load_study(files: SearchFiles, settings: SearchSettings, num: int = 0) -> optuna.Study:
    """The study, with array task ``num``'s sampler and the sweep's pruner."""
    return optuna.load_study(
        study_name=STUDY_NAME,
        storage=open_storage(files, settings),
        sampler=build_sampler(settings, num),
        pruner=build_pruner(settings),
    )


def objective_value(metrics: dict[str, Any] | None, objective: str) -> float | None:
    """The objective in a trial's metrics.json, or None when it has none (or not a number); a dotted
    objective reads a nested score (``tasks.NAME.acc``, ``hpcsweep.files.metric_keys``)."""
    return metric_value(metrics, objective)
