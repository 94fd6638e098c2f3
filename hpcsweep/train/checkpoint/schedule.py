"""When to save: every ``ckpt_every`` steps, every ``ckpt_every_min`` minutes, whichever comes first;
and whether a save is fast enough for the launcher's stop signal.

The clock is rank 0's: ranks that each read their own clock could disagree on a step and deadlock
in the save's collectives, so rank 0 decides and the ranks agree through one all-reduce (only when
``ckpt_every_min`` is set).
"""

from __future__ import annotations

import time
from collections.abc import Callable

SLOW_SAVE_FRACTION = 0.5
"""Warn when finishing a step and saving would take this share of ``signal_delay_s`` or more:
the save at a stop takes longer than a periodic one when the file system is busy."""


def save_due(step: int, ckpt_every: int, minutes_since_save: float | None, ckpt_every_min: float | None) -> bool:
    """True when ``step`` is a multiple of ``ckpt_every`` (0: never), or ``ckpt_every_min`` minutes
    (None: never) have passed since the last save began (or training did)."""
    by_steps = bool(ckpt_every) and step % ckpt_every == 0
    by_time = ckpt_every_min is not None and minutes_since_save is not None and minutes_since_save >= ckpt_every_min
    return by_steps or by_time


class SaveSchedule:
    """The save decision of one run: ``due(step)`` gives the same answer on every rank.

    ``agree(flag)`` is the all-reduce that turns rank 0's ``flag`` into every rank's answer
    (``any_rank``); ``is_coordinator`` says whether this rank's clock counts.
    """

    def __init__(
        self,
        ckpt_every: int,
        ckpt_every_min: float | None,
        *,
        is_coordinator: bool,
        agree: Callable[[bool], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ckpt_every, self.ckpt_every_min = ckpt_every, ckpt_every_min
        self.is_coordinator, self.agree, self.clock = is_coordinator, agree, clock
        self.last_save = clock()

    def due(self, step: int) -> bool:
        """Whether to save after ``step`` (a collective when ``ckpt_every_min`` is set)."""
        if save_due(step, self.ckpt_every, None, None):
            return True
        if self.ckpt_every_min is None:
            return False
        minutes = (self.clock() - self.last_save) / 60
        return self.agree(self.is_coordinator and save_due(step, 0, minutes, self.ckpt_every_min))

    def saved(self) -> None:
        """A save began now: the minutes count from here."""
        self.last_save = self.clock()


def first_save_message(save_s: float, step_s: float, size_bytes: int, signal_delay_s: int | None) -> tuple[bool, str]:
    """``(warn, line)`` about the first save of a run: how long it took, against ``signal_delay_s``.

    A stop finishes the step in flight and then saves, so both must fit in ``signal_delay_s``;
    ``warn`` is True when they take ``SLOW_SAVE_FRACTION`` of it or more.
    """
    line = (
        f"checkpoint preflight: the first save took {save_s:.1f} s until durable "
        f"({size_bytes / 2**20:.1f} MiB), a step {step_s:.1f} s"
    )
    if signal_delay_s is None:
        return False, line + "; no launcher signal_delay_s to compare with (not under the Slurm launcher)"
    needed = save_s + step_s
    if needed < SLOW_SAVE_FRACTION * signal_delay_s:
        return False, line + f"; a stop signal comes signal_delay_s={signal_delay_s} s before the time limit"
    return True, (
        line + f": a stop needs about {needed:.0f} s of the {signal_delay_s} s between the signal and the time "
        "limit; raise hydra.launcher.signal_delay_s, or save more often (trainer.ckpt_every_min) so that "
        "less is lost when a stop's save does not finish"
    )
