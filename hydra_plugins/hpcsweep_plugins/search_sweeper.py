"""The search sweeper (``hydra/sweeper=search``): adaptive search with Optuna, as one job array, with no driver.

It validates the space and every end of it, creates the study (an Optuna journal in
``SWEEP_DIR/search/``; with ``warm_start``, seeded with earlier sweeps' finished trials), and
hands the launcher ``n_trials`` slots carrying the fixed overrides only: on Slurm one array
throttled by ``array_parallelism``, and the command returns. Each slot asks the study for its
parameters when it starts (``hpcsweep.search.trial_slot``), so later trials learn from earlier
ones; the local launcher runs the slots one after another the same way.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra.errors import HydraException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.hpcsweep_plugins.sweeper import MULTIRUN_FILE, is_refusal, missing_dirs, undo_sweep_dir

log = logging.getLogger(__name__)


class SearchSweeper(Sweeper):
    """Adaptive search over a space in Hydra's sweep syntax; settings in ``SearchSweeperConf``."""

    def __init__(self, **conf: Any) -> None:
        self.conf = {k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in conf.items()}
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Sequence[JobReturn]:
        from hpcsweep.search.settings import (
            SearchFiles,
            SearchPlan,
            read_plan,
            settings_from_mapping,
            with_pruner_startup,
            with_trial_steps,
            write_plan,
        )
        from hpcsweep.search.space import parse_space
        from hpcsweep.sweep.sweep_trials import exit_with_config_error

        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        files = SearchFiles(sweep_dir)
        params = [f"{key}={value}" for key, value in (self.conf.get("params") or {}).items()]
        try:
            asked = settings_from_mapping(self.conf)
            space = parse_space([*params, *arguments])
            settings = with_pruner_startup(with_trial_steps(asked, check_space(self, asked, space)))
            plan = same_search(read_plan(files), SearchPlan(asked, space), SearchPlan(settings, space))
            settings = plan.settings
            # A study is seeded once, when it is created: a rerun resumes it without its earlier sweeps.
            warm = None if files.journal.exists() else warm_start(self, settings, space, sweep_dir)
        except ValueError as err:
            exit_with_config_error(err, "nothing was submitted")
        created = missing_dirs(sweep_dir)
        new_search = not files.root.exists()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / MULTIRUN_FILE)
        write_plan(files, plan)
        from hpcsweep.search.study import create_study, seed_study

        study = create_study(files, settings)
        if warm is not None:
            seed_study(study, warm.kept, space, settings)
            for line in warm.lines(len(settings.warm_start)):
                log.info("%s", line)
        try:
            returns = self.launcher.launch(slot_overrides(sweep_dir, space, settings.n_trials), initial_job_idx=0)
        except BaseException as err:
            if new_search and is_refusal(err):
                shutil.rmtree(files.root)
            undo_sweep_dir(sweep_dir, created, None, is_refusal(err))
            raise
        merge_choices(sweep_dir)
        log.info("search: %s, sampler %s, pruner %s, %s %s; study %s (study_name=search)",
                 "1 trial" if settings.n_trials == 1 else f"{settings.n_trials} trials", settings.sampler, pruner_summary(settings), settings.direction,
                 settings.objective, files.journal)
        return returns


def pruner_summary(settings: Any) -> str:
    """The pruner and its rungs, or when the median pruner starts, for the submit's log line."""
    if settings.pruner == "median":
        return f"median ({median_start(settings)})"
    if settings.pruner == "hyperband":
        rungs = f"from step {settings.min_resource or 1} to {settings.max_resource or 'the first finished trial'}"
    elif settings.pruner == "sha":
        rungs = f"from step {settings.min_resource or 'estimated from the first finished trial'}"
    else:
        return settings.pruner
    return f"{settings.pruner} (rungs {rungs}, reduction factor {settings.reduction_factor})"


def median_start(settings: Any) -> str:
    """After how many trials the median pruner prunes, and from which step."""
    from hpcsweep.search.settings import median_startup

    startup = median_startup(settings)
    said = f"prunes once {startup} trial{'s have' if startup != 1 else ' has'} completed"
    if settings.pruner_startup_trials is not None:
        said += (f": n_startup_trials={settings.n_startup_trials} lowered to {startup} for the pruner, as "
                 f"{settings.n_trials} trials would leave it none to prune")
    else:
        said += f" (n_startup_trials={startup})"
    if settings.warm_start:
        said += ", warm-start trials included"
    return said + (f", after step {settings.n_warmup_steps}" if settings.n_warmup_steps else "")


def same_search(before: Any, asked: Any, plan: Any) -> Any:
    """The plan to search with: ``plan`` for a new search, the recorded one when a sweep dir is run again.

    A search recorded before its pruner's rungs were filled in from the trial config matches as it
    was asked (``asked``) and keeps its rungs. ``ValueError`` when the sweep dir holds a search of
    another space or other settings.
    """
    if before is not None and before == asked:
        return before
    check_same_search(before, plan)
    return plan


def check_same_search(before: Any, plan: Any) -> None:
    """``ValueError`` when a sweep dir run again holds a search of another space or other settings.

    Its study's trials were drawn from that space: resuming them under another would mix two searches.
    """
    if before is None or before == plan:
        return
    changed = [k for k in ("settings", "space") if getattr(before, k) != getattr(plan, k)]
    raise ValueError(
        f"hydra.sweep.dir holds a search with other {' and '.join(changed)}: run it again with the same "
        "space and hydra.sweeper settings, or search in a new sweep dir"
    )


def slot_overrides(sweep_dir: Path, space: Any, n_trials: int) -> list[list[str]]:
    """Each slot's overrides: the fixed ones, or in a sweep dir run again the parameters a slot chose
    (so that the launcher's checks compare a trial dir with the config it trained)."""
    from hpcsweep.search.settings import read_choices

    choices = read_choices(sweep_dir)
    return [list(choices[num].overrides) if num in choices else list(space.fixed) for num in range(n_trials)]


def merge_choices(sweep_dir: Path) -> None:
    """Write the parameters trials chose before ``sweep.json`` existed into it."""
    from hpcsweep.files.sweep_record import record_trial_overrides
    from hpcsweep.search.settings import read_choices

    choices = read_choices(sweep_dir)
    if choices:
        record_trial_overrides(sweep_dir, {num: choice.overrides for num, choice in choices.items()})


def warm_start(sweeper: SearchSweeper, settings: Any, space: Any, sweep_dir: Path) -> Any:
    """The earlier trials the new study starts from (``hydra.sweeper.warm_start``), and those left out;
    None without it. ``ValueError`` for a dir that is no readable sweep, or an earlier search of
    another objective."""
    if not settings.warm_start:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hpcsweep.search.earlier_sweeps import read_earlier_sweeps
    from hpcsweep.search.space import check_trials
    from hpcsweep.search.warm_start import check_objective, select_trials
    from hpcsweep.sweep.compose import SweepComposer

    sweeps = read_earlier_sweeps(settings.warm_start, sweep_dir)
    for sweep in sweeps:
        check_objective(sweep, settings.objective, settings.direction)
    assert sweeper.hydra_context is not None and sweeper.config is not None
    composer = SweepComposer(sweeper.hydra_context.config_loader, sweeper.config)
    # Any trial of the space has the fixed settings; the searched keys are not compared.
    config = composer.compose_values(check_trials(space)[0].overrides)
    fixed_keys = [o.key_or_group for o in OverridesParser.create().parse_overrides(list(space.fixed))]
    return select_trials(sweeps, space, config, fixed_keys, settings.objective, settings.pruner)


def check_space(sweeper: SearchSweeper, settings: Any, space: Any) -> list[tuple[int, int]]:
    """Compose and check a trial at every end of every dimension, as the launcher checks trials.

    ``ValueError`` naming the key and the value: an unknown key, or a value the key does not allow
    at either end of an interval (or for any choice), stops the sweep before anything is submitted.
    Returns the ``(first, last)`` objective steps of the checked trials that the app knows them of.
    """
    from hpcsweep.search.space import check_trials
    from hpcsweep.search.study import check_sampler_available
    from hpcsweep.sweep.compose import SweepComposer
    from hpcsweep.sweep.hooks import hook_of

    check_sampler_available(settings)
    launcher = sweeper.launcher
    assert sweeper.hydra_context is not None and sweeper.config is not None
    composer = SweepComposer(sweeper.hydra_context.config_loader, sweeper.config)
    hook = hook_of(launcher.task_function)
    hook.begin_sweep(launcher)
    launcher_params = getattr(launcher, "params", {})
    steps = []
    for trial in check_trials(space):
        # The checks' own messages name the key and the value that is not allowed.
        try:
            checked = hook.check_trial(composer.compose_app(trial.overrides), launcher_params)
        except HydraException as err:
            raise ValueError(f"search space: {str(err).splitlines()[0]}") from None
        except ValueError as err:
            raise ValueError(f"search space: {err}") from None
        hook.check_objective(checked, settings.objective)
        found = hook.objective_steps(checked)
        if found is not None:
            steps.append(found)
    return steps
