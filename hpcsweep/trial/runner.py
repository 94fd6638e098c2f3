"""Run one trial on this node: admit, launch, settle.

Every node of a trial's allocation runs this once per attempt. The attempt is built once
(``hpcsweep.trial.attempt``: config, trial files, Slurm job, rendezvous, caps, this node's role), then
passes three phases, each returning an ``Outcome`` when the attempt ends there:

- **admit** (``hpcsweep.trial.admit``): the resume guard, a trial that has ended, the budget, the caps;
- **launch** (``hpcsweep.trial.launch``): the trial's environment and attempt file, then this node's
  training processes (in this process, or a torchrun agent), under the stop signals' handlers
  (``hpcsweep.control.stop``) and the budget's watch;
- **settle** (``hpcsweep.trial.settle``): classify the exits, record a stop or a failure, decide on the
  requeue or the retry.

The outcome goes up to the edge (``hpcsweep.control.exit_codes``), which alone turns it into an exit
code and a ``scontrol requeue``. A trial whose steps stop for ``trainer.hang_timeout_min`` fails as a
hang (``hpcsweep.trial.watchdog``).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcsweep.config import TrialConfig
from hpcsweep.control import stop
from hpcsweep.control.outcome import Outcome
from hpcsweep.files.atomic import atomic_write_json
from hpcsweep.files.attempt_file import write_attempt
from hpcsweep.trial import budget_watch, launch, settle
from hpcsweep.trial.admit import admit
from hpcsweep.trial.attempt import Caps, TrialAttempt, build_attempt
from hpcsweep.trial.process_env import environment_overlay
from hpcsweep.trial.records import environment_record, write_trial_config

log = logging.getLogger(__name__)


def run_trial_on_this_node(
    trial: TrialConfig,
    trial_dir: Path,
    env: Mapping[str, str] | None = None,
    *,
    caps: Caps = Caps(),
    force_resume: bool = False,
    search_trial: Path | None = None,
    container: Mapping[str, Any] | None = None,
) -> Outcome:
    """Run this node's share of one trial and return how it ended (its ``metrics.json`` included).

    ``env`` is the environment the attempt starts with (``os.environ``). Raises ``ConfigMismatch``
    before anything runs when the trial dir was trained with another config (unless ``force_resume``);
    every other end is an ``Outcome``.
    """
    attempt = build_attempt(trial, trial_dir, os.environ if env is None else env, caps=caps,
                            force_resume=force_resume, search_trial=search_trial, container=container)
    refused = admit(attempt)
    if refused is not None:
        return refused
    return run_attempt(attempt)


def prepare_files(attempt: TrialAttempt) -> None:
    """The trial's config and this node's attempt file, stop file (none yet) and worker dir (empty)."""
    write_trial_config(attempt.trial, attempt.files)
    write_attempt(attempt.attempt_file, attempt.for_workers())
    attempt.stop_file.unlink(missing_ok=True)
    shutil.rmtree(attempt.worker_dir, ignore_errors=True)
    attempt.worker_dir.mkdir(parents=True)


def run_attempt(attempt: TrialAttempt) -> Outcome:
    """Launch this node's training processes and settle how they ended."""
    prepare_files(attempt)
    rdzv = launch.resolve_head_address(attempt.rdzv)
    environment = launch.trial_environment(attempt)
    if attempt.records_for_the_trial:
        atomic_write_json(attempt.files.environment,
                          environment_record(rdzv, environment.nccl_preset, environment.nccl_vars, attempt.job,
                                             None if attempt.model is None else attempt.model.identity,
                                             attempt.container))
    log.info(
        "trial %s: node %d/%d, %d process(es) per node, rendezvous %s",
        attempt.files.root, rdzv.node_rank, rdzv.nnodes, rdzv.nproc_per_node, rdzv.endpoint,
    )
    # The trainer clears STOP_REQUESTED once it has acted; ``signalled`` keeps the reason and time.
    signalled = stop.StopRequest()

    def on_stop(reason: str) -> None:
        log.warning("trial %s: stop signal (%s): finishing the step, then checkpoint", attempt.files.root, reason)
        signalled.set(reason)
        stop.STOP_REQUESTED.set(reason)
        stop.write_stop_file(attempt.stop_file, reason)

    with environment_overlay(environment.nccl_vars), stop.stop_signals_handled(on_stop), \
            budget_watch.watching(attempt.trial, attempt.files.root, rdzv, on_stop, attempt.env):
        if stop.STOP_REQUESTED.reason:  # signalled during start-up, before these handlers
            on_stop(stop.STOP_REQUESTED.reason)
        try:
            result = launch.run_processes(attempt, rdzv)
        except KeyboardInterrupt:  # a second Ctrl-C while stopping (``stop.stop_signals_handled``)
            return settle.record_abort(attempt)
        finally:
            # A signal after the last step must not stop the next trial of this process.
            stop.STOP_REQUESTED.clear()
    return settle.settle(attempt, result, signalled)
