"""Why a trial failed, in one line: the exception, or what to change after running out of memory.

``summarize_error`` is pure; ``trial_error_text`` finds the text: metrics.json's ``error``, else
the tail of ``train.log``, ``hpcsweep.log`` (Hydra's job log) and the submitit ``.err`` log.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from hpcsweep.files.trial_files import TrialFiles

OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "out-of-memory handler", "oom_kill")
OOM_ADVICE = "out of memory: set trainer.grad_checkpointing=true or reduce data.batch_size"
TAIL_BYTES = 64 * 1024
# "ValueError: msg", "torch.OutOfMemoryError: msg", "submitit.core.utils.FailedJobError: msg"
_EXCEPTION_LINE = re.compile(r"\b((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failed|Failure))(?::\s.*|$)")
# slurmstepd: "*** JOB 12 ON node1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***"
_SLURM_LINE = re.compile(r"\*\*\* (?:JOB|STEP) .* \*\*\*|slurmstepd: error: .*")
# A config refused where the trial runs ("data.seq_len=64 is not allowed: ...; the trial did not run"),
# as ``hpcsweep.sweep.sweep_trials.exit_with_config_error`` logs it.
_REFUSAL_LINE = re.compile(r"\S+=\S* is not allowed: .*")


def summarize_error(text: str) -> str:
    """One line saying why a run failed, from a traceback or log text ('' for no text).

    Out-of-memory errors become advice on what to change. Otherwise the last exception line
    (``ValueError: ...``), else the last Slurm kill message, else the last non-empty line.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    if any(marker in text for marker in OOM_MARKERS):
        return OOM_ADVICE
    for pattern in (_EXCEPTION_LINE, _REFUSAL_LINE, _SLURM_LINE):
        for line in reversed(lines):
            match = pattern.search(line)
            if match:
                return match.group(0)
    return lines[-1]


def unexplained_failure(slurm_state: str | None) -> str:
    """What ``report`` and ``status`` say of a failure no log line explains: Slurm's end state, when it has one."""
    if slurm_state:
        return f"no log line says why; Slurm ended its task {slurm_state}"
    return "no error recorded"


def error_text(error: str | Sequence[str] | None) -> str:
    """metrics.json's ``error`` (a list of traceback lines, or a string) as text."""
    if error is None:
        return ""
    return error if isinstance(error, str) else "\n".join(error)


def tail(path: Path, max_bytes: int = TAIL_BYTES) -> str:
    """The last ``max_bytes`` of a text file ('' when it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - max_bytes))
            return handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def submitit_logs(sweep_dir: Path, job_id: str | None, suffix: str) -> list[Path]:
    """The submitit logs (``.err`` or ``.out``) of an array task, oldest first."""
    if job_id is None:
        return []
    return sorted((sweep_dir / ".submitit" / job_id).glob(f"*_log{suffix}"), key=lambda p: p.stat().st_mtime)


def trial_error_text(
    trial_dir: Path, sweep_dir: Path, job_id: str | None, metrics_error: str | Sequence[str] | None
) -> str:
    """The text that best explains a failure: the recorded error, else the newest log tail that has one."""
    recorded = error_text(metrics_error)
    if recorded.strip():
        return recorded
    candidates = [TrialFiles(trial_dir).train_log, trial_dir / "hpcsweep.log", *reversed(submitit_logs(sweep_dir, job_id, ".err"))]
    for path in candidates:
        text = tail(path)
        if any(p.search(text) for p in (_EXCEPTION_LINE, _REFUSAL_LINE, _SLURM_LINE)) or any(m in text for m in OOM_MARKERS):
            return text
    return ""
