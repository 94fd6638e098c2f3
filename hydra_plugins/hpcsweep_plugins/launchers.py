"""The three launcher classes: thin shells over ``hpcsweep.sweep``.

They work for any Hydra app; an app's task function may carry a hook (``hpcsweep.sweep.hooks``)
that checks and sizes its trials, as ``python -m hpcsweep``'s does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher

log = logging.getLogger(__name__)


class SlurmLauncher(BaseSubmititLauncher):
    """Check every trial, then submit the sweep as Slurm job arrays through submitit.

    Instances are pickled into each array task, where the inherited ``__call__`` runs the trial
    inside the hook's ``task_context`` (with no hook: under submitit's requeue on USR2).
    """

    _EXECUTOR = "slurm"

    def __call__(self, overrides: Sequence[str], job_dir_key: str, job_num: int, *args: Any) -> JobReturn:
        from hpcsweep.search.trial_slot import search_slot
        from hpcsweep.sweep.hooks import hook_of

        # A search slot runs with the parameters its study chooses now (the overrides as they are otherwise).
        with hook_of(self.task_function).task_context(self.params), search_slot(self.config, overrides, job_num) as slot:
            result = slot.ran(super().__call__(slot.overrides, job_dir_key, job_num, *args))
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
    """Check every trial, then run them on this machine one after another."""

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
