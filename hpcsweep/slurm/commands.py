"""Every call of a Slurm command goes through here.

Commands are argument lists (never a shell), every call has a timeout, and a failure raises
``SlurmCommandError`` carrying the command's stderr.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

DEFAULT_TIMEOUT_S = 30.0


class SlurmCommandError(RuntimeError):
    """A Slurm command failed, timed out, or is not installed."""

    def __init__(self, argv: Sequence[str], message: str):
        self.argv = list(argv)
        super().__init__(f"{' '.join(self.argv)}: {message}")


def run_slurm(
    argv: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run one Slurm command and return its stdout; raise SlurmCommandError on any failure."""
    if shutil.which(argv[0]) is None:
        raise SlurmCommandError(argv, "command not found on PATH")
    try:
        proc = subprocess.run(
            list(argv),
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else dict(env),
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise SlurmCommandError(argv, f"timed out after {timeout:g} s") from err
    if proc.returncode != 0:
        stderr = proc.stderr.strip() or proc.stdout.strip()
        raise SlurmCommandError(argv, f"exit {proc.returncode}: {stderr}")
    return proc.stdout


def controller_reachable(timeout: float = 10.0) -> tuple[bool, str]:
    """Whether ``sbatch`` is on PATH and ``scontrol ping`` finds a controller, with the reason in one line.

    Without a controller the reason is ``no Slurm controller``: what ``scontrol`` printed about
    its configuration source (several lines) says nothing a user running locally needs.
    """
    if shutil.which("sbatch") is None:
        return False, "sbatch is not on PATH"
    named = os.environ.get("SLURM_CONF")
    if named and not os.path.isfile(named):
        # Slurm's commands cannot start without the file SLURM_CONF names; scontrol would spend about a
        # minute retrying before it said so, and this check its whole timeout.
        return False, f"no Slurm controller (SLURM_CONF={named} is no file)"
    try:
        out = run_slurm(["scontrol", "ping"], timeout=timeout)
    except SlurmCommandError:
        return False, "no Slurm controller"
    if " is UP" not in out:
        return False, f"no Slurm controller ({' '.join(out.split())})"
    return True, f"scontrol ping: {out.strip().splitlines()[0]}"


def show_topology() -> str:
    """``scontrol show topology``: the switch tree reported by the topology plugin."""
    return run_slurm(["scontrol", "show", "topology"])


def show_nodes() -> str:
    """``scontrol show nodes --oneliner``: one line of ``Key=Value`` fields per node."""
    return run_slurm(["scontrol", "show", "nodes", "--oneliner"])


def show_node(name: str) -> str:
    """``scontrol show node --oneliner NAME``."""
    return run_slurm(["scontrol", "show", "node", "--oneliner", name])


def sinfo_partitions(fmt: str) -> str:
    """``sinfo --all --noheader --format=FMT``: one line per partition and node configuration,
    hidden partitions included (a job may still name one)."""
    return run_slurm(["sinfo", "--all", "--noheader", f"--format={fmt}"])


def show_qos(name: str, fields: Sequence[str], timeout: float = 10.0) -> str:
    """One QOS from accounting, ``|``-separated, without a header; empty when it is not there.

    ``--readonly``: this call can never change accounting.
    """
    return run_slurm(
        ["sacctmgr", "--readonly", "--noheader", "--parsable2", "show", "qos", "where", f"name={name}",
         f"format={','.join(fields)}"],
        timeout=timeout,
    )


def show_config() -> str:
    """``scontrol show config``: the controller's running configuration."""
    return run_slurm(["scontrol", "show", "config"])


def show_job(job_id: str) -> str:
    """``scontrol show job --oneliner JOB``."""
    return run_slurm(["scontrol", "show", "job", "--oneliner", job_id])


def requeue(job_id: str) -> None:
    """``scontrol requeue JOB`` (an array task is ``ARRAYID_TASK``)."""
    run_slurm(["scontrol", "requeue", job_id])


def sbatch(options: Sequence[str], script_path: str, script_args: Sequence[str] = ()) -> str:
    """Submit a batch script with ``sbatch --parsable``; return the job id."""
    out = run_slurm(["sbatch", "--parsable", *options, script_path, *script_args], timeout=60.0)
    return out.strip().split(";")[0]


def sacct(job_ids: Sequence[str], fields: Sequence[str]) -> str:
    """One ``sacct`` call for several jobs, ``|``-separated, without a header.

    Every run of a requeued job is listed (``--duplicates``), oldest first.
    """
    return run_slurm(
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--duplicates",
            "--jobs",
            ",".join(job_ids),
            "--format",
            ",".join(fields),
        ]
    )


def squeue(job_ids: Sequence[str], fmt: str) -> str:
    """One ``squeue`` call for several jobs (array tasks one a line), without a header."""
    return run_slurm(
        ["squeue", "--noheader", "--array", "--jobs", ",".join(job_ids), "--format", fmt]
    )


def cancel_pending(job_ids: Sequence[str]) -> None:
    """``scancel --state=PENDING JOB...``: cancel the tasks of these arrays that have not started."""
    run_slurm(["scancel", "--state=PENDING", *job_ids])


def exclude_nodes(job_id: str, nodes: Sequence[str]) -> None:
    """``scontrol update JobId=JOB ExcNodeList=a,b``: the job never runs on these nodes again.

    Slurm 22.05 accepts it for a pending job only (a running one is refused: "Job is no longer
    pending execution"), so after ``requeue``; the list replaces the job's old one.
    """
    run_slurm(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"])
