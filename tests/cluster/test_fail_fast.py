"""Fail fast and retry on the real local cluster: a crashed rank and a hung rank (``HPCSWEEP_FAULT``)
end the whole 2-node trial within seconds or the hang timeout, are recorded in metrics.json, and
are retried once on nodes without the one that failed."""

from __future__ import annotations

import datetime
from pathlib import Path

from .conftest import TWO_NODES_TWO_PROCESSES, read_json, slurm, wait_for
from .test_preemption import submit, wait_until_final


def runs(env: dict[str, str], job_id: str) -> list[dict[str, str]]:
    """Every run of the job from accounting, oldest first: state, nodes, start and end."""
    out = slurm(env, "sacct", "-X", "--duplicates", "--noheader", "--parsable2", "-j", job_id,
                "--format=State,NodeList,Start,End")
    fields = ("state", "nodelist", "start", "end")
    return [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines() if line]


def hostnames(env: dict[str, str], nodelist: str) -> set[str]:
    return set(slurm(env, "scontrol", "show", "hostnames", nodelist).split())


def first_run_ended(env: dict[str, str], job_id: str) -> dict[str, str] | None:
    found = runs(env, job_id)
    return found[0] if found and found[0]["end"] not in ("", "Unknown") else None


def seconds_from_fault(trial_dir: Path, run: dict[str, str]) -> float:
    """From the fault (its marker file's mtime) to the end of the run it hit (sacct, whole seconds)."""
    fault_at = (trial_dir / "fault_injected.txt").stat().st_mtime
    return datetime.datetime.fromisoformat(run["end"]).timestamp() - fault_at


def test_a_crashed_rank_ends_the_trial_at_once_and_it_is_retried_off_that_node(tmp_path, slurm_env, two_node_trial):
    env = {**slurm_env, "HPCSWEEP_FAULT": "crash,step=5,rank=3"}
    job_id, trial_dir = submit(tmp_path, env, *TWO_NODES_TWO_PROCESSES, "hydra.launcher.max_retries=1")

    first = wait_for(lambda: first_run_ended(slurm_env, job_id), timeout=180, what="the crashed run to end")
    took = seconds_from_fault(trial_dir, first)
    print(f"\ncrash of rank 3 -> whole trial ended: {max(took, 0.0):.1f} s (run end from sacct, whole seconds)")
    assert took <= 60, first

    metrics = wait_until_final(slurm_env, job_id, trial_dir, timeout=240)
    (failure,) = metrics["failures"]
    assert (failure["class"], failure["rank"], failure["signal"], failure["retried"]) == ("signal", 3, "SIGSEGV", True)
    assert "in _crash" in failure["traceback"] and "in fit" in failure["traceback"]
    assert failure["node"] in hostnames(slurm_env, first["nodelist"])

    assert metrics["status"] == "completed", metrics.get("error")
    assert failure["node"] not in metrics["nodes"] and len(metrics["nodes"]) == 2
    assert len(runs(slurm_env, job_id)) == 2
    assert metrics["weights_sha256"] == read_json(two_node_trial.trial_dir / "metrics.json")["weights_sha256"]


def test_a_hung_rank_ends_the_trial_within_its_hang_timeout_with_stacks_and_is_retried(tmp_path, slurm_env):
    env = {**slurm_env, "HPCSWEEP_FAULT": "hang,step=5,rank=1"}
    job_id, trial_dir = submit(tmp_path, env, "trainer.nodes=2", "trainer.nproc_per_node=1",
                               "trainer.hang_timeout_min=1", "hydra.launcher.max_retries=1")

    first = wait_for(lambda: first_run_ended(slurm_env, job_id), timeout=240, what="the hung run to end")
    took = seconds_from_fault(trial_dir, first)
    print(f"\nhang of rank 1 -> whole trial ended: {took:.1f} s (hang_timeout_min=1)")
    assert 55 <= took <= 120, first
    log = "\n".join(path.read_text(errors="replace") for path in trial_dir.glob("*.log"))
    assert "no step finished for" in log and "in _hang" in log, log[-3000:]

    metrics = wait_until_final(slurm_env, job_id, trial_dir, timeout=240)
    (failure,) = metrics["failures"]
    assert (failure["class"], failure["rank"], failure["retried"]) == ("hang", 1, True)
    assert "in _hang" in failure["traceback"]
    assert metrics["status"] == "completed", metrics.get("error")
    assert failure["node"] not in metrics["nodes"]
