"""What became of a ``data=text`` sweep's token preparation job, in one line for ``status``.

The trial arrays wait on the job (``afterok``) and Slurm cancels them when it fails
(``--kill-on-invalid-dep=yes``); their cancelled tasks say nothing of why, so this line does:
the job's state, its log, and the log's last line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from hpcsweep.files.sweep_record import TokenPreparationRecord
from hpcsweep.results.failure import tail
from hpcsweep.slurm import commands

SACCT_FIELDS = ("JobID", "State", "ExitCode")
FAILED_STATES = ("FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
"""States (their first word: ``CANCELLED by 0``) after which the job never writes its entries."""


def parse_job_state(sacct_text: str, job_id: str) -> tuple[str, str] | None:
    """``(state, exit code)`` of ``job_id``'s last run in ``sacct --parsable2`` text; None if absent."""
    found = None
    for line in sacct_text.splitlines():
        fields = line.split("|")
        if len(fields) >= 3 and fields[0] == job_id:
            found = (fields[1].split()[0] if fields[1] else "UNKNOWN", fields[2])
    return found


def last_line(path: Path) -> str | None:
    """The last non-blank line of the log at ``path`` (None when it is empty or missing)."""
    lines = [line for line in tail(path).splitlines() if line.strip()]
    return lines[-1].strip() if lines else None


def preparation_line(preparation: TokenPreparationRecord, state: tuple[str, str] | None) -> str:
    """The line ``status`` prints for the preparation job, in its ``state`` (None: unknown)."""
    head = f"token preparation: job {preparation.job_id}"
    if state is None:
        return f"{head}, state unknown (accounting did not answer); log: {preparation.log}"
    name, exit_code = state
    if name == "COMPLETED":
        return f"{head} COMPLETED: the corpus is tokenized"
    if name in FAILED_STATES:
        why = last_line(Path(preparation.log))
        return (f"{head} {name} (exit {exit_code}): the trials were cancelled, as they can never start without "
                f"it; log: {preparation.log}" + (f": {why}" if why else ""))
    return f"{head} {name}: the trials wait for it to tokenize the corpus"


def preparation_status(
    preparation: TokenPreparationRecord, query: Callable[[Sequence[str], Sequence[str]], str] = commands.sacct
) -> str:
    """``preparation_line`` from one ``sacct`` call for the job."""
    try:
        state = parse_job_state(query([preparation.job_id], SACCT_FIELDS), preparation.job_id)
    except commands.SlurmCommandError:
        state = None
    return preparation_line(preparation, state)
