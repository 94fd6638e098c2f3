"""Launcher and sweeper configs, stored in Hydra's ConfigStore under ``hydra/launcher`` and ``hydra/sweeper``."""

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

_PLUGIN = "hydra_plugins.hpcsweep_plugins.launchers"


@dataclass
class SlurmLauncherConf:
    """Slurm allocation of every trial, with generic defaults: one node, one task, no GPU.

    hpcsweep's own app sets a trial's size and placement from its config (``trainer.nodes``,
    ``trainer.nproc_per_node``, ``topology.*``), and its ``hydra/launcher=slurm`` carries the
    A100-node values (``configs/hydra/launcher/slurm.yaml``).
    """

    _target_: str = f"{_PLUGIN}.SlurmLauncher"
    # Where submitit keeps its pickles and the Slurm logs of every task.
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    # Job name shown by squeue and sacct.
    name: str = "${hydra.job.name}"
    # Wall-time limit of each trial's job, in minutes; a trial needing longer requeues and resumes.
    timeout_min: int = 240
    # Nodes of each trial's job (hpcsweep's trials: trainer.nodes, this stays 1).
    nodes: int = 1
    # Tasks per node; each runs the task function (hpcsweep's trials: one, this stays 1).
    tasks_per_node: int = 1
    # CPUs per task; null: the partition's default.
    cpus_per_task: Optional[int] = None
    # GPUs per node; null or 0: none (0 also on a CPU partition for hpcsweep's trials, whose
    # trainer.nproc_per_node, when a number, otherwise sets it).
    gpus_per_node: Optional[int] = None
    # Memory per node, in sbatch syntax ("480G"); null: the partition's default.
    mem: Optional[str] = None
    partition: Optional[str] = None
    qos: Optional[str] = None
    account: Optional[str] = None
    constraint: Optional[str] = None
    # Comma-separated nodes never to run on.
    exclude: Optional[str] = None
    # Multi-node jobs: "switches" (fewest leaf switches, --switches), "pin" (free nodes under the
    # fewest switches, --nodelist) or "off"; null: switches. hpcsweep's trials: topology.mode.
    placement: Optional[str] = None
    # How long a job may wait for that placement; null: 5. hpcsweep's trials: topology.max_wait_min.
    placement_max_wait_min: Optional[int] = None
    comment: Optional[str] = None
    # The time-limit warning signal comes this long before the limit (--signal=USR2@delay).
    signal_delay_s: int = 120
    # Requeues allowed after a time limit or preemption before the trial counts as failed.
    max_num_timeout: int = 20
    # Retries of a trial that failed because of where it ran (a node failure, an NCCL or gloo
    # error, a worker killed by a signal or the OOM killer, a hang), each excluding the failed node.
    max_retries: int = 2
    # At most this many trials of one array run at once (--array=...%K).
    array_parallelism: int = 256
    # Split sweeps into arrays of at most this many tasks (null: the cluster's MaxArraySize).
    max_array_size: Optional[int] = None
    # Trials one array task runs one after another in one process (imports and queue slot paid
    # once); each keeps its own trial dir and resumes exactly. timeout_min is the whole task's.
    trials_per_task: int = 1
    # Any other sbatch option, as {"option-name": value}; values never pass through a shell.
    additional_parameters: dict[str, Any] = field(default_factory=dict)
    # Shell lines run in the batch script before srun (module loads, venv activation).
    setup: Optional[list[str]] = None
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
    # GPU-hours the whole sweep may spend, every run of every trial (node-hours on a partition
    # without GPUs); once spent, running trials stop with a checkpoint and no other starts. null: none.
    budget_gpu_hours: Optional[float] = None


@dataclass
class LocalLauncherConf:
    """Run the trials on this machine, several at a time, each in a process of its own."""

    _target_: str = f"{_PLUGIN}.LocalLauncher"
    # Trials at once; null: one per GPU (each pinned with CUDA_VISIBLE_DEVICES; a trial asking
    # for k GPUs takes k), 1 without GPUs. The CPUs are shared out among the running trials.
    local_parallelism: Optional[int] = None
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
    # The metrics.json key the study optimises (reported at each evaluation for pruning).
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
    # More of the space, as {key: sweep}, besides the command line's.
    params: Optional[dict[str, str]] = None


_store = ConfigStore.instance()
_store.store(group="hydra/launcher", name="hpcsweep_slurm", node=SlurmLauncherConf, provider="hpcsweep")
_store.store(group="hydra/launcher", name="hpcsweep_local", node=LocalLauncherConf, provider="hpcsweep")
_store.store(group="hydra/launcher", name="hpcsweep_auto", node=AutoLauncherConf, provider="hpcsweep")
_store.store(group="hydra/sweeper", name="hpcsweep_grid", node=GridSweeperConf, provider="hpcsweep")
_store.store(group="hydra/sweeper", name="search", node=SearchSweeperConf, provider="hpcsweep")
