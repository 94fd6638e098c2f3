"""The step-time breakdown: its accounting, the host and CUDA-event clocks, and real CPU trials."""

import math

import pytest
import torch

from hpcsweep.files.tb_runs import run_event_files
from hpcsweep.results.event_reader import read_runs
from hpcsweep.train.trackers import metrics
from hpcsweep.train import worker as train
from hpcsweep.train.observe.memory_record import PeakMemory
from hpcsweep.train.observe.step_timer import (
    OTHER,
    PHASES,
    CudaEventClock,
    HostClock,
    NoStepTimer,
    StepTimer,
    add_window,
    build_step_timer,
    carried_total,
    clock_for,
    tensorboard_scalars,
    window_record,
)

from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)

PCT_KEYS = [f"{phase}_pct" for phase in PHASES]


def record(wall_s, **phase_s):
    return window_record(4, wall_s, phase_s, tokens_per_s=100.0, mfu=None, peak_bytes=3 * 2**30, peak_source="rss")


def test_a_window_is_its_phases_and_the_rest_is_other():
    window = record(10.0, data=4.0, compute=3.0, optimizer=1.0, checkpoint=0.5)
    assert window["other_s"] == pytest.approx(1.5) and window["logging_s"] == 0.0
    assert [window[key] for key in PCT_KEYS] == pytest.approx([40.0, 30.0, 10.0, 5.0, 0.0])
    assert (window["steps"], window["seconds"], window["tokens_per_s"], window["mfu"]) == (4, 10.0, 100.0, None)
    assert (window["peak_memory_gb"], window["peak_memory_source"]) == (3.0, "rss")


def test_gpu_phases_longer_than_the_host_wall_make_the_window_never_past_100_percent():
    window = record(1.0, data=0.25, compute=1.0)
    assert window["seconds"] == 1.25 and window["other_s"] == 0.0
    assert sum(window[key] for key in PCT_KEYS) == pytest.approx(100.0)
    assert record(0.0)["data_pct"] == 0.0  # an empty window divides by nothing


def test_the_run_total_sums_seconds_and_steps_and_takes_the_percentages_of_the_sums():
    first, second = record(10.0, data=8.0), record(30.0, data=2.0, compute=20.0)
    total = add_window(add_window(None, first), second)
    assert (total["steps"], total["seconds"], total["data_s"], total["other_s"]) == (8, 40.0, 10.0, 10.0)
    assert (total["data_pct"], total["compute_pct"]) == (25.0, 50.0)
    assert "peak_memory_gb" not in total


def test_tensorboard_scalars_are_fixed_tags():
    scalars = tensorboard_scalars(record(10.0, data=4.0))
    assert set(scalars) <= set(metrics.TAGS)
    assert scalars["time/data_pct"] == 40.0 and scalars["mem/peak_gb"] == 3.0 and len(scalars) == 6
    assert tensorboard_scalars(None) == {}


class Memory:
    def __init__(self):
        self.windows = 0

    def window_peak(self):
        self.windows += 1
        return self.windows * 2**30, "rss"


class Ticks:
    """A host clock that moves only when told to."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_each_phase_owns_the_time_up_to_the_next_mark_and_a_window_splits_the_phase_under_way():
    now = Ticks()
    timer = StepTimer(HostClock(now), Memory(), wall=now)
    timer.enter("data")  # before start: ignored
    now.t = 100.0
    timer.start(step=7)

    def spend(phase, seconds):
        timer.enter(phase)
        now.t += seconds

    spend("data", 2.0)
    spend("compute", 3.0)
    spend("optimizer", 1.0)
    spend(OTHER, 0.5)
    with timer.phase("checkpoint"):
        now.t += 0.25
        with timer.phase("logging"):
            now.t += 0.125
        now.t += 0.25  # back in checkpoint
    with timer.phase("logging"):
        now.t += 1.0
        window = timer.end_window(9, tokens_per_s=5.0, mfu=0.5)
        now.t += 4.0  # still logging, in the next window
    now.t += 8.0  # other
    second = timer.end_window(10, tokens_per_s=6.0, mfu=None)

    assert window["steps"] == 2 and window["seconds"] == pytest.approx(8.125)
    assert [window[f"{p}_s"] for p in PHASES] == pytest.approx([2.0, 3.0, 1.0, 0.5, 1.125])
    assert window["other_s"] == pytest.approx(0.5) and window["peak_memory_gb"] == 1.0
    assert (second["steps"], second["logging_s"], second["other_s"], second["mfu"]) == (1, 4.0, 8.0, None)
    assert second["peak_memory_gb"] == 2.0
    report = timer.report()
    assert report["step_time"] == second
    assert (report["step_time_total"]["steps"], report["step_time_total"]["logging_s"]) == (3, pytest.approx(5.125))
    assert report["step_time_total"]["seconds"] == pytest.approx(20.125)


class FakeGpu:
    """One CUDA stream for fake events: ``now`` moves as the test says; events complete in the order
    they were recorded, and an event's time may be read only once it, or one after it, was waited for."""

    def __init__(self):
        self.now, self.recorded, self.waited_upto, self.syncs, self.made = 0.0, 0, 0, 0, 0


class FakeEvent:
    def __init__(self, gpu):
        self.gpu, self.at, self.order = gpu, None, None
        gpu.made += 1

    def record(self):
        self.gpu.recorded += 1
        self.at, self.order = self.gpu.now, self.gpu.recorded

    def synchronize(self):
        self.gpu.syncs += 1
        self.gpu.waited_upto = max(self.gpu.waited_upto, self.order)

    def elapsed_time(self, end):
        if max(self.order, end.order) > self.gpu.waited_upto:
            raise RuntimeError("event not completed: read before a sync")
        return (end.at - self.at) * 1000.0  # milliseconds, as torch.cuda.Event has it


def test_cuda_events_are_read_after_one_sync_per_window_and_reused():
    gpu = FakeGpu()
    clock = CudaEventClock(lambda: FakeEvent(gpu))
    wall = Ticks()
    timer = StepTimer(clock, Memory(), wall=wall)
    timer.start(step=0)
    windows = []
    for window in range(3):
        for _ in range(5):
            for phase, seconds in (("data", 0.5), ("compute", 2.0), ("optimizer", 0.25), (OTHER, 0.25)):
                timer.enter(phase)
                gpu.now += seconds
                wall.t += seconds
            assert gpu.syncs == window  # no sync inside a window
        windows.append(timer.end_window(5 * (window + 1), tokens_per_s=1.0, mfu=None))
        assert gpu.syncs == window + 1
    for window in windows:
        assert (window["data_s"], window["compute_s"], window["optimizer_s"]) == (2.5, 10.0, 1.25)
        assert window["other_s"] == pytest.approx(1.25) and window["steps"] == 5
    # Events are handed back at each window's end: later windows make none.
    made_by_first = 1 + 5 * 4 + 1
    assert gpu.made == made_by_first


def test_the_clock_follows_the_device_and_a_disabled_timer_times_nothing():
    assert isinstance(clock_for("cuda"), CudaEventClock) and isinstance(clock_for("cpu"), HostClock)
    off = build_step_timer("cpu", Memory(), enabled=False)
    assert isinstance(off, NoStepTimer)
    off.start(0)
    off.enter("data")
    with off.phase("logging"):
        pass
    assert off.end_window(3, tokens_per_s=1.0, mfu=None) is None and off.report() == {}
    assert isinstance(build_step_timer("cpu", Memory(), enabled=True).clock, HostClock)


def test_peak_memory_on_cpu_is_the_process_peak_which_never_resets():
    memory = PeakMemory(torch.device("cpu"))
    first, source = memory.window_peak()
    assert source == "rss" and first > 2**20
    assert memory.window_peak()[0] >= first
    assert memory.trial_peak()["source"] == "VmHWM" and memory.trial_peak()["bytes"] >= first


def test_the_cpu_trial_peak_is_never_below_a_windows_though_vmhwm_reads_lower_later(monkeypatch):
    from hpcsweep.train.observe import memory_record

    # Linux folds the resident set into VmHWM only at some unmaps: a later reading can be lower.
    readings = iter([500 * 2**20, 400 * 2**20, 450 * 2**20])
    monkeypatch.setattr(memory_record, "resident_high_water", lambda: next(readings))
    memory = PeakMemory(torch.device("cpu"))
    assert memory.window_peak() == (500 * 2**20, "rss")
    assert memory.window_peak() == (400 * 2**20, "rss")
    assert memory.trial_peak() == {"bytes": 500 * 2**20, "source": "VmHWM"}


class FakeAllocator:
    """``torch.cuda``'s peak counter: allocations raise it, a reset brings it down to what is held now."""

    def __init__(self):
        self.held, self.peak = 0, 0

    def allocate(self, nbytes):
        self.held += nbytes
        self.peak = max(self.peak, self.held)

    def max_memory_allocated(self, device=None):
        return self.peak

    def reset_peak_memory_stats(self, device=None):
        self.peak = self.held


def test_cuda_windows_reset_the_allocator_peak_and_the_trial_keeps_the_largest(monkeypatch):
    fake = FakeAllocator()
    fake.allocate(5 * 2**30)  # before the trial: not its peak
    for name in ("max_memory_allocated", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    fake.held = 1 * 2**30
    memory = PeakMemory(torch.device("cuda"))
    fake.allocate(3 * 2**30)
    fake.held -= 3 * 2**30
    assert memory.window_peak() == (4 * 2**30, "cuda")
    fake.allocate(1 * 2**30)
    assert memory.window_peak() == (2 * 2**30, "cuda")  # this window's own peak
    assert memory.trial_peak() == {"bytes": 4 * 2**30, "source": "torch.cuda.max_memory_allocated"}


TRIAL = {
    "data.batch_size": 2, "data.seq_len": 16, "data.synthetic_tokens": 20_000, "trainer.device": "cpu",
    "trainer.max_steps": 6, "trainer.warmup_steps": 0, "trainer.log_every": 3, "trainer.eval_every": 6,
    "trainer.eval_batches": 1, "trainer.ckpt_every": 4,
}


@pytest.fixture(scope="module")
def trials(tmp_path_factory):
    """CPU trials: plain and untimed (6 steps, two log windows), and one of 3 steps reading its data 250 ms slow."""
    root = tmp_path_factory.mktemp("step_time")
    settings = {
        "plain": TRIAL,
        "slow": {**TRIAL, "data.read_delay_ms": 250, "trainer.max_steps": 3, "trainer.eval_every": 3, "trainer.ckpt_every": 0},
        "untimed": {**TRIAL, "trainer.step_timing": False},
    }
    dirs = {}
    for name, trial in settings.items():
        dirs[name] = make_trial_dir(root / name, trial)
        assert train.run_trial(dirs[name]) == 0
    return dirs


def scalars(trial_dir):
    return read_runs([run_event_files(trial_dir)])[0]


def test_a_cpu_trial_reports_its_last_window_and_run_total_in_metrics_and_tensorboard(trials):
    report = read_metrics(trials["plain"])
    window, total = report["step_time"], report["step_time_total"]
    assert window["steps"] == 3 and total["steps"] == 6
    assert sum(window[key] for key in PCT_KEYS) + 100 * window["other_s"] / window["seconds"] == pytest.approx(100.0)
    assert math.isclose(window["seconds"], sum(window[f"{p}_s"] for p in (*PHASES, OTHER)), rel_tol=1e-9)
    # The save of step 4 blocks in the last window, and the first window's log_train falls in it too.
    assert window["compute_s"] > 0 and window["optimizer_s"] > 0 and window["data_s"] > 0
    assert window["checkpoint_s"] > 0 and window["logging_s"] > 0
    assert window["tokens_per_s"] == report["tokens_per_s"] and window["mfu"] is None
    assert window["peak_memory_source"] == "rss" and window["peak_memory_gb"] * 2**30 <= report["memory_peak"]["bytes"]
    assert total["seconds"] >= window["seconds"] and total["compute_s"] > window["compute_s"]
    tb = scalars(trials["plain"])
    assert tb["time/data_pct"].steps == [3, 6] and tb["time/data_pct"].values[-1] == pytest.approx(window["data_pct"])
    assert {f"time/{p}_pct" for p in PHASES} | {"mem/peak_gb"} <= set(tb)


def test_a_trial_reading_its_data_slowly_spends_most_of_its_step_time_waiting_on_data(trials):
    slow, plain = read_metrics(trials["slow"]), read_metrics(trials["plain"])
    # 3 steps x 250 ms of reads in a window of a model that steps in tens of milliseconds, even on a loaded machine.
    assert slow["step_time"]["data_s"] >= 0.75 and slow["step_time"]["data_pct"] > 50
    assert slow["step_time_total"]["data_pct"] > 50 and plain["step_time_total"]["data_pct"] < 50
    assert scalars(trials["slow"])["time/data_pct"].values[0] > 50


def test_step_timing_off_records_no_breakdown(trials):
    report = read_metrics(trials["untimed"])
    assert "step_time" not in report and "step_time_total" not in report and report["status"] == "completed"
    assert not any(tag.startswith(("time/", "mem/")) for tag in scalars(trials["untimed"]))


def test_an_earlier_runs_total_is_carried_only_when_whole():
    total = add_window(None, record(10.0, data=2.0, compute=5.0))
    assert carried_total(total) == total
    assert carried_total({k: v for k, v in total.items() if k != "optimizer_s"}) is None  # a trial from before a key
    assert carried_total({**total, "steps": True}) is None and carried_total(None) is None and carried_total([]) is None


def test_a_resumed_trial_adds_its_windows_to_the_total_its_last_run_left(tmp_path, monkeypatch):
    trial = make_trial_dir(tmp_path / "t", {**TRIAL, "trainer.ckpt_every": 0})
    monkeypatch.setenv("HPCSWEEP_FAULT", "stop,step=3,rank=0")
    assert train.run_trial(trial) == train.EXIT_STOPPED
    first = read_metrics(trial)["step_time_total"]
    assert first["steps"] == 3
    monkeypatch.delenv("HPCSWEEP_FAULT")
    assert train.run_trial(trial) == train.EXIT_OK
    report = read_metrics(trial)
    total, last = report["step_time_total"], report["step_time"]
    assert (report["restarts"], last["steps"], total["steps"]) == (1, 3, 6)
    assert total["seconds"] == pytest.approx(first["seconds"] + last["seconds"])
    assert total["data_s"] == pytest.approx(first["data_s"] + last["data_s"])
    assert sum(total[key] for key in PCT_KEYS) + 100 * total["other_s"] / total["seconds"] == pytest.approx(100.0)
