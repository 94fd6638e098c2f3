"""A sweep's trial is validated once, on the login node: the array task and the local trial process run the
``TrialConfig`` it checked, through Hydra's real ``run_job`` and hpcsweep's real task function.

Hydra's ``run_job`` still gets the job's own composition (its hydra node names the trial dir and sets up the
job's logging); what the trial runs is the login node's object. Each test hands the task a checked config
that differs from what its overrides compose to, so a task that composed and validated again would run the
overrides' value instead.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.singleton import Singleton
from hydra.core.utils import JobStatus, setup_globals
from hydra.types import HydraContext, RunMode

import hpcsweep.app
from hpcsweep.control.outcome import Outcome
from hpcsweep.sweep import prepare
from hpcsweep.sweep.hpcsweep_hook import HpcsweepTrials
from hpcsweep.sweep.local_trial import run_trial_here, start_trial, write_sweep_context
from hpcsweep.sweep.shared_call import TaskTrial
from hpcsweep.sweep.sweep_trials import check_trials
from hpcsweep.trial import runner
from hydra_plugins.hpcsweep_plugins.launchers import SlurmLauncher

SLURM = {"timeout_min": 10, "signal_delay_s": 30, "max_num_timeout": 2, "name": "app", "cpus_per_task": None,
         "gpus_per_node": None, "exclude": None, "additional_parameters": {}}
TASK_FUNCTION = hpcsweep.app.hydra_main.__wrapped__
"""hpcsweep's task function as Hydra's launchers call it (under ``@hydra.main``'s wrapper)."""


class NoCallbacks:
    """Hydra's callbacks as ``run_job`` calls them, with none registered."""

    def on_job_start(self, **kwargs):
        pass

    def on_job_end(self, **kwargs):
        pass


@dataclasses.dataclass
class Sweep:
    """A multirun of hpcsweep's configs into ``sweep_dir``, with every validation and trial run recorded."""

    loader: ConfigLoaderImpl
    master: object
    validated: list
    ran: list

    @property
    def context(self) -> HydraContext:
        return HydraContext(config_loader=self.loader, callbacks=NoCallbacks())


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    # run_job sets up the job's logging on the root logger: leave it as the next test expects it.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    validated, ran = [], []
    real = prepare.trial_config_from_dict
    monkeypatch.setattr(prepare, "trial_config_from_dict", lambda values: validated.append(values) or real(values))

    def record_trial(trial, trial_dir, **settings):
        ran.append((trial, trial_dir))
        return Outcome("completed", "completed", {"status": "completed"})

    monkeypatch.setattr(runner, "run_trial_on_this_node", record_trial)
    setup_globals()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path("pkg://hpcsweep.configs"))
    master = loader.load_configuration("config", [f"hydra.sweep.dir={tmp_path / 'sweep'}"], RunMode.MULTIRUN)
    yield Sweep(loader, master, validated, ran)
    root.handlers[:] = handlers
    root.setLevel(level)


def checked_trials(sweep: Sweep, overrides: list[list[str]]):
    """The login node's part: every trial composed and checked (``check_trials``), as the launchers do it."""
    from types import SimpleNamespace

    launcher = SimpleNamespace(hydra_context=sweep.context, config=sweep.master, params=dict(SLURM))
    return check_trials(launcher, overrides, 0, HpcsweepTrials())


def with_lr(checked, lr: float):
    trial, resume = checked
    return dataclasses.replace(trial, model=dataclasses.replace(trial.model, lr=lr)), resume


def test_an_array_task_runs_the_trials_the_login_node_checked_without_validating_them_again(sweep, monkeypatch):
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")  # submitit's job id, which Hydra's launcher reads
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "41_0")
    trials = checked_trials(sweep, [["model.lr=0.1"], ["model.lr=0.2"]])
    assert len(sweep.validated) == 2  # once per trial, on the login node
    login_node = [trials[0].app_config, with_lr(trials[1].app_config, 0.7)]

    task = SlurmLauncher(**SLURM)
    task.setup(hydra_context=sweep.context, task_function=TASK_FUNCTION, config=sweep.master)
    returns = task.run_trials([TaskTrial(t.overrides, t.num, checked) for t, checked in zip(trials, login_node)],
                              Singleton.get_state())

    assert [r.status for r in returns.values()] == [JobStatus.COMPLETED, JobStatus.COMPLETED]
    assert len(sweep.validated) == 2  # and never in the task
    (first, first_dir), (second, second_dir) = sweep.ran
    # The login node's very objects (only nproc_per_node=auto is resolved on the node), not the overrides' values.
    assert first.model is login_node[0][0].model and second.model is login_node[1][0].model
    assert (first.model.lr, second.model.lr) == (0.1, 0.7)
    # Hydra's run_job ran each trial in its own dir, as ever.
    assert (first_dir, second_dir) == (trials[0].trial_dir, trials[1].trial_dir)
    assert (first_dir / ".hydra" / "overrides.yaml").exists()


def test_a_task_without_a_checked_config_validates_its_own(sweep, monkeypatch):
    # A search's parameters are chosen as its task starts; the login node never saw them.
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "42_0")
    task = SlurmLauncher(**SLURM)
    task.setup(hydra_context=sweep.context, task_function=TASK_FUNCTION, config=sweep.master)
    task.run_trials([TaskTrial(["model.lr=0.3"], 0)], Singleton.get_state())
    assert len(sweep.validated) == 1 and sweep.ran[0][0].model.lr == 0.3


def test_a_local_trial_process_runs_the_trial_the_sweep_checked(sweep, tmp_path):
    (trial,) = checked_trials(sweep, [["model.lr=0.1"]])
    checked = with_lr(trial.app_config, 0.9)
    context_file = write_sweep_context(tmp_path, sweep.context, sweep.master, TASK_FUNCTION)
    specs = []
    start_trial(lambda spec, env, name: specs.append(spec), context_file, trial.overrides, trial.num, [], {},
                checked=checked)

    outcome = run_trial_here(json.loads(specs[0].read_text()))  # what the forked trial process runs

    assert outcome.job_return.status == JobStatus.COMPLETED
    assert len(sweep.validated) == 1  # in the sweep only
    ((ran, trial_dir),) = sweep.ran
    assert ran.model == checked[0].model and ran.model.lr == 0.9 and trial_dir == trial.trial_dir
