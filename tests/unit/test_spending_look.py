"""What a budget watch's poll costs a large sweep: one shared look at the spending (one sacct call a
poll interval, not one per trial), and one stat of sweep.json while it is unchanged."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import pytest

from hpcsweep.files.sweep_record import ArrayRecord, SweepRecord, TrialRecord, write_sweep_record
from hpcsweep.slurm.commands import SlurmCommandError
from hpcsweep.slurm.usage import Usage
from hpcsweep.trial import budget_watch, spending_look
from hpcsweep.trial.rendezvous import Rendezvous
from hpcsweep.trial.spending_look import CLAIM_FILE, LOOK_FILE, Look, is_fresh, read_look, shared_usage, write_look

from .fake_slurm import fake_slurm  # noqa: F401 (a fixture)
from .test_budget import TRIAL

USAGE = Usage(spent_hours=2.5, burn_per_hour=8.0)


class Queries:
    """A stand-in for accounting that counts its calls."""

    def __init__(self, usage: Usage = USAGE) -> None:
        self.usage, self.calls = usage, 0

    def __call__(self) -> Usage:
        self.calls += 1
        return self.usage


def test_a_look_is_fresh_for_one_poll_either_side_of_now():
    look = Look(at=1000.0, usage=USAGE)
    assert is_fresh(look, 1059.0, 60.0) and is_fresh(look, 995.0, 60.0)  # another node's clock a little ahead
    assert not is_fresh(look, 1060.0, 60.0) and not is_fresh(None, 1000.0, 60.0)


def test_a_look_reads_back_and_a_torn_or_missing_one_reads_as_none(tmp_path):
    assert read_look(tmp_path) is None
    write_look(tmp_path, Look(1000.0, USAGE))
    assert read_look(tmp_path) == Look(1000.0, USAGE)
    (tmp_path / LOOK_FILE).write_text('{"at": 1000.0, "spent_hours"')
    assert read_look(tmp_path) is None


def test_a_fresh_look_is_used_and_a_stale_one_renewed(tmp_path):
    query = Queries()
    write_look(tmp_path, Look(1000.0, Usage(1.0, 4.0)))
    assert shared_usage(tmp_path, query, 60.0, clock=lambda: 1030.0) == Usage(1.0, 4.0)
    assert query.calls == 0
    assert shared_usage(tmp_path, query, 60.0, clock=lambda: 1070.0) == USAGE
    assert query.calls == 1 and read_look(tmp_path) == Look(1070.0, USAGE)
    assert not (tmp_path / CLAIM_FILE).exists()


def test_a_trial_that_finds_the_claim_taken_waits_for_its_holders_look(tmp_path):
    query = Queries()
    write_look(tmp_path, Look(time.time() - 120, Usage(1.0, 4.0)))
    assert spending_look.claim(tmp_path, time.time())  # another trial is asking accounting
    holder = threading.Timer(0.3, lambda: write_look(tmp_path, Look(time.time(), Usage(3.0, 16.0))))
    holder.start()
    try:
        assert shared_usage(tmp_path, query, 60.0) == Usage(3.0, 16.0)
    finally:
        holder.join()
    assert query.calls == 0


def test_a_dead_holders_claim_is_broken(tmp_path):
    query = Queries()
    assert spending_look.claim(tmp_path, time.time())
    left = time.time() - spending_look.CLAIM_STALE_S - 1
    os.utime(tmp_path / CLAIM_FILE, (left, left))
    assert shared_usage(tmp_path, query, 60.0) == USAGE
    assert query.calls == 1 and not (tmp_path / CLAIM_FILE).exists()


def test_a_failed_query_releases_the_claim_and_says_why(tmp_path):
    def refused() -> Usage:
        raise SlurmCommandError(["sacct"], "exit 1: slurmdbd down")

    with pytest.raises(SlurmCommandError, match="slurmdbd down"):
        shared_usage(tmp_path, refused, 60.0)
    assert not (tmp_path / CLAIM_FILE).exists() and read_look(tmp_path) is None
    assert shared_usage(tmp_path, Queries(), 60.0) == USAGE  # the next look is not blocked


def _slurm_sweep(tmp_path, trials: int, budget: float) -> None:
    records = [TrialRecord(n, [], str(tmp_path / str(n)), f"41_{n}", "2026-01-01T00:00:00+00:00")
               for n in range(trials)]
    for record in records:
        (tmp_path / str(record.num)).mkdir()
    write_sweep_record(SweepRecord(str(tmp_path), "slurm", "2026-01-01T00:00:00+00:00", records,
                                   [ArrayRecord("41", list(range(trials)))], budget_gpu_hours=budget))


def node0_of(rdzv_id: str) -> Rendezvous:
    return Rendezvous("127.0.0.1", 29500, nnodes=1, node_rank=0, nproc_per_node=1, rdzv_id=rdzv_id)


def test_eight_watching_trials_share_one_sacct_call_per_poll(tmp_path, fake_slurm, monkeypatch):  # noqa: F811
    trials, poll_s = 8, 0.25
    _slurm_sweep(tmp_path, trials, budget=1000.0)
    fake_slurm.answer("sacct", "".join(f"41_{n}|RUNNING|60|cpu=1,gres/gpu=1,node=1|n{n}\n" for n in range(trials)))
    looks = []
    real_usage = budget_watch.sweep_usage

    def counted(*args, **kwargs):
        looks.append(threading.current_thread().name)
        return real_usage(*args, **kwargs)

    monkeypatch.setattr(budget_watch, "sweep_usage", counted)
    stops: list[str] = []
    env = {budget_watch.POLL_VAR: str(poll_s)}
    watches = [budget_watch.watching(TRIAL, tmp_path / str(n), node0_of(f"41_{n}"), stops.append, env)
               for n in range(trials)]
    for watch in watches:
        watch.__enter__()
        time.sleep(poll_s / trials)  # trials start apart, as array tasks do
    try:
        deadline = time.monotonic() + 60
        while len(looks) < 5 * trials:
            assert time.monotonic() < deadline, f"the watches looked {len(looks)} times in 60 s"
            time.sleep(0.05)
    finally:
        for watch in watches:
            watch.__exit__(None, None, None)
    calls = len(fake_slurm.calls("sacct"))
    # Each trial asking accounting itself would make one call per look; sharing makes about one per poll.
    assert 2 <= calls <= len(looks) / 3, f"{calls} sacct calls for {len(looks)} looks of {trials} trials"
    assert stops == [] and not (tmp_path / CLAIM_FILE).exists()
    assert read_look(tmp_path).usage == Usage(spent_hours=pytest.approx(trials * 60 / 3600), burn_per_hour=8.0)


def test_a_watch_reads_sweep_json_again_only_once_it_changed(tmp_path, monkeypatch):
    _slurm_sweep(tmp_path, 3, budget=10.0)
    reads = []
    real_read = budget_watch.read_sweep_record
    monkeypatch.setattr(budget_watch, "read_sweep_record", lambda folder: reads.append(folder) or real_read(folder))
    lookup = budget_watch.SweepLookup(tmp_path / "1")
    assert [lookup.find()[1].budget_gpu_hours for _ in range(3)] == [10.0] * 3
    assert len(reads) == 1
    # A retry or a new budget rewrites sweep.json (an atomic rename): the next poll reads it.
    record = real_read(tmp_path)
    write_sweep_record(dataclasses.replace(record, budget_gpu_hours=20.0))
    assert lookup.find()[1].budget_gpu_hours == 20.0 and len(reads) == 2
    assert lookup.find()[1].budget_gpu_hours == 20.0 and len(reads) == 2


def test_a_trial_listed_through_a_symlink_is_still_found(tmp_path):
    real = tmp_path / "lustre" / "sweep"
    real.mkdir(parents=True)
    (tmp_path / "scratch").symlink_to(tmp_path / "lustre")
    linked = tmp_path / "scratch" / "sweep" / "0"  # how the launcher wrote it: through the link
    (real / "0").mkdir()
    write_sweep_record(SweepRecord(str(real), "slurm", "2026-01-01T00:00:00+00:00",
                                   [TrialRecord(0, [], str(linked), "41_0", "2026-01-01T00:00:00+00:00")],
                                   [ArrayRecord("41", [0])], budget_gpu_hours=1.0))
    found = budget_watch.find_sweep(real / "0")
    assert found is not None and found[0] == real.resolve()
    assert budget_watch.find_sweep(tmp_path / "scratch" / "sweep" / "0")[0] == real.resolve()
    (tmp_path / "elsewhere").mkdir()
    assert budget_watch.find_sweep(tmp_path / "elsewhere") is None
