"""Read the sweep dirs named in ``hydra.sweeper.warm_start``: each trial's overrides, metrics.json and config.yaml.

The file side of warm start (``hpcsweep.search.warm_start`` decides what to keep). A grid sweep's
trials are those its ``sweep.json`` lists; so are a search's (``sweep.json`` records the
parameters each trial chose), and its study adds the values each one reported at its evaluations.
A path that is not a readable sweep dir is refused with one line naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hpcsweep.files.metrics_file import read_metrics
from hpcsweep.files.sweep_record import SWEEP_FILE, TrialRecord, read_sweep_record, resolve_trial_dir
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.search.settings import SearchFiles, SearchPlan, read_choices, read_plan
from hpcsweep.search.warm_start import WARM_START_KEY, EarlierSweep, EarlierTrial


def read_earlier_sweeps(paths: Sequence[str], this_sweep_dir: Path) -> list[EarlierSweep]:
    """The sweeps at ``paths`` (each once); ``ValueError`` naming the first that cannot be warm-started from."""
    return [read_earlier_sweep(Path(path), this_sweep_dir) for path in dict.fromkeys(paths)]


def read_earlier_sweep(path: Path, this_sweep_dir: Path) -> EarlierSweep:
    """One earlier sweep and its trials; ``ValueError`` when ``path`` holds no readable sweep."""
    where = f"{WARM_START_KEY}={path}"
    if path.resolve() == this_sweep_dir.resolve():
        raise ValueError(f"{where} is not allowed: it is this search's own sweep dir")
    try:
        record = read_sweep_record(path)
        plan = read_plan(SearchFiles(path))
    except FileNotFoundError:
        raise ValueError(
            f"{where} is not allowed: {path} holds no {SWEEP_FILE}; name the sweep dir of an earlier sweep"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"{where} is not allowed: {path / SWEEP_FILE} or its search.json cannot be read ({err})"
        ) from None
    reported = reported_values(path, plan) if plan is not None else {}
    trials = tuple(read_trial(path, trial, reported.get(trial.num, {})) for trial in record.trials)
    if plan is None:
        return EarlierSweep(str(path), None, None, trials)
    return EarlierSweep(str(path), plan.settings.objective, plan.settings.direction, trials)


def read_trial(sweep_dir: Path, trial: TrialRecord, reported: dict[int, float]) -> EarlierTrial:
    """A trial as its dir holds it: metrics.json, config.yaml, and its overrides parsed."""
    files = TrialFiles(resolve_trial_dir(sweep_dir, trial))
    metrics = read_metrics(files.metrics)
    return EarlierTrial(
        sweep_dir=str(sweep_dir), num=trial.num,
        status=None if metrics is None else metrics.get("status"), metrics=metrics or {},
        config=read_config(files.config), overrides=override_values(trial.overrides),
        intermediate_values=reported,
    )


def read_config(path: Path) -> dict[str, Any] | None:
    """A trial's ``config.yaml``, or None when it has none (or not a readable mapping)."""
    try:
        values = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return values if isinstance(values, dict) else None


def override_values(lines: Sequence[str]) -> dict[str, Any]:
    """Key (or config group) -> value of a trial's overrides, as Hydra parses them; a line Hydra
    cannot parse is left out (it never ran as a trial)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    values = {}
    for line in lines:
        try:
            override = parser.parse_override(line)
        except HydraException:
            continue
        if not override.is_delete():
            values[override.key_or_group] = override.value()
    return values


def reported_values(sweep_dir: Path, plan: SearchPlan) -> dict[int, dict[int, float]]:
    """The values each trial of a search reported to its study, by trial number then step."""
    files = SearchFiles(sweep_dir)
    if not files.journal.exists():
        return {}
    import optuna

    from hpcsweep.search.study import STUDY_NAME, open_storage

    study = optuna.load_study(study_name=STUDY_NAME, storage=open_storage(files, plan.settings))
    trials = study.get_trials(deepcopy=False)
    return {
        num: dict(trials[choice.study_trial].intermediate_values)
        for num, choice in read_choices(sweep_dir).items()
        if choice.study_trial < len(trials)
    }
