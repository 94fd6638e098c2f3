"""The trainer's side of a search: report the objective at each evaluation and ask the pruner.

A search trial's processes find their study trial in their attempt file (the path of
``SWEEP_DIR/search/trials/<num>.json``, ``trial_slot.study_trial_file``). Only the logging rank
talks to the study; the trainer broadcasts its decision so every rank stops at the same step.
A step the study holds already (the trial was resumed from an older checkpoint) is not reported
again: the values of a resumed trial stay one per step.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcsweep.search.settings import SearchFiles, parse_choice, parse_plan

PRUNED_STEP_TAG = "hparams/pruned_at_step"
"""The scalar a pruned trial logs, so TensorBoard's HParams table shows where it was pruned."""


class PruningReporter:
    """Reports one study trial's objective and asks its pruner (call from the logging rank only)."""

    def __init__(self, choice_path: Path) -> None:
        # The choice lives in SWEEP_DIR/search/trials/, beside search.json's folder.
        self.files = SearchFiles(choice_path.parents[2])
        self.choice = parse_choice(choice_path.read_text())
        self.plan = parse_plan(self.files.settings.read_text())
        self._study_and_id: tuple[Any, int] | None = None

    def _study(self) -> Any:
        if self._study_and_id is None:
            import optuna

            from hpcsweep.search.study import STUDY_NAME, build_pruner, open_storage

            study = optuna.load_study(
                study_name=STUDY_NAME,
                storage=open_storage(self.files, self.plan.settings),
                # Never asked to sample here; the cheapest sampler keeps Trial() from fitting TPE.
                sampler=optuna.samplers.RandomSampler(),
                pruner=build_pruner(self.plan.settings),
            )
            trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, self.choice.study_trial)
            self._study_and_id = (study, trial_id)
        return self._study_and_id

    def report(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Report the objective of ``metrics`` at ``step``, unless the study has that step already."""
        from hpcsweep.search.study import objective_value

        value = objective_value(dict(metrics), self.plan.settings.objective)
        if value is None:
            return
        study, trial_id = self._study()
        if step not in study._storage.get_trial(trial_id).intermediate_values:
            study._storage.set_trial_intermediate_value(trial_id, step, value)

    def should_prune(self) -> bool:
        """The pruner's decision for the values the study holds now."""
        import optuna

        study, trial_id = self._study()
        # A fresh Trial reads every value reported so far, this run's and earlier runs'.
        return bool(optuna.Trial(study, trial_id).should_prune())


def pruning_reporter(search_trial: Path | None) -> PruningReporter | None:
    """The reporter of the search trial whose file is ``search_trial`` (from the attempt file); None outside a search."""
    return PruningReporter(search_trial) if search_trial is not None else None
