"""Launcher and sweeper configs, stored in Hydra's ConfigStore under ``hydra/launcher`` and ``hydra/sweeper``."""

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

from hpcsweep.container.settings import ContainerSettings

_PLUGIN = "hydra_plugins.hpcsweep_plugins.launchers"


@dataclass
class SlurmLauncherConf(SlurmQueueConf):
    """Slurm allocation of every trial: hydra-submitit-launcher's ``SlurmQueueConf`` (one node,
    one task, no GPU; each of its keys documented there), with hpcsweep's defaults and keys.

    hpcsweep's own app sets a trial's size and placement from its config (``trainer.nodes``,
    ``trainer.nproc_per_node``, ``topology.*``), and its ``hydra/launcher=slurm`` carries the
    A100-node values (``configs/hydra/launcher/slurm.yaml``). What the inherited keys mean here:
    ``gpus_per_node`` null or 0 asks for none (0 also on a CPU partition for hpcsweep's trials,
    whose ``trainer.nproc_per_node``, when a number, otherwise sets it); ``exclude`` names nodes
    never to run on, comma-separated; ``signal_delay_s`` is how long before the limit USR2 comes
    (``--signal=USR2@delay``), time to save a checkpoint; ``additional_parameters`` are any other
    sbatch options, ``{"option-name": value}``, whose values never pass through a shell.
    """

    _target_: str = f"{_PLUGIN}.SlurmLauncher"
    # Wall-time limit of each trial's job, in minutes; a trial needing longer requeues and resumes.
    timeout_min: int = 240
    # Requeues allowed after a time limit or preemption before the trial counts as failed.
    max_num_timeout: int = 20
    # Memory per node, in sbatch syntax ("480G"; checked against the partition's nodes before
    # submitting, unlike submitit's mem_gb); null: the partition's default.
    mem: Optional[str] = None
    # Multi-node jobs: "switches" (fewest leaf switches, --switches), "pin" (free nodes under the
    # fewest switches, --nodelist) or "off"; null: switches. hpcsweep's trials: topology.mode.
    placement: Optional[str] = None
    # How long a job may wait for that placement; null: 5. hpcsweep's trials: topology.max_wait_min.
    placement_max_wait_min: Optional[int] = None
    # Retries of a trial that failed because of where it ran (a node failure, an NCCL or gloo
    # error, a worker killed by a signal or the OOM killer, a hang), each excluding the failed node.
    max_retries: int = 2
    # Split sweeps into arrays of at most this many tasks (null: the cluster's MaxArraySize).
    max_array_size: Optional[int] = None
    # Trials one array task runs one after another in one process (imports and queue slot paid
    # once); each keeps its own trial dir and resumes exactly. timeout_min is the whole task's.
    trials_per_task: int = 1
    # Copy the code trials import (hpcsweep, these plugins, the working tree) to SWEEP_DIR/.code
    # before submitting, and make every task, requeues included, import that copy; false: tasks
    # import whatever the installed code is when they start.
    code_snapshot: bool = True
    # false: return once sweep.json is written and the arrays are queued; true: wait for results.
    wait: bool = False
    # Trials at once when the auto launcher runs them locally (no Slurm reachable; see
    # LocalLauncherConf). Here so that auto.yaml can start from slurm.yaml; on Slurm,
    # array_parallelism sets how many trials run at once.
    local_parallelism: Optional[int] = None
    # How the auto launcher's local fallback starts each trial: "forkserver" (forked from a process
    # that imported torch and transformers once) or "spawn" (a fresh interpreter each, ~3.5 s of imports).
    start_method: str = "forkserver"
    # GPU-hours the whole sweep may spend, every run of every trial (node-hours on a partition
    # without GPUs); once spent, running trials stop with a checkpoint and no other starts. null: none.
    budget_gpu_hours: Optional[float] = None
    # Refuse, before submitting, a trial whose memory plan (weights, gradients, optimizer states,
    # activations, overhead per GPU; docs/user/memory-plan.md) exceeds its GPUs' memory; false: no check.
    check_memory: bool = True
    # The memory of one GPU in GB, for sites whose GRES names carry no size (gpu:8, gpu:tesla);
    # null: from the GRES type (a100 80, a100_40g 40, h100 80, h200 141, ...; hpcsweep.memory_plan.gpu_memory).
    gpu_mem_gb: Optional[float] = None
    # The container every task runs in, the token preparation job's too: runtime (none, pyxis, apptainer, oci),
    # image, mounts, workdir, env, python; each key documented in hpcsweep.container.settings.ContainerSettings
    # and docs/user/containers.md. Checked before submitting (the image and mount sources must be readable here).
    container: ContainerSettings = field(default_factory=ContainerSettings)


@dataclass
class LocalLauncherConf:
    """Run the trials on this machine, several at a time, each in a process of its own.

    Not a ``LocalQueueConf``: every key of that (time limit, CPUs, GPUs, memory, nodes) sizes a
    submitit job, and a local trial is no job; its size comes from ``local_parallelism`` and the
    machine.
    """

    _target_: str = f"{_PLUGIN}.LocalLauncher"
    # Trials at once; null: one per GPU (each pinned with CUDA_VISIBLE_DEVICES; a trial asking
    # for k GPUs takes k), 1 without GPUs. The CPUs are shared out among the running trials.
    local_parallelism: Optional[int] = None
    # How each trial's process starts: "forkserver" (forked from a process that imported torch and
    # transformers once, ~1 s to the first step) or "spawn" (a fresh interpreter each, ~3.5 s of imports).
    start_method: str = "forkserver"
    # GPU-hours the sweep may spend (node-hours without GPUs), from the trials' wall time. null: none.
    budget_gpu_hours: Optional[float] = None


@dataclass
class AutoLauncherConf(SlurmLauncherConf):
    """Slurm when ``sbatch`` is on PATH and ``scontrol ping`` finds a controller, else local."""

    _target_: str = f"{_PLUGIN}.AutoLauncher"


@dataclass
class GridSweeperConf:
    """Hydra's basic sweeper, which hpcsweep's launchers spare a second composition of every trial."""

    _target_: str = "hydra_plugins.hpcsweep_plugins.sweeper.GridSweeper"
    # Trials handed to the launcher at once (null: all of them, so one sweep is one array).
    max_batch_size: Optional[int] = None
    params: Optional[dict[str, str]] = None


@dataclass
class SearchSweeperConf:
    """Adaptive search with Optuna (``hydra/sweeper=search``): one array of ``n_trials`` slots, no driver.

    The space is written in Hydra's sweep syntax on the command line (or in ``params``):
    ``choice(...)``, ``range(...)``, ``interval(...)``, ``tag(log, ...)``, ``tag(int, interval(...))``.
    The study is an Optuna journal in ``SWEEP_DIR/search/study.journal`` (study name ``search``).
    """

    _target_: str = "hydra_plugins.hpcsweep_plugins.search_sweeper.SearchSweeper"
    # Trials in the search: the array's size.
    n_trials: int = 16
    # tpe (Bayesian, the default), random, cmaes (needs the package cmaes), qmc (needs scipy).
    sampler: str = "tpe"
    # none, median, sha (successive halving) or hyperband: stops bad trials at an evaluation.
    pruner: str = "none"
    # The metrics.json key the study optimises (reported at each evaluation for pruning); dotted for a
    # nested one: tasks.NAME.METRIC, a task score (reported each time the tasks run).
    objective: str = "best_val_loss"
    # minimize or maximize the objective.
    direction: str = "minimize"
    # Seed of the sampler (task N's is derived from seed and N); null: not reproducible.
    seed: Optional[int] = None
    # tpe and cmaes: trials sampled at random before the model; median: trials before it prunes.
    n_startup_trials: int = 5
    # median: steps of a trial before it may be pruned.
    n_warmup_steps: int = 0
    # sha and hyperband: the first rung, in steps (null: sha estimates it, hyperband uses 1).
    min_resource: Optional[int] = None
    # hyperband: the last rung, in steps (null: the steps of the first completed trial).
    max_resource: Optional[int] = None
    # sha and hyperband: 1/reduction_factor of the trials go on at each rung.
    reduction_factor: int = 3
    # How often a running trial records its heartbeat in the study.
    heartbeat_interval_s: int = 30
    # A RUNNING trial without a heartbeat for this long (killed, node lost) is failed by the next
    # trial that starts; longer than a requeued trial waits in the queue, or it resumes as a new study trial.
    grace_period_s: int = 300
    # Earlier sweep dirs (grid or search), [DIR, ...]: their finished trials that lie in this space,
    # with the same fixed settings and objective, seed the study before its first new trial.
    warm_start: Optional[Any] = None
    # More of the space, as {key: sweep}, besides the command line's.
    params: Optional[dict[str, str]] = None


LAUNCHER_CONFS: dict[str, type] = {
    "hpcsweep_slurm": SlurmLauncherConf,
    "hpcsweep_local": LocalLauncherConf,
    "hpcsweep_auto": AutoLauncherConf,
}
"""hpcsweep's launcher options by name; ``configs/hydra/launcher/{slurm,local,auto}.yaml`` each
extend the one of its name."""


def _keys(conf: type) -> list[str]:
    """A config's keys, and ``KEY.SUB`` for each key of a nested config (``container.runtime``)."""
    names = []
    for f in fields(conf):
        names.append(f.name)
        if isinstance(f.type, type) and is_dataclass(f.type):
            names += [f"{f.name}.{sub}" for sub in _keys(f.type)]
    return sorted(names)


def launcher_keys() -> dict[str, list[str]]:
    """The keys of each of hpcsweep's ``hydra/launcher`` options, the app's YAML options included; a nested
    config's as ``KEY.SUB``."""
    keys = {name: _keys(conf) for name, conf in LAUNCHER_CONFS.items()}
    return {**keys, **{name.removeprefix("hpcsweep_"): names for name, names in keys.items()}}


_store = ConfigStore.instance()
_store.store(group="hydra/launcher", name="hpcsweep_slurm", node=SlurmLauncherConf, provider="hpcsweep")
_store.store(group="hydra/launcher", name="hpcsweep_local", node=LocalLauncherConf, provider="hpcsweep")
_store.store(group="hydra/launcher", name="hpcsweep_auto", node=AutoLauncherConf, provider="hpcsweep")
_store.store(group="hydra/sweeper", name="hpcsweep_grid", node=GridSweeperConf, provider="hpcsweep")
_store.store(group="hydra/sweeper", name="search", node=SearchSweeperConf, provider="hpcsweep")
