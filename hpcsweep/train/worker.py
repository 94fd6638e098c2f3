"""The worker entry torchrun runs: ``python -m hpcsweep.train TRIAL_DIR ATTEMPT_FILE``.

Wiring only: read and validate ``TRIAL_DIR/config.yaml``, export what CUDA must see before its
first cuBLAS call (``CUBLAS_WORKSPACE_CONFIG`` for a deterministic trial), join the process group,
build the trainer, resume, train, close. A worker given GPUs that CUDA cannot use fails at once,
before anything is built, and metrics.json says why (``hpcsweep.train.gpu_choices``). The same
entry runs as one plain process (world size 1), under ``torchrun --nproc-per-node=K``, and across
nodes.

Stops: as a torchrun worker (``main``), USR2, SIGTERM and SIGINT (a terminal's Ctrl-C reaches
every worker) set ``STOP_REQUESTED`` (see ``hpcsweep.trial.preempt``), and so does this node's stop file, which the runner writes when it is
signalled. ``HPCSWEEP_FAULT`` injects a crash, a hang, a stop request (``stop``: exactly as a stop
signal handler would, so tests exercise the real save-and-requeue path) or a save that never ends,
once per trial dir (``hpcsweep.train.fault``).

For the runner's failure handling and hang watchdog, a worker leaves its progress, its Python
stacks and its traceback in the node's worker dir (``hpcsweep.train.observe.worker_records``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
import typing
from pathlib import Path
from typing import Any

import torch
import yaml

from hpcsweep.config import TrainerConfig, TrialConfig, trial_config_from_dict
from hpcsweep.control import stop
from hpcsweep.files import metrics_file
from hpcsweep.files.attempt_file import read_attempt
from hpcsweep.files.trial_files import TrialFiles
from hpcsweep.model.record import record_from_dict
from hpcsweep.train import fault, gpu_choices, parallel
from hpcsweep.train.checkpoint.manager import trial_already_done
from hpcsweep.train.distributed import (
    GpusNotUsable,
    barrier,
    choose_device,
    destroy_distributed,
    init_distributed,
    node_name,
    ranks_from_env,
)
from hpcsweep.train.observe import worker_records
from hpcsweep.train.trainer import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    STOP_REQUESTED,
    Trainer,
)

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_STOPPED", "STOP_REQUESTED", "main", "run_trial"]
log = logging.getLogger("hpcsweep.train")
# What a resumed run keeps of the last one's metrics.json: how it stopped, every failure so far, and
# the step time of every run (which this run's windows add to).
CARRIED = ("last_stop_reason", "stop_to_exit_s", "failures", "step_time_total")


def setup_logging(trial_dir: Path, rank: int) -> None:
    """Rank 0 logs to ``train.log`` and stderr; rank N to ``logs/rankN.log``."""
    path = TrialFiles(trial_dir).rank_log(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [logging.FileHandler(path)]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stderr))
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{rank} %(name)s: %(message)s", handlers=handlers, force=True
    )


def run_trial(trial_dir: Path, attempt_file: Path | None = None) -> int:
    """Train (or resume) the trial in ``trial_dir``; returns the process exit code.

    ``attempt_file`` is what this node's runner wrote for its workers (``hpcsweep.files.attempt_file``);
    None for a worker started without one.
    """
    trial_dir = Path(trial_dir)
    attempt = read_attempt(attempt_file)
    rank, local_rank, _ = ranks_from_env(os.environ)
    setup_logging(trial_dir, rank)
    records = attempt.worker_dir
    if records is not None:
        worker_records.write_progress(records, rank=rank, local_rank=local_rank, node=node_name(os.environ), step=0)
    cfg = trial_config_from_dict(yaml.safe_load(TrialFiles(trial_dir).config.read_text()))
    previous = metrics_file.read_metrics(TrialFiles(trial_dir).metrics)
    if trial_already_done(trial_dir, previous):
        log.info("trial in %s is already %s: nothing to do", trial_dir, previous["status"])
        return EXIT_OK
    restarts = previous["restarts"] + 1 if previous else 0
    os.environ.update(cuda_env_for(cfg.trainer))
    try:
        world = init_distributed(cfg.trainer.device, cfg.nccl.pg_timeout_s,
                                 group_of_one=parallel.resolve_parallel(cfg.trainer) == "fsdp")
    except GpusNotUsable as err:
        log.error("trial refused: %s", err)
        if rank == 0:
            write_failed(trial_dir, cfg, ranks_from_env(os.environ)[2], restarts, [str(err)])
        return EXIT_FAILED
    trainer = None
    try:
        hooks = [
            *stop.stop_file_hooks(attempt.stop_file, STOP_REQUESTED),
            # The fault before the progress record: a hung rank's last step is one behind the others'.
            *fault.fault_hooks(os.environ, trial_dir, rank),
            *worker_records.progress_hooks(records, rank=rank, local_rank=local_rank, node=node_name(os.environ)),
        ]
        model = None if attempt.model_record is None else record_from_dict(attempt.model_record)
        trainer = Trainer(cfg, world, trial_dir, hooks=hooks, restarts=restarts,
                          signal_delay_s=attempt.signal_delay_s, search_trial=attempt.search_trial,
                          model_record=model)
        trainer.report.update({k: previous[k] for k in CARRIED if previous and k in previous})
        trainer.resume()
        code = trainer.fit()
        trainer.close()
        # torchrun kills the other workers as soon as one exits non-zero (EXIT_STOPPED): leave
        # together, after rank 0 has written the checkpoint, metrics.json and TensorBoard events.
        barrier(world)
        # Everything is saved: from here torchrun's SIGTERM (sent once a first worker has exited)
        # must end this worker, not count as one more stop request that nothing acts on.
        stop.leave_on_terminate()
        return code
    except Exception:
        log.exception("trial failed")
        worker_records.write_error(records, local_rank, traceback.format_exc())
        if world.rank == 0:
            error = traceback.format_exc().splitlines()[-20:]
            if trainer is not None:
                trainer.report.update(status="failed", error=error)  # what the trackers' runs end with
            write_failed(trial_dir, cfg, world.world_size, restarts, error, trainer.report if trainer else None)
        return EXIT_FAILED
    finally:
        if trainer is not None:
            trainer.close()
        destroy_distributed(world)


def write_failed(
    trial_dir: Path, cfg: TrialConfig, world_size: int, restarts: int, error: list[str],
    report: dict[str, Any] | None = None,
) -> None:
    """Mark the trial ``failed`` in metrics.json with ``error`` (rank 0 only)."""
    report = report or metrics_file.new_report(
        max_steps=cfg.trainer.max_steps, world_size=world_size, restarts=restarts, env=os.environ
    )
    metrics_file.write_metrics(TrialFiles(trial_dir).metrics, {**report, "status": "failed", "error": error})


def cuda_env_for(tcfg: TrainerConfig) -> dict[str, str]:
    """What this worker must export before CUDA's first cuBLAS call (see ``gpu_choices.cuda_env``)."""
    device_type = choose_device(tcfg.device, 0, torch.cuda.is_available()).type
    deterministic = gpu_choices.resolve_deterministic(tcfg.deterministic, gpu_choices.DeviceFacts(device_type))
    return gpu_choices.cuda_env(deterministic, device_type, os.environ)


def main(argv: list[str] | None = None) -> typing.NoReturn:
    """``python -m hpcsweep.train TRIAL_DIR [ATTEMPT_FILE]``: train, then exit the process with the trial's exit code."""
    parser = argparse.ArgumentParser(prog="python -m hpcsweep.train", description=__doc__.splitlines()[0])
    parser.add_argument("trial_dir", type=Path, help="directory holding config.yaml")
    parser.add_argument("attempt_file", type=Path, nargs="?", help="what this node's runner wrote for its workers")
    args = parser.parse_args(argv)
    records = read_attempt(args.attempt_file).worker_dir
    stacks = None if records is None else worker_records.enable_stack_dumps(records, ranks_from_env(os.environ)[1])
    try:
        with stop.stop_signals_handled(STOP_REQUESTED.set):
            # The runner starts workers with the stop signals blocked: one that came during imports
            # is delivered here, to the handler.
            stop.unblock_stop_signals()
            code = run_trial(args.trial_dir, args.attempt_file)
    finally:
        if stacks is not None:
            worker_records.disable_stack_dumps(stacks)
    leave_now(code)


def leave_now(code: int) -> typing.NoReturn:
    """Exit at once with ``code``, skipping the interpreter's teardown.

    Everything is on disk by now (checkpoint, metrics.json, events, logs flushed below). The
    teardown of a process holding torch and a process group took 3.5 s of C-level destructors on
    this loaded 2-core machine (faulthandler: no Python frame), all of it inside a stop's way out
    before Slurm's KillWait.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
