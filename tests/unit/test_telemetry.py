"""Per-trial telemetry: the NVML sampler over a fake NVML (several GPUs, one that vanishes, GPM
missing), the summary statistics, the CPU fallback, the sampling thread, and a trial on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pynvml
import pytest
import torch
import yaml

from hpcsweep.config import trial_config_from_dict
from hpcsweep.results.event_reader import read_runs
from hpcsweep.telemetry import summary
from hpcsweep.telemetry.cpu_sampler import ProcessTreeSampler, cpu_percent, parse_stat, parse_statm_rss_pages, process_tree
from hpcsweep.telemetry.node_sampler import NodeSampler
from hpcsweep.telemetry.nvml_sampler import NvmlSampler
from hpcsweep.telemetry.sampler_thread import SamplerThread
from hpcsweep.telemetry.trial_telemetry import (
    TrialTelemetry,
    load_pynvml,
    node_workers,
    nvml_uuid,
    open_gpus,
    trial_summary,
    window_scalars,
)
from hpcsweep.train.distributed import init_distributed
from hpcsweep.train.trainer import Trainer

from .fake_nvml import PYNVML_NAMES, FakeGpu, FakeNvml, NVMLError_NoPermission, NVMLError_NotSupported
from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)


def wait_until(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class Ticks:
    """A clock for the node sampler: 0 at its start, then +10 s a call."""

    def __init__(self) -> None:
        self.now = -10.0

    def __call__(self) -> float:
        self.now += 10.0
        return self.now


def node_over(nvml: FakeNvml, uuids: list[str]) -> NodeSampler:
    return NodeSampler("node-a", NvmlSampler.open(nvml, uuids), None, ProcessTreeSampler([os.getpid()]), clock=Ticks())


def test_the_fake_nvml_spells_the_names_of_the_real_pynvml():
    missing = [name for name in PYNVML_NAMES if not hasattr(pynvml, name)]
    assert missing == [] and len(PYNVML_NAMES) >= 18
    for name in ("NVMLError_NotSupported", "NVMLError_GpuIsLost", "NVMLError_NoPermission"):
        assert issubclass(getattr(pynvml, name), pynvml.NVMLError)
    assert (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL) == (
        FakeNvml.NVML_GPM_METRIC_SM_UTIL, FakeNvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL)


def test_every_gpu_is_sampled_and_one_that_vanishes_is_marked_lost_while_the_others_go_on():
    good, no_gpm, vanishing = FakeGpu("GPU-a"), FakeGpu("GPU-b", gpm=False, util=10), FakeGpu("GPU-c", power_mw=300_000)
    nvml = FakeNvml([good, no_gpm, vanishing])
    node = node_over(nvml, ["GPU-a", "GPU-b", "GPU-c", "GPU-missing"])
    node.sample()                       # t=10
    good.util, good.power_mw = 50, 700_000
    node.sample()                       # t=20
    first = node.payload()
    vanishing.lost = True
    good.util, good.power_mw = 70, 300_000
    node.sample()                       # t=30
    second = node.payload()
    node.close()

    a, b, c, missing = second["gpus"]
    assert (second["source"], second["samples"], second["node"]) == ("nvml", 3, "node-a")
    assert (a["name"], a["uuid"], a["mem_total_gb"]) == ("NVIDIA H200", "GPU-a", 141.0)
    assert a["util_pct"] == {"mean": 70.0, "p5": pytest.approx(52.0), "max": 90.0}
    assert a["mem_used_gb"] == {"mean": 40.0, "p5": 40.0, "max": 40.0}
    assert a["power_w"] == {"mean": 500.0, "p5": pytest.approx(320.0), "max": 700.0}
    assert a["sm_clock_mhz"]["mean"] == 1980.0 and a["sm_active_pct"]["mean"] == 70.0
    assert a["tensor_active_pct"] == {"mean": 40.0, "p5": 40.0, "max": 40.0}
    # Each sample stands for the 10 s before it: 500 + 700 + 300 W over 10 s each.
    assert a["energy_j"] == pytest.approx(15_000.0) and a["gpu_hours"] == pytest.approx(30 / 3600, abs=1e-6)
    assert (a["lost"], a["reasons"]) == (None, {})
    # GPM missing: null with the reason; the rest of that GPU is read.
    assert b["util_pct"]["mean"] == 10.0 and b["sm_active_pct"] is None and b["tensor_active_pct"] is None
    assert b["reasons"]["sm_active_pct"].startswith("GPM is not supported on this GPU")
    # The vanished GPU keeps what it read before, and says why it stopped.
    assert c["lost"] == "NVMLError_GpuIsLost: GPU is lost"
    assert c["util_pct"]["max"] == 90.0 and c["energy_j"] == pytest.approx(6_000.0)
    assert c["gpu_hours"] == pytest.approx(20 / 3600, abs=1e-6)
    assert missing["lost"] == "could not be opened: NVMLError_NotFound: Not Found" and missing["util_pct"] is None
    assert missing["reasons"]["util_pct"].startswith("the GPU was lost before its first sample")
    # The windows: the means of the samples since the previous window; a lost GPU has none.
    assert first["window"]["gpus"][0]["util_pct"] == 70.0 and first["window"]["gpus"][2]["power_w"] == 300.0
    assert second["window"]["gpus"][0]["util_pct"] == 70.0 and second["window"]["gpus"][2] is None
    assert second["window"]["cpu"]["rss_gb"] > 0
    assert nvml.live_gpm_samples == set() and (nvml.inits, nvml.shutdowns) == (1, 1)


def test_unsupported_power_and_gpm_are_null_with_their_reasons_and_a_refused_gpm_stops_only_gpm():
    old_driver = FakeGpu("GPU-old", gpm=NVMLError_NotSupported, power_error=NVMLError_NotSupported)
    restricted = FakeGpu("GPU-r", gpm_metrics_error=None)
    nvml = FakeNvml([old_driver, restricted])
    node = node_over(nvml, ["GPU-old", "GPU-r"])
    node.sample()
    restricted.gpm_metrics_error = NVMLError_NoPermission  # profiling counters taken away mid-run
    node.sample()
    old, r = node.payload()["gpus"]
    node.close()
    assert old["power_w"] is None and old["energy_j"] is None and old["util_pct"]["mean"] == 90.0
    assert old["reasons"]["power_w"] == "not supported on this GPU (NVMLError_NotSupported: Not Supported)"
    assert old["reasons"]["energy_j"] == old["reasons"]["power_w"]
    assert old["reasons"]["sm_active_pct"] == "GPM is not available: NVMLError_NotSupported: Not Supported"
    assert r["lost"] is None and r["util_pct"]["max"] == 90.0
    assert r["sm_active_pct"] == {"mean": 70.0, "p5": 70.0, "max": 70.0}  # the first interval's
    assert r["reasons"] == {}  # it has GPM values; the stop shows from now on, in the sampler's state
    assert node.gpus.gpus[1].unsupported["sm_active_pct"] == "GPM stopped: NVMLError_NoPermission: Insufficient Permissions"
    assert nvml.live_gpm_samples == set()


def test_summary_statistics():
    assert summary.stats([]) is None and summary.stats([None, float("nan")]) is None
    values = [3.0, None, 1.0, 2.0, 10.0]
    got = summary.stats(values)
    assert got == {"mean": 4.0, "p5": pytest.approx(float(np.percentile([3, 1, 2, 10], 5)), abs=1e-3), "max": 10.0}
    assert got["p5"] == pytest.approx(1.15)
    assert summary.stats([1 / 3]) == {"mean": 0.333, "p5": 0.333, "max": 0.333}
    assert list(summary.sample_intervals(100.0, [110.0, 115.0, 130.0])) == [10.0, 5.0, 15.0]
    assert summary.energy_j(100.0, [110.0, 115.0, 130.0], [100.0, 200.0, 300.0]) == 1000 + 1000 + 4500
    assert summary.energy_j(100.0, [110.0, 120.0], [100.0, None]) is None
    assert summary.energy_j(100.0, [], []) is None
    assert summary.gpu_hours(100.0, [3700.0]) == 1.0 and summary.gpu_hours(100.0, []) == 0.0
    assert summary.max_stats([None, {"mean": 1, "p5": 5, "max": 2}, {"mean": 3, "p5": 0, "max": 1}]) == {
        "mean": 3, "p5": 5, "max": 2}
    assert summary.max_stats([None]) is None


def test_where_nvml_is_absent_the_reason_says_why():
    # This machine has no libnvidia-ml: the real pynvml says so.
    assert open_gpus(load_pynvml, ["GPU-0"]) == (
        None, "NVML did not start: NVMLError_LibraryNotFound: NVML Shared Library Not Found")
    assert open_gpus(load_pynvml, []) == (None, "the trial trains on CPU: no GPU to read")

    def no_binding():
        raise ImportError("No module named 'pynvml'")

    assert open_gpus(no_binding, ["GPU-0"]) == (None, "nvidia-ml-py cannot be imported: No module named 'pynvml'")
    assert nvml_uuid("58af9a5f-0c4d-1e2b-9a4c-7d11f2a0b3c4") == "GPU-58af9a5f-0c4d-1e2b-9a4c-7d11f2a0b3c4"
    assert nvml_uuid("MIG-58af9a5f") == "MIG-58af9a5f"


def test_the_cpu_sampler_reads_the_process_tree_from_proc():
    stat = parse_stat("4242 (python (worker) 1) S 4200 4242 1 0 -1 4194304 10 0 0 0 150 25 0 0 20 0 3 0 99 0 0")
    assert (stat.pid, stat.ppid, stat.cpu_ticks) == (4242, 4200, 175)
    assert parse_statm_rss_pages("5000 1234 300 1 0 900 0") == 1234
    assert process_tree([1, 99], {1: 0, 2: 1, 3: 2, 4: 0, 5: 3}) == {1, 2, 3, 5}
    # 150 ticks of 100/s over 2 s of 1 CPU is 75%; a pid gone or reused counts nothing.
    assert cpu_percent({1: 100, 2: 50}, {1: 200, 2: 10, 3: 50}, 2.0, 100, 1) == 75.0

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        sampler = ProcessTreeSampler([os.getpid()])
        assert sampler.read(time.monotonic()).util_pct is None  # no interval yet
        start = time.monotonic()
        while time.monotonic() - start < 0.2:  # some CPU time to measure
            sum(range(1000))
        reading = sampler.read(time.monotonic())
        assert child.pid in sampler.last[1] and os.getpid() in sampler.last[1]
        assert reading.util_pct > 0 and reading.rss_gb > 0.05
    finally:
        child.communicate(b"")


def write_proc(proc: Path, processes: dict[int, tuple[int, int, int]]) -> None:
    """A fake ``/proc`` with ``{pid: (ppid, cpu ticks, resident pages)}``."""
    for pid, (ppid, ticks, pages) in processes.items():
        (proc / str(pid)).mkdir(exist_ok=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (w) S {ppid} 0 0 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0 9 0 0\n")
        (proc / str(pid) / "statm").write_text(f"9000 {pages} 0 0 0 0 0\n")


def test_the_known_tree_is_read_between_scans_and_a_reused_pid_is_not_counted(tmp_path):
    write_proc(tmp_path, {1: (0, 0, 1), 10: (1, 100, 1000), 11: (10, 50, 500), 12: (1, 999, 9999)})
    (tmp_path / "self").mkdir()  # not a pid
    sampler = ProcessTreeSampler([10], proc=tmp_path, rescan_s=60.0)
    first = sampler.read(0.0)
    assert sampler.tree == {10, 11} and first.util_pct is None
    assert first.rss_gb == pytest.approx(1500 * sampler.page_size / 2**30)
    # 11 ends and its pid is reused by a stranger; 13, a new child, waits for the next scan.
    write_proc(tmp_path, {10: (1, 100 + sampler.ticks_per_s, 1000), 11: (1, 0, 7777), 13: (10, 0, 100)})
    second = sampler.read(1.0)
    assert second.util_pct == pytest.approx(100.0 / sampler.cpus)
    assert second.rss_gb == pytest.approx(1000 * sampler.page_size / 2**30)
    assert sampler.read(61.0).rss_gb == pytest.approx(1100 * sampler.page_size / 2**30) and 13 in sampler.tree


def test_the_sampler_thread_samples_until_stopped_and_a_failing_sample_never_raises():
    rounds = []
    thread = SamplerThread(lambda: rounds.append(time.monotonic()), interval_s=0.01)
    thread.start()
    wait_until(lambda: len(rounds) >= 3, "three samples")
    thread.stop()
    assert not thread.running and thread.error is None
    after = len(rounds)
    thread.stop()  # twice is fine
    assert len(rounds) == after

    def broken():
        raise RuntimeError("driver went away")

    failing = SamplerThread(broken, interval_s=0.01)
    failing.start()
    wait_until(lambda: not failing.running, "the failing thread to end")
    assert failing.error == "RuntimeError: driver went away"


def payload(node: str, gpus: list[dict | None], cpu: dict | None, samples: int = 4, reason: str | None = None) -> dict:
    gpu_entries = [{"node": node, "name": "NVIDIA H200", "util_pct": {"mean": 50.0, "p5": 1.0, "max": 90.0}}
                   for _ in gpus]
    return {"node": node, "source": "nvml" if gpus else "cpu", "reason": reason, "samples": samples,
            "gpus": gpu_entries,
            "cpu": {"util_pct": cpu and {"mean": cpu["util_pct"], "p5": 0.0, "max": cpu["util_pct"]},
                    "rss_gb": cpu and {"mean": cpu["rss_gb"], "p5": 1.0, "max": cpu["rss_gb"]}},
            "window": {"gpus": gpus, "cpu": cpu}}


def test_rank_zero_numbers_gpus_across_nodes_and_keeps_the_largest_cpu():
    window = {"util_pct": 80.0, "mem_used_gb": 30.0, "power_w": 400.0, "sm_clock_mhz": 1900.0}
    parts = [payload("n1", [window, None], {"util_pct": 20.0, "rss_gb": 3.0}), None,
             payload("n2", [dict(window, util_pct=40.0)], {"util_pct": 60.0, "rss_gb": 2.0}, samples=3), None]
    scalars = window_scalars(parts)
    assert scalars["sys/gpu0/util"] == 80.0 and scalars["sys/gpu0/mem_gb"] == 30.0
    assert scalars["sys/gpu0/power_w"] == 400.0 and scalars["sys/gpu0/sm_clock_mhz"] == 1900.0
    assert scalars["sys/gpu1/util"] is None and scalars["sys/gpu2/util"] == 40.0
    assert (scalars["sys/cpu/util"], scalars["sys/cpu/rss_gb"]) == (60.0, 3.0)

    trial = trial_summary(parts, 10.0)
    assert [(g["index"], g["node"]) for g in trial["gpus"]] == [(0, "n1"), (1, "n1"), (2, "n2")]
    assert (trial["source"], trial["reason"], trial["interval_s"], trial["samples"]) == ("nvml", None, 10.0, 3)
    assert trial["cpu"]["util_pct"] == {"mean": 60.0, "p5": 0.0, "max": 60.0}
    cpu_only = trial_summary([payload("n1", [], None, reason="the trial trains on CPU: no GPU to read")], 1.0)
    assert (cpu_only["source"], cpu_only["reason"], cpu_only["gpus"]) == ("cpu", "the trial trains on CPU: no GPU to read", [])
    assert cpu_only["cpu"] == {"util_pct": None, "rss_gb": None}
    mixed = trial_summary([parts[0], payload("n3", [], None, reason="NVML did not start: x")], 1.0)
    assert (mixed["source"], mixed["reason"]) == ("nvml", "n3: NVML did not start: x")


def test_each_agent_samples_its_own_workers_and_zero_disables_telemetry():
    ranks = [{"rank": r, "local_rank": r % 2, "node": "host", "pid": 100 + r} for r in range(4)]
    assert [w["rank"] for w in node_workers(ranks, 2)] == [2, 3]  # two agents on one host stay apart
    assert [w["rank"] for w in node_workers(ranks, 0)] == [0, 1]
    gathered = []
    off = TrialTelemetry.start(0, device_type="cuda", ranks=ranks, rank=0, gather=gathered.append, is_writer=True)
    off.log_window(10, logger=None)
    assert (off.report_fields(), gathered, off.thread) == ({}, [], None)


def test_a_trial_on_cpu_reports_cpu_telemetry_in_metrics_json_and_tensorboard(tmp_path):
    trial = make_trial_dir(tmp_path / "t", {
        "data.batch_size": 2, "data.seq_len": 16, "data.synthetic_tokens": 5_000, "trainer.device": "cpu",
        "trainer.max_steps": 4, "trainer.warmup_steps": 0, "trainer.log_every": 2, "trainer.eval_every": 4,
        "trainer.eval_batches": 1, "trainer.ckpt_every": 0, "trainer.keep_top_k": 0, "trainer.telemetry_every_s": 0.05,
    })
    cfg = trial_config_from_dict(yaml.safe_load((trial / "config.yaml").read_text()))

    def busy_until_sampled(trainer: Trainer, step: int) -> None:
        # The hook works instead of sleeping: a sleeping trainer would rightly read as 0 % CPU.
        def sampled_while_busy() -> bool:
            sum(i * i for i in range(20_000))
            cpu = trainer.telemetry.node.summary()["cpu"]["util_pct"]
            return trainer.telemetry.node.rounds >= 2 and cpu is not None and cpu["max"] > 0
        if step == 1:
            wait_until(sampled_while_busy, "two telemetry samples, one of them while the trainer works")

    trainer = Trainer(cfg, init_distributed("cpu", 60, env={}), trial, hooks=[busy_until_sampled])
    try:
        assert trainer.fit() == 0
    finally:
        trainer.close()
    assert not trainer.telemetry.thread.running and threading.active_count() >= 1

    telemetry = read_metrics(trial)["telemetry"]
    assert (telemetry["source"], telemetry["reason"]) == ("cpu", "the trial trains on CPU: no GPU to read")
    assert telemetry["gpus"] == [] and telemetry["interval_s"] == 0.05 and telemetry["samples"] >= 2
    assert 0 < telemetry["cpu"]["util_pct"]["max"] and telemetry["cpu"]["rss_gb"]["p5"] > 0.05
    (run,) = read_runs([sorted((trial / "tb").rglob("events.out.tfevents.*"))])
    assert 2 in run["sys/cpu/util"].steps and set(run["sys/cpu/util"].steps) <= {2, 4}
    assert run["sys/cpu/rss_gb"].values[0] > 0.05
    assert not any(tag.startswith("sys/gpu") for tag in run)


def test_telemetry_every_s_is_checked():
    with pytest.raises(ValueError, match=r"^trainer.telemetry_every_s=-1.0 is not allowed: seconds >= 0 \(0 disables"):
        trial_config_from_dict({"trainer": {"telemetry_every_s": -1}})
    assert trial_config_from_dict({}).trainer.telemetry_every_s == 10.0
