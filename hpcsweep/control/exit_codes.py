"""The one place where a trial's ``Outcome`` becomes an exit code and its Slurm side: the ``scontrol requeue``
after a stop, and a retry's requeue off the failed node (``scontrol requeue``, then ``scontrol update
ExcNodeList``, which Slurm 22.05 accepts only once the job is pending again).

Every process that runs a trial ends through here: the command (``python -m hpcsweep``, a single run or a
local sweep), each Slurm array task (``SlurmLauncher.run_trials``, inside submitit), and a local sweep's
trial process (``hpcsweep.sweep.local_trial``). Each code has one meaning:

====  ============================================================================================
code  meaning
====  ============================================================================================
0     done: the trial completed, was pruned, or is not trained in this attempt (it had ended, or the
      budget is spent); or a node whose share of a stop or a retry is done while another node of the
      trial records it and requeues the job
1     the trial failed, and nothing retries it
2     refused before anything ran: a bad key or value (``hpcsweep.sweep``'s refusals)
3     requeue: stopped with a checkpoint, and its Slurm job runs again (requeued here, or by Slurm
      after a preemption); the process leaves without a result, so submitit records none
4     retry: an infrastructure failure, and the job is requeued off the failed node
5     stopped with a checkpoint, and nothing restarts it: run the same trial dir (or sweep) again to
      resume. A training worker exits 5 after its checkpointed stop; its runner decides what follows
130   interrupted by Ctrl-C (the shell's 128 + SIGINT): stopped with a checkpoint, or, after a second
      Ctrl-C, without the checkpoint of that step
====  ============================================================================================

A node other than node 0 leaves a stop with 0, and a node other than the one that settled a failure leaves
its retry with 0: a non-zero exit would make srun's ``--kill-on-bad-exit`` end the node that requeues the job
before it has done so.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from hpcsweep.control.outcome import Outcome
from hpcsweep.control.stop import INTERRUPTED, stop_signals_blocked

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2
EXIT_REQUEUE = 3
EXIT_RETRY = 4
EXIT_STOPPED = 5
EXIT_INTERRUPTED = 128 + signal.SIGINT

_CODES = {
    "completed": EXIT_OK,
    "skipped": EXIT_OK,
    "pruned": EXIT_OK,
    "node_done": EXIT_OK,
    "failed": EXIT_FAILED,
    "requeue": EXIT_REQUEUE,
    "retry": EXIT_RETRY,
    "aborted": EXIT_INTERRUPTED,
}


def exit_code(outcome: Outcome) -> int:
    """The exit code of a process whose trial ended as ``outcome`` (the table above)."""
    if outcome.kind == "stopped":
        return EXIT_INTERRUPTED if outcome.reason == INTERRUPTED else EXIT_STOPPED
    return _CODES[outcome.kind]


def requeue_job(job_label: str) -> None:
    """``scontrol requeue`` the job (``ARRAYID_TASK`` for an array task); log, not raise, a refusal.

    Slurm refuses a job that is already pending or completing: then it is being requeued already.
    """
    from hpcsweep.slurm import commands

    try:
        commands.requeue(job_label)
        log.info("requeued job %s", job_label)
    except commands.SlurmCommandError as err:
        log.warning("requeue of job %s refused (already requeued?): %s", job_label, err)


def requeue_excluding(job_label: str, nodes: Sequence[str]) -> None:
    """Requeue the job and keep it off ``nodes`` as well as the nodes it already excludes.

    Stop signals stay blocked meanwhile, so that the requeue's own SIGTERM to this job cannot cut the
    ``scontrol`` calls short (children inherit the mask).
    """
    from hpcsweep.slurm import commands
    from hpcsweep.slurm.cluster_info import excluded_after

    with stop_signals_blocked():
        try:
            exclude = excluded_after(commands.show_job(job_label), nodes)
        except commands.SlurmCommandError as err:
            log.warning("cannot read job %s's excluded nodes, excluding %s alone: %s", job_label, ",".join(nodes), err)
            exclude = sorted(nodes)
        try:
            commands.requeue(job_label)
        except commands.SlurmCommandError as err:
            log.error("the retry of job %s was refused: %s", job_label, err)
            return
        try:
            commands.exclude_nodes(job_label, exclude)
        except commands.SlurmCommandError as err:
            log.error("the retry of job %s may run on %s again: %s", job_label, ",".join(nodes), err)
            return
    log.info("requeued job %s, excluding %s", job_label, ",".join(exclude))


def carry_out(outcome: Outcome) -> int:
    """Do what ``outcome`` still asks of Slurm (its requeue, off its excluded nodes), and return the exit code."""
    if outcome.requeue_job is not None and outcome.exclude_nodes:
        requeue_excluding(outcome.requeue_job, outcome.exclude_nodes)
    elif outcome.requeue_job is not None:
        requeue_job(outcome.requeue_job)
    return exit_code(outcome)


def leave(outcome: Outcome, line: str | None = None) -> NoReturn:
    """End this process as ``outcome`` says: its Slurm side (``carry_out``), ``line`` on stderr (if any), then the
    exit code.

    A plain ``SystemExit``: Hydra's ``run_job`` and submitit's ``process_job`` catch ``Exception`` only, so no
    result is recorded for a trial that runs again.
    """
    leave_with(carry_out(outcome), line)


def leave_with(code: int, line: str | None = None) -> NoReturn:
    """End this process with ``code`` (one of the table's), after ``line`` on stderr (if any)."""
    if line:
        print(line, file=sys.stderr)
    raise SystemExit(code)
