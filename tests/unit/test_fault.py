"""``HPCSWEEP_FAULT``: its parser, and the hook that fires once per trial dir on its rank."""

from __future__ import annotations

import pytest

from hpcsweep.train.fault import MARKER_FILE, Fault, fault_hooks, parse_fault


@pytest.mark.parametrize(
    ("raw", "fault"),
    [("crash,step=5,rank=3", Fault("crash", 5, 3)), ("hang,step=5,rank=1", Fault("hang", 5, 1)),
     (" hang, rank=0, step=12 ", Fault("hang", 12, 0)), ("", None), ("  ", None)],
)
def test_valid_faults_parse(raw, fault):
    assert parse_fault(raw) == fault


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("explode,step=5,rank=3", "unknown fault 'explode'"),
        ("crash,step=5", "rank missing"),
        ("crash", "step and rank missing"),
        ("crash,step=0,rank=1", "step must be >= 1"),
        ("crash,step=-1,rank=1", "step='-1' is not a whole number"),
        ("crash,step=five,rank=1", "step='five' is not a whole number"),
        ("crash,step=5,rank=1,node=2", "unknown field 'node=2'"),
        ("crash,step5,rank=1", "unknown field 'step5'"),
        ("crash,step=5,step=6,rank=1", "step given twice"),
    ],
)
def test_bad_faults_are_refused_with_one_line_naming_the_variable(raw, why):
    with pytest.raises(ValueError) as err:
        parse_fault(raw)
    message = str(err.value)
    assert message.startswith(f"HPCSWEEP_FAULT={raw!r} is not allowed: {why};")
    assert "crash, hang" in message and "\n" not in message


def test_the_fault_fires_once_on_its_rank_at_its_step(tmp_path):
    fired = []
    env = {"HPCSWEEP_FAULT": "crash,step=3,rank=1"}
    assert fault_hooks(env, tmp_path, rank=0) == []
    assert fault_hooks({}, tmp_path, rank=1) == []
    (hook,) = fault_hooks(env, tmp_path, rank=1, fire={"crash": lambda: fired.append("crash")})
    for step in (1, 2, 3, 4):
        hook(None, step)
    assert fired == ["crash"]
    assert (tmp_path / MARKER_FILE).read_text() == "crash,step=3,rank=1\n"
    # The retry of the same trial dir runs clean.
    (again,) = fault_hooks(env, tmp_path, rank=1, fire={"crash": lambda: fired.append("again")})
    again(None, 3)
    assert fired == ["crash"]
