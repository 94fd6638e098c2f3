"""Outcomes become exit codes in one module, each code with one meaning; no exception carries an outcome."""

import ast
from pathlib import Path

import pytest

from hpcsweep.control import exit_codes
from hpcsweep.control.outcome import Outcome, ends_the_task
from hpcsweep.control.stop import BUDGET, INTERRUPTED, PREEMPTED, TIME_LIMIT

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("outcome", "code"), [
    (Outcome("completed"), 0), (Outcome("skipped"), 0), (Outcome("pruned"), 0), (Outcome("node_done"), 0),
    (Outcome("failed"), 1), (Outcome("requeue", reason=TIME_LIMIT), 3), (Outcome("requeue", reason=PREEMPTED), 3),
    (Outcome("retry"), 4), (Outcome("stopped", reason="requested"), 5), (Outcome("stopped", reason=BUDGET), 5),
    (Outcome("stopped", reason=INTERRUPTED), 130), (Outcome("aborted", reason=INTERRUPTED), 130),
])
def test_each_outcome_has_its_exit_code(outcome, code):
    assert exit_codes.exit_code(outcome) == code


def test_every_code_is_in_the_modules_table():
    table = exit_codes.__doc__
    for code in (exit_codes.EXIT_OK, exit_codes.EXIT_FAILED, exit_codes.EXIT_REFUSED, exit_codes.EXIT_REQUEUE,
                 exit_codes.EXIT_RETRY, exit_codes.EXIT_STOPPED, exit_codes.EXIT_INTERRUPTED):
        assert f"\n{code:<4}  " in table, f"exit code {code} is not documented"


def test_a_budget_stop_ends_the_trial_not_the_task():
    assert not ends_the_task(Outcome("stopped", reason=BUDGET))
    assert ends_the_task(Outcome("stopped", reason=INTERRUPTED)) and ends_the_task(Outcome("requeue"))
    assert not ends_the_task(Outcome("completed")) and not ends_the_task(Outcome("failed"))


def test_only_a_requeue_outcome_with_a_job_calls_scontrol(monkeypatch):
    requeued = []
    monkeypatch.setattr(exit_codes, "requeue_job", requeued.append)
    assert exit_codes.carry_out(Outcome("requeue", requeue_job="12_3")) == 3
    assert exit_codes.carry_out(Outcome("requeue", reason=PREEMPTED)) == 3  # Slurm requeues it itself
    assert requeued == ["12_3"]


def test_a_retry_is_requeued_then_kept_off_its_failed_node_and_the_nodes_it_already_excludes(monkeypatch):
    # The real scontrol calls: tests/cluster/test_fail_fast.py (the retry runs on other nodes).
    from hpcsweep.slurm import commands

    calls = []
    monkeypatch.setattr(commands, "show_job", lambda job: "JobId=12 ArrayJobId=11 ExcNodeList=node4 NodeList=node1")
    monkeypatch.setattr(commands, "requeue", lambda job: calls.append(("requeue", job)))
    monkeypatch.setattr(commands, "exclude_nodes", lambda job, nodes: calls.append(("exclude", job, list(nodes))))
    retry = Outcome("retry", "retry 1 of 1, excluding node2", requeue_job="11_3", exclude_nodes=("node2",))
    assert exit_codes.carry_out(retry) == exit_codes.EXIT_RETRY
    # ExcNodeList is accepted for a pending job only, so after the requeue.
    assert calls == [("requeue", "11_3"), ("exclude", "11_3", ["node2", "node4"])]


def base_exception_subclasses(path: Path) -> list[str]:
    """Classes in ``path`` deriving from SystemExit, BaseException, KeyboardInterrupt or GeneratorExit."""
    control_flow = {"SystemExit", "BaseException", "KeyboardInterrupt", "GeneratorExit"}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            bases = {base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "") for base in node.bases}
            if bases & control_flow:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    return found


def test_no_exception_outside_exception_carries_control_flow():
    sources = [*(REPO / "hpcsweep").rglob("*.py"), *(REPO / "hydra_plugins").rglob("*.py")]
    assert [hit for path in sources for hit in base_exception_subclasses(path)] == []
