"""The names of the files a trial directory holds, one place for every stage that writes or reads them."""

from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "config.yaml"
"""The resolved trial config the workers read."""
METRICS_FILE = "metrics.json"
"""The trial's state, rewritten atomically as it runs (``hpcsweep.files.metrics_file``)."""
ENVIRONMENT_FILE = "environment.json"
"""What the trial ran under: code version, rendezvous, NCCL variables, Slurm job, code snapshot."""
TRAIN_LOG = "train.log"
"""Rank 0's log (the other ranks log to ``logs/rankN.log``)."""
TB_DIR = "tb"
"""The trial's TensorBoard folder (its run is a folder below it: ``hpcsweep.files.tb_runs``)."""
CHECKPOINT_DIR = "checkpoints"
"""The trial's checkpoints (``hpcsweep.train.checkpoint.manager``)."""
PROFILE_DIR = "profile"
"""The trial's profiler traces, one folder per window, and the request files (``hpcsweep.control.profile_request``)."""
TRIAL_FILES = (METRICS_FILE, CONFIG_FILE, ENVIRONMENT_FILE)
"""Files a trial dir holds once it has started: without sweep.json, they make it a sweep of one."""


@dataclass(frozen=True)
class TrialFiles:
    """Where each file of one trial dir lies: every stage takes a trial dir's file names from here.

    Per-node files (``stop/nodeN.json``, ``workers/nodeN/``, ``attempt/nodeN.json``) are one per node of
    the trial's allocation; each node's runner writes its own.
    """

    root: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def environment(self) -> Path:
        return self.root / ENVIRONMENT_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINT_DIR

    @property
    def profile(self) -> Path:
        return self.root / PROFILE_DIR

    @property
    def tb(self) -> Path:
        return self.root / TB_DIR

    @property
    def train_log(self) -> Path:
        return self.root / TRAIN_LOG

    def rank_log(self, rank: int) -> Path:
        """The log of worker ``rank``: ``train.log`` for rank 0."""
        return self.train_log if rank == 0 else self.root / "logs" / f"rank{rank}.log"

    @property
    def torchrun_logs(self) -> Path:
        """Where torchrun's agent keeps each worker's stdout and stderr."""
        return self.root / "logs" / "torchrun"

    @property
    def workers_dir(self) -> Path:
        """Every node's worker dir, and the failure settlement's claim and decision files."""
        return self.root / "workers"

    def config_aside(self, stamp: str) -> Path:
        """Where ``resume.force`` keeps the config a trial was trained with before (``stamp``: when)."""
        return self.root / f"config.before-{stamp}.yaml"

    def stop_file(self, node_rank: int) -> Path:
        """The stop file the workers of node ``node_rank`` watch (``hpcsweep.control.stop``)."""
        return self.root / "stop" / f"node{node_rank}.json"

    def worker_dir(self, node_rank: int) -> Path:
        """Where the workers of node ``node_rank`` leave progress, stacks and tracebacks."""
        return self.workers_dir / f"node{node_rank}"

    def attempt_file(self, node_rank: int) -> Path:
        """What node ``node_rank``'s workers read from their runner (``hpcsweep.files.attempt_file``)."""
        return self.root / "attempt" / f"node{node_rank}.json"
