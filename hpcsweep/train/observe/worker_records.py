"""What each worker leaves for its node's runner: step progress, Python stacks, its traceback.

The runner of node N names ``TRIAL_DIR/workers/nodeN`` (emptied before each run) in the node's
attempt file (``hpcsweep.files.attempt_file``); each worker writes there, under its local rank:

- ``localL.progress.json``: its pid, global rank, node and last finished step, rewritten after
  every step. The runner's hang watchdog reads how long ago a step finished, and whom to signal.
- ``localL.stacks.txt``: Python stacks, written by ``faulthandler`` on a fatal signal (SIGSEGV,
  SIGBUS, SIGABRT, ...) and whenever the worker gets ``STACKS_SIGNAL``; a hang shows here.
- ``localL.error.txt``: the traceback of the exception that ended the worker.

Without a runner (a worker run by hand) nothing is written.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from hpcsweep.files.atomic import atomic_write_json

STACKS_SIGNAL = signal.SIGQUIT
"""Makes a worker write every thread's Python stack: not a stop signal, and not USR1, which NCCL may catch."""


def progress_path(worker_dir: Path, local_rank: int) -> Path:
    return worker_dir / f"local{local_rank}.progress.json"


def stacks_path(worker_dir: Path, local_rank: int) -> Path:
    return worker_dir / f"local{local_rank}.stacks.txt"


def error_path(worker_dir: Path, local_rank: int) -> Path:
    return worker_dir / f"local{local_rank}.error.txt"


def write_progress(worker_dir: Path, *, rank: int, local_rank: int, node: str, step: int) -> None:
    """Record that ``step`` finished now (step 0: the worker started)."""
    atomic_write_json(
        progress_path(worker_dir, local_rank),
        {"pid": os.getpid(), "rank": rank, "local_rank": local_rank, "node": node, "step": step, "time": time.time()},
    )


def read_progress(worker_dirs: list[Path]) -> list[dict[str, Any]]:
    """Every worker's last progress record in these dirs (a half-written or missing one is skipped)."""
    records = []
    for directory in worker_dirs:
        for path in sorted(directory.glob("local*.progress.json")):
            try:
                records.append(json.loads(path.read_text()))
            except (FileNotFoundError, json.JSONDecodeError):
                continue
    return records


def enable_stack_dumps(worker_dir: Path, local_rank: int) -> IO[str]:
    """Have ``faulthandler`` write this process's stacks to its stacks file on a fatal signal and
    on ``STACKS_SIGNAL``; returns the open file, which must stay open while the process runs."""
    stream = stacks_path(worker_dir, local_rank).open("a")
    faulthandler.enable(file=stream, all_threads=True)
    faulthandler.register(STACKS_SIGNAL, file=stream, all_threads=True)
    return stream


def disable_stack_dumps(stream: IO[str]) -> None:
    """Undo ``enable_stack_dumps`` and close its file."""
    faulthandler.unregister(STACKS_SIGNAL)
    faulthandler.disable()
    stream.close()


def write_error(worker_dir: Path | None, local_rank: int, text: str) -> None:
    """Leave the traceback that ended this worker for the runner (nothing without a worker dir)."""
    if worker_dir is not None:
        error_path(worker_dir, local_rank).write_text(text)


def progress_hooks(
    worker_dir: Path | None, *, rank: int, local_rank: int, node: str
) -> list[Callable[[Any, int], None]]:
    """A step hook recording each finished step (none without a worker dir)."""
    if worker_dir is None:
        return []

    def record_step(trainer: Any, step: int) -> None:
        write_progress(worker_dir, rank=rank, local_rank=local_rank, node=node, step=step)

    return [record_step]
