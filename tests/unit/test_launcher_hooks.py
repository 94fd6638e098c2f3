"""The launchers' hook: generic sizes from the launcher, an app's checks and sizes through its hook."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import cloudpickle
import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.utils import JobStatus, setup_globals
from hydra.types import RunMode
from submitit.core.utils import FailedJobError, UncompletedJobError

import hpcsweep.app
from hpcsweep.sweep.allocation import allocation_request, executor_parameters
from hpcsweep.sweep.hooks import (
    Allocation,
    CheckedTrial,
    Placement,
    TrialHook,
    hook_of,
    launcher_allocation,
    trial_hook,
)
from hpcsweep.sweep.hpcsweep_hook import HpcsweepTrials
from hpcsweep.sweep.slurm_submit import await_results, launch_on_slurm
from hpcsweep.sweep.sweep_trials import SweepConfigError, check_trials
from hpcsweep.trial.attempt import Caps

from .fake_slurm import fake_slurm  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[2]
FOREIGN_CONF = REPO / "tests" / "foreign_app" / "foreign_app" / "conf"
SLURM = {"timeout_min": 10, "signal_delay_s": 30, "max_num_timeout": 2, "name": "app", "cpus_per_task": None,
         "gpus_per_node": None, "exclude": None, "additional_parameters": {}}


def launcher(search_path: str, overrides=(), **params):
    """What ``check_trials`` reads of a launcher, for a multirun of the app at ``search_path``."""
    setup_globals()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(search_path))
    master = loader.load_configuration("config", ["hydra.sweep.dir=/sweeps/s", *overrides], RunMode.MULTIRUN)
    return SimpleNamespace(hydra_context=SimpleNamespace(config_loader=loader), config=master, params=params)


def foreign_launcher(**params):
    return launcher(f"file://{FOREIGN_CONF}", **params)


def test_without_a_hook_every_trial_gets_the_launchers_size():
    assert launcher_allocation({}) == Allocation()
    assert launcher_allocation({"nodes": 2, "tasks_per_node": 4, "gpus_per_node": 1}) == Allocation(
        nodes=2, tasks_per_node=4, placement=Placement("switches", 5)
    )
    assert launcher_allocation({"nodes": 3, "placement": "pin", "placement_max_wait_min": 0}).placement == Placement(
        "pin", 0
    )
    assert launcher_allocation({"nodes": 3, "placement": "off"}).placement is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"nodes": 0}, "hydra.launcher.nodes=0 is not allowed: a whole number >= 1"),
        ({"tasks_per_node": "2"}, "hydra.launcher.tasks_per_node='2' is not allowed"),
        ({"gpus_per_node": -1}, "hydra.launcher.gpus_per_node=-1 is not allowed: a whole number >= 0"),
        ({"placement": "near"}, "hydra.launcher.placement='near' is not allowed: one of switches, pin, off"),
    ],
)
def test_bad_launcher_sizes_are_refused_naming_the_key(params, message):
    with pytest.raises(ValueError, match=message):
        launcher_allocation(params)


def test_a_generic_allocation_becomes_submitits_parameters():
    allocation = launcher_allocation({**SLURM, "nodes": 2, "tasks_per_node": 4, "placement": "off"})
    params = executor_parameters(allocation, {**SLURM, "nodes": 2, "tasks_per_node": 4, "placement": "off"})
    assert (params["nodes"], params["tasks_per_node"]) == (2, 4)
    assert "gpus_per_node" not in params and "slurm_placement" not in params and "cpus_per_task" not in params
    with_gpus = {**SLURM, "gpus_per_node": 2}
    assert executor_parameters(launcher_allocation(with_gpus), with_gpus)["gpus_per_node"] == 2
    request = allocation_request(launcher_allocation({"nodes": 2}), {**SLURM, "nodes": 2, "gpus_per_node": 2})
    assert (str(request.nodes), str(request.gpus_per_node)) == ("hydra.launcher.nodes=2", "hydra.launcher.gpus_per_node=2")


def test_the_hook_travels_with_the_task_function():
    hook = TrialHook()

    @trial_hook(hook)
    def task(cfg):
        return cfg

    assert hook_of(task) is hook
    assert type(hook_of(cloudpickle.loads(cloudpickle.dumps(task)))) is TrialHook
    assert type(hook_of(lambda cfg: cfg)) is TrialHook
    assert hook_of(None).check_trial({}, {}) == CheckedTrial(Allocation())
    # hydra.main's wrapper keeps the attribute, and the inner function is the one Hydra calls.
    assert isinstance(hook_of(hpcsweep.app.hydra_main), HpcsweepTrials)
    assert isinstance(hook_of(hpcsweep.app.hydra_main.__wrapped__), HpcsweepTrials)


def test_a_foreign_sweep_is_composed_and_numbered_as_hydra_numbers_it():
    trials = check_trials(foreign_launcher(**SLURM, nodes=2), [["db=mysql"], ["db=postgres", "server=nginx"]], 3,
                          TrialHook())
    assert [(t.num, t.overrides, t.trial_dir) for t in trials] == [
        (3, ["db=mysql"], Path("/sweeps/s/3")),
        (4, ["db=postgres", "server=nginx"], Path("/sweeps/s/4")),
    ]
    assert {t.allocation for t in trials} == {Allocation(nodes=2, placement=Placement())}


class Recording(TrialHook):
    """Refuses postgres; keeps the driver as the app config; records what check_sweep saw."""

    def __init__(self):
        self.swept = None

    def check_trial(self, config, launcher):
        if config.db.driver == "postgresql":
            raise ValueError("db.driver='postgresql' is not allowed: mysql")
        return CheckedTrial(Allocation(nodes=config.server.port // 40), config.db.driver)

    def check_sweep(self, trials):
        self.swept = [(t.num, t.allocation.nodes, t.app_config) for t in trials]


def test_the_hook_checks_each_trial_then_the_sweep():
    hook = Recording()
    check_trials(foreign_launcher(), [["db=mysql"], ["db=mysql", "server=nginx"]], 0, hook)
    assert hook.swept == [(0, 2, "mysql"), (1, 202, "mysql")]
    with pytest.raises(SweepConfigError, match=r"^trial #1 \(db=postgres\): db.driver='postgresql' is not allowed"):
        check_trials(foreign_launcher(), [["db=mysql"], ["db=postgres"]], 0, Recording())


def test_hpcsweeps_hook_sizes_its_trials_and_refuses_a_second_size():
    hpcsweep_launcher = launcher("pkg://hpcsweep.configs", **SLURM)
    (one, two) = check_trials(hpcsweep_launcher, [["model.lr=0.1"], ["trainer.nodes=2", "trainer.nproc_per_node=4"]],
                              0, HpcsweepTrials())
    assert one.allocation == Allocation(nodes_key="trainer.nodes", gpus_key="trainer.nproc_per_node")
    assert (two.allocation.nodes, two.allocation.gpus_per_node, two.allocation.placement) == (2, 4, Placement())
    hpcsweep_launcher.params["nodes"] = 2
    with pytest.raises(SweepConfigError, match="hydra.launcher.nodes=2 is not allowed: hpcsweep's trials set it with "
                                               "trainer.nodes"):
        check_trials(hpcsweep_launcher, [["model.lr=0.1"]], 0, HpcsweepTrials())


def test_a_refused_trial_stops_the_slurm_sweep_before_any_slurm_command(fake_slurm):
    app = foreign_launcher(**SLURM)
    app.task_function = trial_hook(Recording())(lambda cfg: cfg)
    with pytest.raises(SystemExit) as stopped:
        launch_on_slurm(app, [["db=mysql"], ["db=postgres"]], 0)
    assert stopped.value.code == 2
    assert fake_slurm.calls("scontrol") == [] and fake_slurm.calls("sacct") == []


def test_the_requeue_cap_and_the_signal_delay_come_from_the_launcher_not_the_environment():
    launcher = {"max_num_timeout": 3, "signal_delay_s": 90}
    before = dict(os.environ)
    with TrialHook().task_context(launcher):
        assert dict(os.environ) == before
    with HpcsweepTrials().task_context(launcher):
        assert dict(os.environ) == before
    caps = Caps.from_launcher(launcher)
    assert (caps.max_requeues, caps.signal_delay_s, caps.max_retries) == (3, 90, 2)


class FinishedJob:
    def __init__(self, result):
        self.result = result

    def results(self):
        if isinstance(self.result, Exception):
            raise self.result
        return [self.result]


def test_waiting_returns_every_trials_job_return_and_failed_ones_as_failed():
    trials = check_trials(foreign_launcher(), [["db=mysql"], ["db=postgres"], ["db=mysql", "server=nginx"]], 0,
                          TrialHook())
    done = SimpleNamespace(status=JobStatus.COMPLETED)
    failed, cancelled = FailedJobError("boom"), UncompletedJobError("cancelled")
    returns = await_results({0: FinishedJob(failed), 1: FinishedJob({1: done}), 2: FinishedJob(cancelled)}, trials)
    assert returns[1] is done
    assert [(r.status, r.overrides, r.working_dir, r._return_value) for r in (returns[0], returns[2])] == [
        (JobStatus.FAILED, ["db=mysql"], "/sweeps/s/0", failed),
        (JobStatus.FAILED, ["db=mysql", "server=nginx"], "/sweeps/s/2", cancelled),
    ]


def test_waiting_returns_each_packed_trials_own_job_return():
    trials = check_trials(foreign_launcher(), [["db=mysql"], ["db=postgres"], ["db=mysql", "server=nginx"]], 0,
                          TrialHook())
    first, second = SimpleNamespace(status=JobStatus.COMPLETED), SimpleNamespace(status=JobStatus.COMPLETED)
    task = FinishedJob({0: first, 1: second})
    failed = FailedJobError("boom")
    returns = await_results({0: task, 1: task, 2: FinishedJob(failed)}, trials)
    assert returns[0] is first and returns[1] is second
    assert (returns[2].status, returns[2]._return_value) == (JobStatus.FAILED, failed)


def test_every_launcher_key_reaches_submitit_as_one_of_its_parameters_or_not_at_all():
    """A key of hpcsweep's own (``start_method``, ``trials_per_task``, ...) passed on to submitit
    fails every Slurm submit with ``NameError: Unknown argument``; a submitit key left out is lost."""
    import dataclasses

    from submitit.auto.auto import AutoExecutor
    from submitit.slurm.slurm import SlurmExecutor

    from hydra_plugins.hpcsweep_plugins.config import AutoLauncherConf, SlurmLauncherConf

    generic = set(AutoExecutor._typed_parameters())
    for conf in (SlurmLauncherConf, AutoLauncherConf):
        params = {field.name: "x" for field in dataclasses.fields(conf)}
        params.update(additional_parameters={}, exclude=None, nodes=1, tasks_per_node=1, gpus_per_node=1)
        out = executor_parameters(Allocation(), params)
        unknown = {key for key in out if key not in generic and key.removeprefix("slurm_")
                   not in SlurmExecutor._valid_parameters()}
        assert unknown == set(), f"{conf.__name__}: submitit refuses {sorted(unknown)}"
