"""When to save (steps, minutes, rank 0's clock) and the first-save preflight line."""

import pytest

from hpcsweep.config import TrainerConfig
from hpcsweep.train.checkpoint.schedule import SaveSchedule, first_save_message, save_due


@pytest.mark.parametrize(
    ("step", "ckpt_every", "minutes", "every_min", "due"),
    [
        (50, 50, 0.0, None, True),
        (51, 50, 99.0, None, False),  # no minutes set: the clock does not count
        (51, 50, 30.0, 30.0, True),  # whichever comes first
        (51, 50, 29.9, 30.0, False),
        (7, 0, 30.0, 30.0, True),  # by minutes only
        (7, 0, 0.0, None, False),  # 0 and null: only at the end and on a stop
    ],
)
def test_save_due(step, ckpt_every, minutes, every_min, due):
    assert save_due(step, ckpt_every, minutes, every_min) is due


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_rank0s_clock_decides_through_one_agreement_per_step():
    clock, asked = FakeClock(), []

    def agree(flag):  # what any_rank does with rank 0's flag and False from every other rank
        asked.append(flag)
        return flag

    rank0 = SaveSchedule(10, 2.0, is_coordinator=True, agree=agree, clock=clock)
    other = SaveSchedule(10, 2.0, is_coordinator=False, agree=agree, clock=clock)
    clock.now += 121
    assert rank0.due(3) is True and other.due(3) is False  # the other rank's own clock never votes
    rank0.saved()
    clock.now += 60
    assert rank0.due(4) is False
    assert rank0.due(10) is True and asked == [True, False, False]  # a step-due save needs no collective
    no_minutes = SaveSchedule(10, None, is_coordinator=True, agree=agree, clock=clock)
    clock.now += 10_000
    assert no_minutes.due(3) is False and len(asked) == 3


def test_first_save_message_warns_when_a_stop_would_not_fit():
    warn, line = first_save_message(12.0, 1.5, 3 * 2**30, 120)
    assert not warn and line.startswith("checkpoint preflight: the first save took 12.0 s until durable (3072.0 MiB)")
    warn, line = first_save_message(55.0, 6.0, 2**30, 120)
    assert warn and "a stop needs about 61 s of the 120 s" in line and "hydra.launcher.signal_delay_s" in line
    warn, line = first_save_message(55.0, 6.0, 2**30, None)
    assert not warn and "no launcher signal_delay_s" in line


def test_ckpt_every_min_is_checked():
    assert TrainerConfig().ckpt_every_min is None
    assert TrainerConfig(ckpt_every_min=0.5).ckpt_every_min == 0.5
    with pytest.raises(ValueError, match=r"trainer\.ckpt_every_min=0 is not allowed: minutes > 0, or null"):
        TrainerConfig(ckpt_every_min=0)
