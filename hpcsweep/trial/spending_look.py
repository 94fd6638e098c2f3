"""``.budget_usage.json`` in a Slurm sweep's dir: the latest look at the sweep's spending, shared by its trials.

Node 0 of every running trial watches the budget. Were each to ask accounting itself, R running
trials would cost the controller R ``sacct`` calls of the whole sweep per poll interval: with
thousands of trials, one user's budget would keep the site's slurmdbd busy. Instead a trial that
finds a look younger than its poll interval uses it. One that does not claims the next look
(``.budget_usage.claim``, created with ``O_EXCL``, which is atomic on NFS and Lustre too), asks
accounting, and writes what it found for the others. A trial that finds the claim taken waits
for that look; a claim older than ``CLAIM_STALE_S`` belongs to a holder that died during the call,
and is broken.

Times are ``time.time()``: the trials of a sweep run on different nodes, whose wall clocks agree.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcsweep.files.atomic import atomic_write_json
from hpcsweep.files.wait import wait_for
from hpcsweep.slurm.usage import Usage

log = logging.getLogger(__name__)

LOOK_FILE = ".budget_usage.json"
CLAIM_FILE = ".budget_usage.claim"
CLAIM_STALE_S = 90.0
"""A claim this old is a dead holder's: an sacct call times out after 30 s (``commands.DEFAULT_TIMEOUT_S``)."""
CLAIM_WAIT_S = 45.0
"""How long a trial waits for the claim holder's look before it asks accounting itself."""


@dataclass(frozen=True)
class Look:
    """The sweep's spending as accounting gave it at ``at``."""

    at: float
    usage: Usage


def is_fresh(look: Look | None, now: float, max_age_s: float) -> bool:
    """Whether ``look`` is younger than ``max_age_s`` (either way: another node's clock may run a little ahead)."""
    return look is not None and abs(now - look.at) < max_age_s


def read_look(sweep_dir: Path) -> Look | None:
    """The sweep's latest look; None when there is none or it is unreadable (a half-written one never is)."""
    try:
        raw = json.loads((sweep_dir / LOOK_FILE).read_text())
        return Look(float(raw["at"]), Usage(float(raw["spent_hours"]), float(raw["burn_per_hour"])))
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def write_look(sweep_dir: Path, look: Look) -> None:
    atomic_write_json(sweep_dir / LOOK_FILE, {
        "at": look.at, "spent_hours": look.usage.spent_hours, "burn_per_hour": look.usage.burn_per_hour})


def claim(sweep_dir: Path, now: float) -> bool:
    """Take the claim on the next look; False while another trial holds a live one."""
    path = sweep_dir / CLAIM_FILE
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return True
        except FileExistsError:
            try:
                age = now - path.stat().st_mtime
                if age < CLAIM_STALE_S:
                    return False
                log.warning("budget: breaking %s, left %.0f s ago by a trial that never wrote its look", path, age)
                path.unlink()
            except FileNotFoundError:
                pass  # released meanwhile: try again
    return False


def release(sweep_dir: Path) -> None:
    (sweep_dir / CLAIM_FILE).unlink(missing_ok=True)


def shared_usage(sweep_dir: Path, query: Callable[[], Usage], max_age_s: float,
                 clock: Callable[[], float] = time.time) -> Usage:
    """The sweep's spending: the shared look when it is younger than ``max_age_s``, else a new one.

    ``query`` asks accounting (``SlurmCommandError`` when it does not answer, passed on). The
    trial that claims the look queries and writes it; the others wait for it, up to ``CLAIM_WAIT_S``,
    then query themselves.
    """
    seen = read_look(sweep_dir)
    if is_fresh(seen, clock(), max_age_s):
        return seen.usage
    if claim(sweep_dir, clock()):
        try:
            usage = query()
            write_look(sweep_dir, Look(clock(), usage))
            return usage
        finally:
            release(sweep_dir)

    def newer() -> Look | None:
        look = read_look(sweep_dir)
        return look if look is not None and (seen is None or look.at > seen.at) else None

    look = wait_for(newer, CLAIM_WAIT_S)
    return look.usage if look is not None else query()
