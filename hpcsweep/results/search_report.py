"""What the report adds for a search sweep: the best trial, the command that reruns it, the optimisation history.

Read from the study itself (the Optuna journal in ``SWEEP_DIR/search/``), so the best trial is
the one Optuna reports; a grid sweep has no ``search.json`` and gets none of this.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcsweep.search.settings import SearchFiles, TrialChoice, read_choices, read_plan

RERUN_COMMAND = "python -m hpcsweep"


@dataclass(frozen=True)
class StudyTrial:
    """One study trial as the report shows it: ``num`` is the sweep's trial (None if no slot names it)."""

    number: int
    num: int | None
    state: str
    """``COMPLETE``, ``PRUNED``, ``FAIL``, ``RUNNING`` or ``WAITING``."""
    value: float | None
    last_step: int | None
    params: dict[str, Any]
    warm_start: str | None = None
    """For a trial seeded by ``hydra.sweeper.warm_start``: the earlier trial, ``SWEEP_DIR#NUM``."""


@dataclass(frozen=True)
class SearchSummary:
    """A search's study trials and its best one."""

    objective: str
    direction: str
    trials: list[StudyTrial]
    best: StudyTrial | None
    choices: dict[int, TrialChoice]


def summarize_study(frozen: Sequence[Any], objective: str, direction: str, choices: dict[int, TrialChoice]) -> SearchSummary:
    """The summary of a study's frozen trials (pure; ``best`` is the best COMPLETE trial)."""
    from hpcsweep.search.study import NUM_ATTR, WARM_START_ATTR

    trials = [
        StudyTrial(
            number=t.number,
            num=t.user_attrs.get(NUM_ATTR),
            state=t.state.name,
            value=t.value if t.value is not None else (t.intermediate_values[t.last_step] if t.last_step is not None else None),
            last_step=t.last_step,
            params=dict(t.params),
            warm_start=earlier_trial_name(t.user_attrs.get(WARM_START_ATTR)),
        )
        for t in frozen
    ]
    complete = [t for t in trials if t.state == "COMPLETE" and t.value is not None]
    pick = max if direction == "maximize" else min
    best = pick(complete, key=lambda t: t.value) if complete else None
    return SearchSummary(objective, direction, trials, best, choices)


def earlier_trial_name(origin: Any) -> str | None:
    """``SWEEP_DIR#NUM`` of a seeded trial's warm-start attribute; None for a trial of this sweep."""
    return f"{origin['sweep_dir']}#{origin['num']}" if isinstance(origin, dict) else None


def load_search_summary(sweep_dir: Path) -> SearchSummary | None:
    """The sweep's search summary, or None for a sweep that is not a search."""
    files = SearchFiles(Path(sweep_dir))
    plan = read_plan(files)
    if plan is None or not files.journal.exists():
        return None
    import optuna

    from hpcsweep.search.study import STUDY_NAME, open_storage

    study = optuna.load_study(study_name=STUDY_NAME, storage=open_storage(files, plan.settings))
    return summarize_study(study.get_trials(deepcopy=False), plan.settings.objective, plan.settings.direction,
                           read_choices(Path(sweep_dir)))


def rerun_command(overrides: Sequence[str]) -> str:
    """The shell command that runs these overrides as one trial (each quoted for the shell)."""
    return " ".join([RERUN_COMMAND, *(shlex.quote(o) for o in overrides)])


def best_trial_text(summary: SearchSummary) -> str:
    """The report's lines on the search: counts by state, the best trial, its parameters and rerun command."""
    counts: dict[str, int] = {}
    for trial in summary.trials:
        counts[trial.state] = counts.get(trial.state, 0) + 1
    states = ", ".join(f"{n} {state.lower()}" for state, n in counts.items())
    lines = [f"search: {len(summary.trials)} study trials ({states}); {summary.direction} {summary.objective}"]
    best = summary.best
    if best is None:
        lines.append("best: none yet (no study trial has completed)")
        return "\n".join(lines) + "\n"
    params = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in best.params.items())
    slot = f"#{best.num}" if best.num is not None else "no trial dir"
    if best.warm_start is not None:
        slot = f"warm start {best.warm_start}"
    lines.append(f"best: {slot} (study trial {best.number}) {summary.objective}={best.value:.6g}  {params}")
    choice = summary.choices.get(best.num) if best.num is not None else None
    if choice is not None:
        lines.append(f"rerun it as one trial: {rerun_command(choice.overrides)}")
    return "\n".join(lines) + "\n"


def plot_history(ax: Any, summary: SearchSummary) -> None:
    """The optimisation history on ``ax``: the objective by study trial, pruned trials marked, the best so far."""
    done = [t for t in summary.trials if t.value is not None and t.state in ("COMPLETE", "PRUNED")]
    complete = [t for t in done if t.state == "COMPLETE"]
    pruned = [t for t in done if t.state == "PRUNED"]
    ax.scatter([t.number for t in complete], [t.value for t in complete], label="completed")
    ax.scatter([t.number for t in pruned], [t.value for t in pruned], marker="x", color="tab:red",
               label="pruned (value when pruned)")
    best_so_far, xs, ys = None, [], []
    for trial in sorted(complete, key=lambda t: t.number):
        better = best_so_far is None or (
            trial.value > best_so_far if summary.direction == "maximize" else trial.value < best_so_far
        )
        best_so_far = trial.value if better else best_so_far
        xs.append(trial.number)
        ys.append(best_so_far)
    if xs:
        ax.step(xs, ys, where="post", color="tab:green", label="best so far")
    ax.set_xlabel("study trial")
    ax.set_ylabel(summary.objective)
    ax.set_title("optimisation history")
    ax.grid(True, alpha=0.3)
    if done:
        ax.legend(fontsize="small")
