"""What a trial's failure was, from exit codes, Slurm job states and error text: retried or not.

Pure functions. A failure *of where the trial ran* (a node failure, a communication error, a
worker killed by a signal or by the OOM killer, a hang) is an infrastructure failure: the trial
is retried on other nodes (``hydra.launcher.max_retries``). A failure of the trial's own code or
config (a Python exception in the model, a NaN loss, CUDA out of memory) is not: it would fail
again anywhere.

One crash shows up on every rank: the rank whose process died, and the ranks whose collectives
then broke, or whom torchrun terminated. ``root_cause`` picks the one that explains the others.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Iterable

CODE = "code"
"""The trial's own code or config failed: a Python exception, a NaN loss, CUDA out of memory."""
COMMUNICATION = "communication"
"""A collective or the rendezvous failed: NCCL or gloo errors, a lost peer, a collective timeout."""
SIGNAL = "signal"
"""A worker was killed by a signal (SIGKILL, SIGSEGV, SIGBUS, SIGABRT, ...)."""
OOM_KILLED = "oom_killed"
"""The kernel's or Slurm's OOM killer ended the job (host memory, not GPU memory)."""
NODE_FAILURE = "node_failure"
"""Slurm lost a node of the job (``NODE_FAIL``)."""
HANG = "hang"
"""No step finished for ``trainer.hang_timeout_min`` (``hpcsweep.trial.watchdog``)."""
TERMINATED = "terminated"
"""A worker ended by SIGTERM: torchrun ending the siblings of a failed worker, never a cause."""

INFRASTRUCTURE = frozenset({COMMUNICATION, SIGNAL, OOM_KILLED, NODE_FAILURE, HANG, TERMINATED})
"""Failure classes caused by where the trial ran: retried on other nodes."""

# Which failure explains the others when several ranks fail together (lower first): the rank that
# raised or died caused the broken collectives of the rest, and torchrun's SIGTERM followed both.
_PRIORITY = {CODE: 0, OOM_KILLED: 1, SIGNAL: 1, NODE_FAILURE: 2, HANG: 3, COMMUNICATION: 4, TERMINATED: 5}

# Error text of a failed collective or rendezvous (NCCL, gloo, torch.distributed, c10d store).
_COMMUNICATION_PATTERNS = re.compile(
    "|".join(
        (
            r"\bNCCL (?:error|WARN|communicator)",
            r"\bnccl(?:System|Remote|Internal|InvalidUsage|Unhandled(?:Cuda)?)Error\b",
            r"ProcessGroupNCCL",
            r"Watchdog caught collective operation timeout",
            r"DistBackendError",
            r"DistNetworkError",
            r"\bgloo\b.*(?:failed|error|timeout|Timed out)",
            r"third_party/gloo",
            r"Connection (?:closed|reset) by peer",
            r"Connection refused",
            r"Broken pipe",
            r"Socket Timeout",
            r"RendezvousConnectionError",
            r"RendezvousTimeoutError",
        )
    ),
    re.IGNORECASE,
)

# Error text that is the trial's own fault even when a collective is named in the traceback.
_CODE_PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|\bnan\b.*loss|loss.*\bnan\b|non-finite loss", re.IGNORECASE
)

# Slurm job (or step) states that say where the trial ran failed.
_SLURM_STATES = {"NODE_FAIL": NODE_FAILURE, "OUT_OF_MEMORY": OOM_KILLED, "BOOT_FAIL": NODE_FAILURE}


def classify_error_text(text: str) -> str:
    """The class of a worker's Python error from its text (traceback or message)."""
    if _CODE_PATTERNS.search(text):
        return CODE
    if _COMMUNICATION_PATTERNS.search(text):
        return COMMUNICATION
    return CODE


def classify_exit_code(exit_code: int, error_text: str = "") -> str:
    """The class of a worker's non-zero exit: negative codes are deaths by signal (torchrun's
    convention), codes above 128 a shell's report of one, others a Python error read from its text."""
    if exit_code == 0:
        raise ValueError("exit code 0 is no failure")
    signum = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 128 + 65 else None
    if signum is not None:
        if signum == signal.SIGTERM:
            return TERMINATED
        return SIGNAL
    return classify_error_text(error_text)


def classify_slurm_state(state: str) -> str | None:
    """The class a Slurm job state stands for (``NODE_FAIL``, ``OUT_OF_MEMORY``), else None.

    sacct appends details to some states (``CANCELLED by 1000``): only the first word counts.
    """
    words = state.split()
    return _SLURM_STATES.get(words[0].upper()) if words else None


def is_retried(kind: str) -> bool:
    """Whether a failure of this class is retried on other nodes."""
    return kind in INFRASTRUCTURE


def signal_name(exit_code: int) -> str | None:
    """``SIGKILL`` for an exit code -9 (or 137), None for an exit that is no signal."""
    signum = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 128 + 65 else None
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclasses.dataclass(frozen=True)
class Failure:
    """One rank's failure as one node saw it."""

    kind: str
    node: str
    rank: int | None
    exit_code: int | None
    traceback: str
    at: float
    """When it happened (``time.time()``), to order failures of equal weight."""

    @property
    def retried(self) -> bool:
        """Whether this failure's class is retried."""
        return is_retried(self.kind)

    def summary(self) -> str:
        """One line: class, rank, node and exit."""
        where = f"rank {self.rank} on {self.node}" if self.rank is not None else f"node {self.node}"
        died = signal_name(self.exit_code) if self.exit_code is not None else None
        exit_text = "" if self.exit_code is None else f", exit {self.exit_code}" + (f" ({died})" if died else "")
        return f"{self.kind} failure of {where}{exit_text}"


def root_cause(failures: Iterable[Failure]) -> Failure:
    """The failure that explains the others: the heaviest class, then the earliest."""
    ordered = sorted(failures, key=lambda f: (_PRIORITY.get(f.kind, len(_PRIORITY)), f.at))
    if not ordered:
        raise ValueError("no failures to choose a root cause from")
    return ordered[0]
