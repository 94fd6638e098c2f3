"""The three launcher classes: thin shells over ``hpcsweep.sweep``."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher

log = logging.getLogger(__name__)


class SlurmLauncher(BaseSubmititLauncher):
    """Validate every trial, then submit the sweep as Slurm job arrays through submitit.

    Instances are pickled into each array task, where the inherited ``__call__`` runs the trial.
    """

    _EXECUTOR = "slurm"

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        from hpcsweep.train.checkpoint_schedule import SIGNAL_DELAY_VAR
        from hpcsweep.train.stop import STOP_REQUESTED, stop_signals_handled
        from hpcsweep.trial.preempt import MAX_REQUEUES_VAR

        # The trial's runner enforces the requeue cap and handles the stop signals; submitit's
        # handlers (USR2: requeue and sys.exit at once) are replaced from here on, so a signal
        # during start-up is kept for the runner instead.
        os.environ[MAX_REQUEUES_VAR] = str(self.params["max_num_timeout"])
        os.environ[SIGNAL_DELAY_VAR] = str(self.params["signal_delay_s"])
        with stop_signals_handled(STOP_REQUESTED.set):
            result = super().__call__(*args, **kwargs)
        # Hydra's run_job catches the trial's exception; raise it, so that the array task exits
        # non-zero and Slurm accounting says FAILED instead of COMPLETED.
        if result.status == JobStatus.FAILED:
            raise result._return_value
        return result

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hpcsweep.sweep.slurm_submit import launch_on_slurm

        assert self.config is not None and self.hydra_context is not None
        return launch_on_slurm(self, job_overrides, initial_job_idx)


class LocalLauncher(BaseSubmititLauncher):
    """Validate every trial, then run them on this machine one after another."""

    _EXECUTOR = "local"

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hpcsweep.sweep.local_run import launch_locally

        assert self.config is not None and self.hydra_context is not None
        return launch_locally(self, job_overrides, initial_job_idx)


class AutoLauncher(SlurmLauncher):
    """Slurm when ``sbatch`` is on PATH and ``scontrol ping`` finds a controller, else local."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hpcsweep.slurm.commands import controller_reachable

        use_slurm, reason = controller_reachable()
        log.info("launcher: %s (%s)", "slurm" if use_slurm else "local", reason)
        if use_slurm:
            return super().launch(job_overrides, initial_job_idx)
        local = LocalLauncher()
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        local.setup(hydra_context=self.hydra_context, task_function=self.task_function, config=self.config)
        return local.launch(job_overrides, initial_job_idx)
