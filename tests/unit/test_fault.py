"""``HPCSWEEP_FAULT``: its parser, and the hook that fires once per trial dir on its rank."""

from __future__ import annotations

import pytest

from hpcsweep.control.stop import STOP_REQUESTED
from hpcsweep.train.fault import MARKER_FILE, STOP_REASON, Fault, fault_hooks, parse_fault, save_pause


@pytest.mark.parametrize(
    ("raw", "fault"),
    [("crash,step=5,rank=3", Fault("crash", 5, 3)), ("hang,step=5,rank=1", Fault("hang", 5, 1)),
     (" hang, rank=0, step=12 ", Fault("hang", 12, 0)), ("stop,step=4,rank=0", Fault("stop", 4, 0)),
     ("hang_in_save,step=6,rank=0", Fault("hang_in_save", 6, 0)), ("", None), ("  ", None)],
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


def test_a_stop_fault_requests_the_stop_a_signal_would_once_per_trial_dir(tmp_path):
    env = {"HPCSWEEP_FAULT": "stop,step=2,rank=0"}
    (hook,) = fault_hooks(env, tmp_path, rank=0)
    try:
        hook(None, 1)
        assert not STOP_REQUESTED.is_set()
        hook(None, 2)
        assert STOP_REQUESTED.reason == STOP_REASON
        STOP_REQUESTED.clear()
        (resumed,) = fault_hooks(env, tmp_path, rank=0)
        resumed(None, 2)
        assert not STOP_REQUESTED.is_set()  # the resume of the same trial dir trains on
    finally:
        STOP_REQUESTED.clear()
    assert save_pause(env, tmp_path, rank=0) is None


def test_hang_in_save_is_the_checkpoint_stores_pause_on_its_rank_only(tmp_path):
    env = {"HPCSWEEP_FAULT": "hang_in_save,step=6,rank=0"}
    assert fault_hooks(env, tmp_path, rank=0) == [] and save_pause(env, tmp_path, rank=1) is None
    step, _pause = save_pause(env, tmp_path, rank=0)
    assert step == 6  # the pause itself waits for ever: tests/unit/test_sharded_checkpoint.py kills it
