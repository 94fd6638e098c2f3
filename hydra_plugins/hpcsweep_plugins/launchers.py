"""The three launcher classes: thin shells over ``hpcsweep.sweep``.

They work for any Hydra app; an app's task function may carry a hook (``hpcsweep.sweep.hooks``)
that checks and sizes its trials, as ``python -m hpcsweep``'s does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher

if TYPE_CHECKING:
    from hpcsweep.sweep.shared_call import TaskTrials

log = logging.getLogger(__name__)


class SlurmLauncher(BaseSubmititLauncher):
    """Check every trial, then submit the sweep as Slurm job arrays through submitit.

    Instances are pickled once per sweep; each array task runs its trials (one, or
    ``trials_per_task``) through ``run_trials``, inside the hook's ``task_context`` (with no hook:
    under submitit's requeue on USR2).
    """

    _EXECUTOR = "slurm"

    def __call__(
        self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str, singleton_state: Any,
        checked: Any = None,
    ) -> JobReturn:
        """One trial in this array task: Hydra's composition and ``run_job`` for job ``job_num``.

        Hydra's ``run_job`` needs the job's own composed config (its hydra node: the trial dir, the job's
        logging, ``.hydra/``); the app's task function runs ``checked``, what the hook made of the trial's
        config on the login node (``TrialHook.running_checked``), instead of checking that composition
        again. A search's slot runs with the parameters its study chooses now, which the login node never
        saw (the overrides as they are otherwise). A trial's failure is its JobReturn's (FAILED);
        ``run_trials`` raises it once the task's other trials have run.
        """
        from hpcsweep.control.outcome import leaving_outcome
        from hpcsweep.search.trial_slot import search_slot
        from hpcsweep.sweep.hooks import hook_of

        with search_slot(self.config, sweep_overrides, job_num) as slot:
            with hook_of(self.task_function).running_checked(slot.checked_here(checked)):
                result = super().__call__(slot.overrides, job_dir_key, job_num, job_id, singleton_state)
            # A trial that leaves to be requeued has not ended: its study trial stays RUNNING.
            return result if leaving_outcome(result) is not None else slot.ran(result)

    def run_trials(self, trials: TaskTrials, singleton_state: Any) -> dict[int, JobReturn]:
        """An array task: its trials one after another in this process; each JobReturn by job number.

        A trial that ended before (a requeued task runs its trials again) is skipped by the app's
        runner; a stop signal checkpoints the trial in flight and requeues the task, which then goes
        on from it. A failed trial does not stop the others; the first failure is raised at the end,
        so that Slurm's accounting says FAILED.

        This is the array task's edge: a trial whose app returns an ``Outcome`` that ends the task
        (a requeue, retry or stop) ends the process here, once, with its exit code and requeue
        (``hpcsweep.control.exit_codes``), before submitit writes a result. It starts in the directory the
        sweep was submitted from, where its container runtime started it elsewhere (``enter_task_workdir``).
        """
        from hpcsweep.control import exit_codes
        from hpcsweep.control.outcome import leaving_outcome
        from hpcsweep.sweep.containers import enter_task_workdir
        from hpcsweep.sweep.hooks import hook_of

        enter_task_workdir(self.params)
        returns: dict[int, JobReturn] = {}
        # One context for the whole task, so a signal between two trials stops the next one.
        with hook_of(self.task_function).task_context(self.params):
            for trial in trials:
                result = self(list(trial.overrides), "hydra.sweep.dir", trial.num, f"job_id_for_{trial.num}",
                              singleton_state, checked=trial.checked)
                leaving = leaving_outcome(result)
                if leaving is not None:
                    log.info("trial #%d: %s", trial.num, leaving.message)
                    exit_codes.leave(leaving)
                returns[trial.num] = result
        failed = [num for num, result in returns.items() if result.status == JobStatus.FAILED]
        if failed:
            if len(returns) > 1:
                log.error("trial(s) %s of this task failed", ", ".join(f"#{num}" for num in failed))
            raise returns[failed[0]]._return_value
        return returns

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hpcsweep.sweep.slurm_submit import launch_on_slurm

        assert self.config is not None and self.hydra_context is not None
        return launch_on_slurm(self, job_overrides, initial_job_idx)


class LocalLauncher(BaseSubmititLauncher):
    """Check every trial, then run them on this machine, ``local_parallelism`` at a time, each in its own process."""

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
        if use_slurm:
            log.info("launcher: slurm (%s)", reason)
            return super().launch(job_overrides, initial_job_idx)
        log.info("%s: running locally", reason)
        # The local launcher's own settings (its budget it reads from the config); Slurm's mean nothing here.
        local = LocalLauncher(**{key: self.params[key] for key in ("local_parallelism", "start_method")
                                 if key in self.params})
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        local.setup(hydra_context=self.hydra_context, task_function=self.task_function, config=self.config)
        return local.launch(job_overrides, initial_job_idx)
