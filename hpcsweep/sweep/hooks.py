"""What a Hydra app adds to hpcsweep's launchers: its trial checks, their Slurm size, its task context.

The launchers work for any Hydra app. Without a hook every trial gets the launcher's own size
(``hydra.launcher.nodes``, ``tasks_per_node``, ``gpus_per_node``) and the task function runs as
Hydra runs it. An app that knows more about its trials decorates its task function::

    @hydra.main(config_path="conf", config_name="config", version_base="1.3")
    @trial_hook(MyTrials())
    def main(cfg): ...

The hook hangs off the task function, not a registry or a config key: an app installed beside
hpcsweep never gets hpcsweep's hook, a user cannot skip an app's checks by picking a launcher,
and every process that has the task function (each array task unpickles it) has the hook too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hydra.core.utils import JobReturn
from omegaconf import DictConfig

from hpcsweep.files.sweep_record import TokenPreparationRecord

PLACEMENT_MODES = ("switches", "pin", "off")
"""How a multi-node job is placed on the switch tree (``hpcsweep.slurm.topology``)."""
DEFAULT_PLACEMENT = "switches"
DEFAULT_PLACEMENT_WAIT_MIN = 5

_HOOK_ATTRIBUTE = "__hpcsweep_trial_hook__"


@dataclass(frozen=True)
class Placement:
    """Where a multi-node trial should run: ``mode`` (``PLACEMENT_MODES``), waiting up to ``max_wait_min``."""

    mode: str = DEFAULT_PLACEMENT
    max_wait_min: int = DEFAULT_PLACEMENT_WAIT_MIN


@dataclass(frozen=True)
class Allocation:
    """One trial's Slurm allocation; trials with equal allocations share one job array.

    ``nodes_key`` and ``gpus_key`` name the config keys that set those amounts, for the refusal
    of a request the cluster can never satisfy.
    """

    nodes: int = 1
    tasks_per_node: int = 1
    # None: as many as ``hydra.launcher.gpus_per_node``. A launcher value of 0 (a CPU partition)
    # asks for none, whatever the trial says.
    gpus_per_node: int | None = None
    # Nodes never to run on, besides ``hydra.launcher.exclude``.
    exclude: tuple[str, ...] = ()
    # None: no switch constraint (single-node trials need none).
    placement: Placement | None = None
    nodes_key: str = "hydra.launcher.nodes"
    gpus_key: str = "hydra.launcher.gpus_per_node"


@dataclass(frozen=True)
class CheckedTrial:
    """A trial as its hook checked it: its allocation, and the app's own form of its config."""

    allocation: Allocation
    # What the hook made of the composed config (hpcsweep: a TrialConfig); None without a hook.
    app_config: Any = None


@dataclass(frozen=True)
class SweepStopped:
    """A stop ended a local sweep before every trial ran; ``what`` says which stopped and which did not start.

    ``code`` is the exit code of the first stopped trial, else that of the signal
    (``hpcsweep.control.exit_codes``): the command ends with it.
    """

    what: str
    code: int


@dataclass(frozen=True)
class SweepTrial:
    """One composed and checked trial of a sweep: Hydra's job ``num`` with its overrides and dir."""

    num: int
    overrides: list[str]
    trial_dir: Path
    allocation: Allocation
    app_config: Any = None


class TrialHook:
    """The generic behaviour; an app subclasses it and overrides what it knows better."""

    plain_values: bool = False
    """True: ``check_trial`` takes the config as resolved plain values (a ``dict``), which the
    launchers compose many times faster than a ``DictConfig`` (``hpcsweep.sweep.compose``)."""

    preload: tuple[str, ...] = ()
    """Third-party modules the task function imports, for a local sweep's fork server to import
    once for all its trials (``hpcsweep.sweep.fork_server``); never the app's own modules, which
    each trial imports from the sweep's ``sys.path``."""

    def begin_sweep(self, sweep: object) -> None:
        """Called before the trials of ``sweep`` (the launcher that runs them) are checked, so that an app
        that reads something once for all the trials of a sweep starts afresh for a new one. The same
        launcher again (a search's next batch, a retry's next trial) is the same sweep."""

    def check_trial(self, config: DictConfig, launcher: Mapping[str, Any]) -> CheckedTrial:
        """Validate one composed trial config (the app part, no ``hydra`` node) and size its allocation.

        Raises ``ValueError`` naming the key. ``launcher`` holds the ``hydra.launcher`` settings
        (empty for the local launcher).
        """
        return CheckedTrial(launcher_allocation(launcher))

    def check_sweep(self, trials: Sequence[SweepTrial]) -> None:
        """Validate the sweep as a whole once every trial passed ``check_trial``; ``ValueError``."""

    def sweep_facts(self, trials: Sequence[SweepTrial]) -> dict[str, Any]:
        """What ``sweep.json`` records about the checked sweep for the app (its ``app`` entry): plain JSON.

        Called before anything is submitted: a ``ValueError`` (naming the key) refuses the sweep.
        """
        return {}

    def check_cluster(self, trials: Sequence[SweepTrial], launcher: Mapping[str, Any], partition_gres: Sequence[str]) -> None:
        """Validate the sweep against the nodes of the partition it goes to (their GRES, as ``sinfo``
        prints them: ``gpu:a100:8(S:0-1)``); ``ValueError``. On Slurm only, once the allocations fit."""

    def check_objective(self, trial: CheckedTrial, objective: str) -> None:
        """``ValueError`` when a search's ``objective`` key names something the trial can never report."""

    def objective_steps(self, trial: CheckedTrial) -> tuple[int, int] | None:
        """``(first, last)``: the first step at which the trial reports its objective, and its last step.

        A search's successive-halving and Hyperband pruners take their rungs from it; None (unknown)
        leaves them to Optuna's estimates, which need a finished trial before anything is pruned.
        """
        return None

    def run_locally(
        self, trials: Sequence[SweepTrial], run_trials: Callable[[Sequence[SweepTrial]], list[JobReturn] | SweepStopped]
    ) -> list[JobReturn]:
        """Run a local sweep's trials through ``run_trials`` and return their JobReturns in trial order.

        ``run_trials`` runs them several at a time, each in its own process; after a stop signal it
        returns ``SweepStopped``, and the command ends with its line and code
        (``stopped_line`` lets an app add its own words, such as how to resume).
        """
        from hpcsweep.control.exit_codes import leave_with

        ran = run_trials(trials)
        if isinstance(ran, SweepStopped):
            leave_with(ran.code, self.stopped_line(ran.what))
        return ran

    def submit_preparation(
        self, trials: Sequence[SweepTrial], launcher: Mapping[str, Any], sweep_dir: Path
    ) -> TokenPreparationRecord | None:
        """Submit the one Slurm job the sweep's arrays must wait on (``afterok``), if the sweep needs one.

        Called once, after every check and before the first array is submitted; None: no job.
        """
        return None

    def container_paths(self, trials: Sequence[SweepTrial]) -> list[tuple[str, str]]:
        """What the trials read or write outside the sweep dir (a model, data, caches), each as ``(key,
        path)``: a sweep in a container (``hydra.launcher.container``) mounts each at the same path inside,
        beside the sweep dir and the code snapshot. Relative paths are from where the sweep is submitted."""
        return []

    def stopped_line(self, what: str) -> str:
        """The line a stopped local sweep ends the command with: ``what`` stopped and what did not start."""
        return what

    def running_checked(self, app_config: Any) -> AbstractContextManager[Any]:
        """Entered around the task function of one trial, with what ``check_trial`` made of its config
        where the sweep was checked (the login node); None for a trial not checked there (a search's
        parameters, chosen as its task starts).

        Hydra's ``run_job`` calls the task function with the config it composed for the job, hydra node and
        all, and nothing else: an app that keeps ``app_config`` for the task function here can run the
        login node's checked config instead of validating that composition again. Without one, nothing
        happens.
        """
        return nullcontext()

    def task_context(self, launcher: Mapping[str, Any]) -> AbstractContextManager[Any]:
        """Entered around the task function in each Slurm array task.

        Without one, submitit's handlers stay: the time-limit signal requeues the task, which
        runs the task function again with the same overrides in the same numbered dir.
        """
        return nullcontext()


F = TypeVar("F", bound=Callable[..., Any])


def trial_hook(hook: TrialHook) -> Callable[[F], F]:
    """Decorator for a Hydra task function (below ``@hydra.main``): hpcsweep's launchers call ``hook``."""

    def attach(task_function: F) -> F:
        setattr(task_function, _HOOK_ATTRIBUTE, hook)
        return task_function

    return attach


def hook_of(task_function: Callable[..., Any] | None) -> TrialHook:
    """The hook ``task_function`` was decorated with, else the generic ``TrialHook()``."""
    hook = getattr(task_function, _HOOK_ATTRIBUTE, None)
    return hook if isinstance(hook, TrialHook) else TrialHook()


def _whole(params: Mapping[str, Any], key: str, default: int | None, least: int) -> int:
    value = params.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"hydra.launcher.{key}={value!r} is not allowed: a whole number >= {least}")
    return value


def launcher_allocation(params: Mapping[str, Any]) -> Allocation:
    """The generic allocation, from the launcher's settings alone; ``ValueError`` naming a bad key.

    ``nodes`` and ``tasks_per_node`` (default 1 each), ``gpus_per_node`` (null: none), and for a
    multi-node job ``placement`` (null: ``switches``) and ``placement_max_wait_min`` (null: 5).
    """
    nodes = _whole(params, "nodes", 1, 1)
    _whole(params, "gpus_per_node", 0, 0)
    mode = params.get("placement") or DEFAULT_PLACEMENT
    if mode not in PLACEMENT_MODES:
        raise ValueError(f"hydra.launcher.placement={mode!r} is not allowed: one of {', '.join(PLACEMENT_MODES)}")
    wait = _whole(params, "placement_max_wait_min", DEFAULT_PLACEMENT_WAIT_MIN, 0)
    return Allocation(
        nodes=nodes,
        tasks_per_node=_whole(params, "tasks_per_node", 1, 1),
        placement=None if nodes == 1 or mode == "off" else Placement(mode, wait),
    )
