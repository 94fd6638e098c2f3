"""One trial slot of a search sweep: which study trial this array task runs, and telling the study how it ended.

The sweeper queued ``n_trials`` slots carrying only the fixed overrides. When slot ``num`` starts,
its first node asks the study for parameters, from the whole history at that moment, and records
them (``SWEEP_DIR/search/trials/<num>.json`` and ``sweep.json``); the trial then runs with them as
overrides, so its ``config.yaml`` holds them. A slot that starts again (a requeue after
preemption, a time limit or a node failure; a rerun of the sweep) finds its record and resumes the
same study trial with the same parameters in the same trial dir. Only when the study has failed
that trial meanwhile (its heartbeat went stale during a long requeue wait) does a replacement
trial take over its parameters and reported values, so the study never holds two live trials of
one slot. The other nodes of a multi-node trial wait for the record and only read it.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcsweep.files.metrics_file import read_metrics
from hpcsweep.files.sweep_record import record_trial_overrides
from hpcsweep.files.trial_files import METRICS_FILE
from hpcsweep.files.wait import wait_for
from hpcsweep.search.settings import SearchFiles, SearchPlan, TrialChoice, read_choice, read_plan, write_choice

log = logging.getLogger(__name__)

SEARCH_SWEEPER_TARGET = "hydra_plugins.hpcsweep_plugins.search_sweeper.SearchSweeper"
CHOICE_WAIT_S = 600
"""How long a node other than the first waits for the first node's choice of parameters."""


@dataclass
class SearchSlot:
    """What a trial runs with: its overrides (the chosen parameters in a search), and how it ended."""

    overrides: list[str]
    working_dir: str | None = None
    return_value: Any = None
    ended: bool = field(default=False)
    searched: bool = False
    """In a search: the overrides hold parameters the study chose in this task, never checked on the login node."""

    def checked_here(self, checked: Any) -> Any:
        """``checked`` (what the login node made of the trial's config) for the trial to run; None in a
        search, whose task checks the parameters it chose."""
        return None if self.searched else checked

    def ran(self, job_return: Any) -> Any:
        """Note the trial's Hydra ``JobReturn`` (its dir and return value); returns it unchanged."""
        from hydra.core.utils import JobStatus

        self.working_dir = job_return.working_dir
        # A failed job's return_value re-raises its error; its metrics.json says how it ended.
        self.return_value = job_return.return_value if job_return.status == JobStatus.COMPLETED else None
        self.ended = True
        return job_return


def is_search(config: Any) -> bool:
    """True when ``config`` (a multirun's master config) is a search sweep's."""
    from omegaconf import OmegaConf

    return OmegaConf.select(config, "hydra.sweeper._target_", default=None) == SEARCH_SWEEPER_TARGET


def node_rank(env: Mapping[str, str]) -> int:
    """This task's rank among its trial's tasks (0 outside Slurm)."""
    from hpcsweep.slurm.env import slurm_job_env

    job = slurm_job_env(env)
    return job.procid if job is not None else 0


@contextmanager
def search_slot(
    config: Any, overrides: Sequence[str], num: int, env: Mapping[str, str] = os.environ
) -> Iterator[SearchSlot]:
    """Run trial ``num`` of a sweep inside this: for a search, with the study's parameters.

    Not a search sweep: the slot holds ``overrides`` unchanged and nothing else happens. In a
    search, node 0 chooses (or finds) the study trial, records a heartbeat while the trial runs,
    and tells the study COMPLETE, PRUNED or FAIL from its metrics.json once it has ended; a trial
    that stops for a requeue stays RUNNING for the requeued task to resume.
    """
    if not is_search(config):
        yield SearchSlot(list(overrides))
        return
    from hydra.core.utils import setup_globals

    setup_globals()  # the sweep dir's ${now:...}, resolved from the master config's cache
    files = SearchFiles(Path(str(config.hydra.sweep.dir)).resolve())
    plan = read_plan(files)
    if plan is None:
        raise RuntimeError(f"{files.settings} is missing: the search sweeper writes it before submitting")
    first = node_rank(env) == 0
    study, choice = choose(files, plan, num) if first else (None, wait_for_choice(files, num))
    slot = SearchSlot(list(choice.overrides), searched=True)
    if study is None:
        yield slot
        return
    with heartbeat(study, choice.study_trial, plan.settings.heartbeat_interval_s):
        try:
            yield slot
        except Exception:
            tell_ended(study, choice, "failed", None)
            raise
    if slot.ended:
        tell_from_results(study, plan, choice, slot)


def study_trial_file(hydra_config: Any) -> Path | None:
    """The study trial's file of the search trial Hydra runs now (``hydra_config``: ``HydraConfig.get()``),
    which its workers' pruning reporter reads; None outside a search."""
    from omegaconf import OmegaConf

    if OmegaConf.select(hydra_config, "sweeper._target_", default=None) != SEARCH_SWEEPER_TARGET:
        return None
    return SearchFiles(Path(str(hydra_config.sweep.dir)).resolve()).trial(int(hydra_config.job.num))


def choose(files: SearchFiles, plan: SearchPlan, num: int) -> tuple[Any, TrialChoice]:
    """The study and trial ``num``'s choice: the recorded one (a resume), else a new trial asked now."""
    import optuna

    from hpcsweep.search.study import NUM_ATTR, distributions, load_study

    study = load_study(files, plan.settings, num)
    with warnings.catch_warnings():
        # fail_stale_trials is "experimental" since Optuna 2.9, and ask() warns that heartbeats are
        # meant for optimize(): here the slot itself records them, in place of optimize().
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        optuna.storages.fail_stale_trials(study)
        choice = read_choice(files, num)
        if choice is not None:
            return study, resume_choice(files, study, choice)
        trial = study.ask(distributions(plan.space))
    trial.set_user_attr(NUM_ATTR, num)
    choice = TrialChoice(num, trial.number, dict(trial.params), plan.space.overrides(trial.params))
    write_choice(files, choice)
    record_trial_overrides(files.sweep_dir, {num: choice.overrides})
    log.info("search trial #%d: study trial %d, %s", num, trial.number, " ".join(choice.overrides))
    return study, choice


def resume_choice(files: SearchFiles, study: Any, choice: TrialChoice) -> TrialChoice:
    """The recorded choice, on the same study trial unless the study failed it meanwhile.

    A failed study trial (stale heartbeat, or the trial failed and the sweep is run again) is
    replaced by a running one with the same parameters, reported values and slot number.
    """
    import datetime as dt

    from optuna.trial import FrozenTrial, TrialState

    trial = study.get_trials(deepcopy=False)[choice.study_trial]
    if trial.state != TrialState.FAIL:
        log.info("search trial #%d resumes study trial %d (%s)", choice.num, trial.number, trial.state.name)
        return choice
    template = FrozenTrial(
        number=0, state=TrialState.RUNNING, value=None, datetime_start=dt.datetime.now(), datetime_complete=None,
        params=trial.params, distributions=trial.distributions, user_attrs=trial.user_attrs,
        system_attrs={}, intermediate_values=trial.intermediate_values, trial_id=0,
    )
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    number = study._storage.get_trial(trial_id).number
    replaced = TrialChoice(choice.num, number, choice.params, choice.overrides)
    write_choice(files, replaced)
    log.warning("search trial #%d: study trial %d had failed; study trial %d takes it over",
                choice.num, trial.number, number)
    return replaced


def wait_for_choice(files: SearchFiles, num: int, timeout_s: float = CHOICE_WAIT_S) -> TrialChoice:
    """Trial ``num``'s choice, once the first node has recorded it."""
    choice = wait_for(lambda: read_choice(files, num), timeout_s, interval_s=0.5)
    if choice is None:
        raise RuntimeError(f"{files.trial(num)}: the first node chose no parameters within {timeout_s:g} s")
    return choice


@contextmanager
def heartbeat(study: Any, number: int, interval_s: float) -> Iterator[None]:
    """Record the study trial's heartbeat every ``interval_s`` while the block runs."""
    storage = study._storage
    trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    stop = threading.Event()

    def beat() -> None:
        while True:
            storage.record_heartbeat(trial_id)
            if stop.wait(interval_s):
                return

    thread = threading.Thread(target=beat, name="search-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def trial_metrics(slot: SearchSlot) -> dict[str, Any] | None:
    """The ended trial's metrics.json, else its task function's return value when that is a mapping."""
    if slot.working_dir:
        metrics = read_metrics(Path(slot.working_dir) / METRICS_FILE)
        if metrics is not None:
            return metrics
    return dict(slot.return_value) if isinstance(slot.return_value, Mapping) else None


def tell_from_results(study: Any, plan: SearchPlan, choice: TrialChoice, slot: SearchSlot) -> None:
    """Tell the study how the trial ended; a trial that only stopped (to be resumed) is left RUNNING,
    and one the budget skipped is FAIL."""
    from hpcsweep.search.study import objective_value

    metrics = trial_metrics(slot)
    if metrics is None:
        # Another app's task function may return the objective itself.
        value = objective_value({"value": slot.return_value}, "value")
        tell_ended(study, choice, "failed" if value is None else "completed", value)
        return
    status = metrics.get("status")
    if status in ("completed", "stopped_early"):
        value = objective_value(metrics, plan.settings.objective)
        if value is None:
            log.error("search trial #%d: metrics.json has no number %s: the study marks it FAIL",
                      choice.num, plan.settings.objective)
            tell_ended(study, choice, "failed", None)
        else:
            tell_ended(study, choice, "completed", value)
    elif status in ("pruned", "failed"):
        tell_ended(study, choice, status, None)
    elif status == "skipped_budget":
        # It trained nothing: a RUNNING trial would count as a pending guess until its heartbeat went
        # stale. A retry with more budget resumes the slot on a new study trial with these parameters.
        tell_ended(study, choice, "failed", None)


def tell_ended(study: Any, choice: TrialChoice, status: str, value: float | None) -> None:
    """Tell the study trial its end: ``completed`` with ``value``, ``pruned`` or ``failed``."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    try:
        if status == "completed":
            study.tell(choice.study_trial, value)
        else:
            study.tell(choice.study_trial, state=TrialState.PRUNED if status == "pruned" else TrialState.FAIL)
    except (UpdateFinishedTrialError, ValueError, RuntimeError) as err:
        # The trial ended before (a rerun of a finished trial) or was failed as stale meanwhile.
        log.warning("search trial #%d: study trial %d not told %s: %s", choice.num, choice.study_trial, status, err)
        return
    log.info("search trial #%d: study trial %d told %s%s", choice.num, choice.study_trial, status,
             "" if value is None else f" ({value:.6g})")
