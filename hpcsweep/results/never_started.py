"""Why a trial whose run never started did not run, in one line: what ``report`` and ``status`` show for it.

A trial of a ``data=text`` sweep waits on its token preparation job (``afterok``); when that job fails,
Slurm cancels the trial's task (``--kill-on-invalid-dep=yes``: its dependency can never be satisfied),
and the cancelled task itself says nothing of why. The reason is, in this order: the ``error`` the
preparation job wrote into the trial's ``metrics.json`` (``hpcsweep.prepare.text_tokens``), else the
preparation job's failed state and its log's last line. Pure: the reading happens in ``load_sweep``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcsweep.results.failure import error_text, summarize_error

NEVER_STARTED_STATUSES = ("cancelled", "not_started")
"""The statuses of a trial that may have ended without its run ever starting."""


def never_started(metrics: Mapping[str, Any] | None) -> bool:
    """Whether a trial's run never started: no ``metrics.json``, or one at step 0 that trained nothing."""
    return not metrics or not metrics.get("step")


def never_started_line(
    metrics: Mapping[str, Any] | None,
    preparation_job: str | None,
    preparation_state: str | None,
    preparation_log_line: str | None,
) -> str:
    """Why the trial never ran ('' when nothing says): its recorded error, else its failed token preparation.

    ``preparation_state`` is the preparation job's Slurm state (``FAILED``), None when unknown or when
    the sweep has none; ``preparation_log_line`` the last line of its log.
    """
    recorded = error_text((metrics or {}).get("error")).strip()
    if recorded:
        return recorded if "\n" not in recorded else summarize_error(recorded)
    if preparation_job is None or preparation_state in (None, "COMPLETED", "PENDING", "RUNNING"):
        return ""
    line = (f"never started: its token preparation job {preparation_job} ended {preparation_state}, "
            "so the dependency it waited on can never be satisfied")
    return f"{line}: {preparation_log_line}" if preparation_log_line else line
