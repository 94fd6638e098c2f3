"""report --efficiency: the facts from metrics.json, the outlier rule, the table, the Markdown section, the heat map."""

from __future__ import annotations

import numpy as np
import pytest

from hpcsweep import report
from hpcsweep.results.efficiency import (
    GpuClock,
    TrialEfficiency,
    efficiency_of,
    find_outliers,
    step_shares,
)
from hpcsweep.results.event_reader import ScalarSeries
from hpcsweep.results.heatmap import heatmap_path, time_unit, utilisation_grid
from hpcsweep.train.moe import router_stats

from .sweep_fixtures import make_sweep, metrics


def stats(mean: float) -> dict[str, float]:
    return {"mean": mean, "p5": mean * 0.9, "max": mean * 1.1}


def gpu(index: int, node: str, util: float, clock: float = 1410.0, total: float = 80.0) -> dict:
    """One GPU of metrics.json's ``telemetry.gpus``, as the contract has it."""
    return {"index": index, "node": node, "name": "NVIDIA A100-SXM4-80GB", "util_pct": stats(util),
            "mem_used_gb": stats(40.0), "mem_total_gb": total, "power_w": stats(300.0),
            "sm_clock_mhz": stats(clock), "sm_active_pct": None, "tensor_active_pct": None,
            "energy_j": 1000.0, "gpu_hours": 0.5}


def seconds_record(data: float, compute: float, optimizer: float = 1.0, checkpoint: float = 0.0,
                   logging: float = 0.0, other: float = 0.0) -> dict:
    total = data + compute + optimizer + checkpoint + logging + other
    return {"steps": 100, "seconds": total, "data_s": data, "compute_s": compute, "optimizer_s": optimizer,
            "checkpoint_s": checkpoint, "logging_s": logging, "other_s": other}


def gpu_metrics(*, mfu: float, util: float, data_s: float, compute_s: float = 90.0, clock: float = 1410.0,
                peak_gb: float = 40.0, node: str = "gpu01", **extra) -> dict:
    """A metrics.json of a 2-GPU trial with telemetry, a last window and a whole-run breakdown."""
    window = {**seconds_record(data_s / 10, compute_s / 10), "data_pct": 0.0, "compute_pct": 0.0,
              "tokens_per_s": 50_000.0, "mfu": mfu, "peak_memory_gb": peak_gb, "peak_memory_source": "cuda"}
    return metrics(
        "completed", world_size=2, mfu=None,
        telemetry={"source": "nvml", "reason": None, "interval_s": 10.0, "samples": 30,
                   "gpus": [gpu(0, node, util, clock), gpu(1, node, util, clock)],
                   "cpu": {"util_pct": stats(12.0), "rss_gb": stats(3.0)}},
        step_time=window, step_time_total=seconds_record(data_s, compute_s), **extra,
    )


# ----- what metrics.json says -------------------------------------------------------------------


def test_efficiency_of_reads_the_contract_blocks():
    facts = efficiency_of(gpu_metrics(mfu=0.41, util=93.0, data_s=9.0, compute_s=90.0, peak_gb=61.5), 80_000.0)
    assert facts.on_gpu and facts.mfu == 0.41
    assert facts.tokens_per_device == 40_000.0  # the whole-run tokens/s over the 2 workers
    assert facts.gpu_util_pct == 93.0 and facts.cpu_util_pct == 12.0
    # The whole run's seconds decide data %, not the last window's (zeroed) shares.
    assert facts.data_pct == pytest.approx(9.0)
    assert facts.step_shares["compute"] == pytest.approx(90.0) and facts.step_shares["optimizer"] == pytest.approx(1.0)
    assert (facts.peak_memory_gb, facts.memory_total_gb) == (61.5, 80.0)
    assert facts.headroom_pct == pytest.approx(100 * (1 - 61.5 / 80))
    assert facts.clocks == (GpuClock(0, "gpu01", 1410.0), GpuClock(1, "gpu01", 1410.0))


def test_an_old_trial_has_none_of_the_new_keys_and_every_fact_is_none():
    old = metrics("completed", memory_peak={"bytes": 2**30, "source": "ru_maxrss"})
    facts = efficiency_of(old, 1000.0)
    assert not facts.on_gpu and facts.mfu is None and facts.gpu_util_pct is None and facts.data_pct is None
    assert facts.tokens_per_device == 500.0 and facts.peak_memory_gb == 1.0
    assert facts.memory_total_gb is None and facts.headroom_pct is None and facts.clocks == ()
    assert efficiency_of(None, None) == TrialEfficiency()
    # Nulls and junk where numbers belong (a trial killed mid-write of a block, a CPU run's nulls).
    broken = {"telemetry": {"source": "cpu", "reason": "no NVML", "gpus": [], "cpu": None},
              "step_time": {"data_s": None, "data_pct": "x", "mfu": None}, "step_time_total": None, "world_size": 0}
    assert efficiency_of(broken, 100.0) == TrialEfficiency()


def test_step_shares_come_from_the_seconds_else_from_the_percentages():
    assert step_shares(seconds_record(data=30, compute=60, optimizer=10)) == pytest.approx(
        {"data": 30, "compute": 60, "optimizer": 10, "checkpoint": 0, "logging": 0, "other": 0})
    window = {"data_pct": 40.0, "compute_pct": 50.0, "optimizer_pct": 5.0, "checkpoint_pct": 0.0, "logging_pct": 1.0}
    assert step_shares(window)["other"] == pytest.approx(4.0)
    assert step_shares({**seconds_record(0, 0, 0), "seconds": 0.0}) == {}  # no time in it: nothing
    assert step_shares({"compute_pct": 50.0}) == {}


def test_a_plan_gpu_stands_in_for_the_telemetry_gpu_memory():
    plan = metrics("completed", memory_plan={"gpu_memory_bytes": 80 * 2**30},
                   memory_peak={"bytes": 78 * 2**30, "source": "torch.cuda.max_memory_allocated"})
    facts = efficiency_of(plan, None)
    assert facts.on_gpu and facts.memory_total_gb == 80.0 and facts.headroom_pct == pytest.approx(2.5)


# ----- the outlier rule -------------------------------------------------------------------------


def trial(mfu=0.41, util=92.0, data=5.0, compute=90.0, clock=1410.0, node="gpu01", peak=40.0, **shares):
    parts = {"data": data, "compute": compute, "optimizer": 5.0,
             "checkpoint": 0.0, "logging": 0.0, "other": 0.0, **shares}
    return TrialEfficiency(on_gpu=True, mfu=mfu, tokens_per_device=40_000.0 * mfu, gpu_util_pct=util,
                           data_pct=data, step_shares=parts, peak_memory_gb=peak, memory_total_gb=80.0,
                           clocks=(GpuClock(0, node, clock), GpuClock(1, node, clock)))


def test_a_trial_waiting_on_data_is_flagged_with_the_cause_in_words():
    trials = {0: trial(), 1: trial(data=3.0), 2: trial(mfu=0.43), 37: trial(mfu=0.09, util=85.0, data=40.0)}
    found = find_outliers(trials)
    assert found.measure == "MFU"
    assert [(o.num, o.kinds) for o in found.outliers] == [(37, ("throughput", "data"))]
    assert found.outliers[0].text == (
        "#37: MFU 0.09 (sweep median 0.41): 40% of step time waits on data (sweep median 5%)")
    assert found.lines() == ["outliers against the sweep's median; throughput compared by MFU (4 trials measured)",
                             found.outliers[0].text]


def test_data_waiting_alone_needs_more_than_twice_the_median_and_20_percent():
    calm = {0: trial(data=10.0), 1: trial(data=10.0), 2: trial(data=19.0)}
    assert find_outliers(calm).outliers == []  # 19% is not above the 20% floor
    busy = {0: trial(data=15.0), 1: trial(data=15.0), 2: trial(data=15.0), 3: trial(data=29.0), 4: trial(data=31.0)}
    assert [o.num for o in find_outliers(busy).outliers] == [4]  # above 2 x 15, not 29
    assert find_outliers(busy).outliers[0].text == "#4: 31% of step time waits on data (sweep median 15%)"


def test_low_gpu_utilisation_is_flagged_with_the_part_of_the_step_that_stands_out():
    trials = {0: trial(), 1: trial(), 2: trial(), 3: trial(util=30.0, compute=55.0, checkpoint=35.0)}
    outlier, = find_outliers(trials).outliers
    assert outlier.kinds == ("util",)
    assert outlier.text == "#3: GPU util 30% (sweep median 92%): 35% of step time blocks on checkpoints"


def test_a_slow_trial_with_no_part_standing_out_says_the_step_itself_is_slow():
    trials = {0: trial(), 1: trial(), 2: trial(), 3: trial(mfu=0.1)}
    outlier, = find_outliers(trials).outliers
    assert outlier.text.startswith("#3: MFU 0.1 (sweep median 0.41): no part of the step stands out")


def test_a_node_at_half_clock_is_named():
    trials = {0: trial(), 1: trial(), 2: trial(), 3: trial(mfu=0.2, clock=705.0, node="gpu07")}
    outlier, = find_outliers(trials).outliers
    assert outlier.kinds == ("throughput", "clock")
    assert outlier.text == ("#3: MFU 0.2 (sweep median 0.41): SM clock 705 MHz on 2 GPUs of gpu07 "
                            "(sweep median 1410 MHz): a slow node")
    # 20% under the median is within the boost clocks' spread: not flagged.
    assert find_outliers({**trials, 3: trial(clock=1150.0)}).outliers == []


def test_memory_headroom_under_5_percent_is_flagged_against_the_gpu():
    trials = {0: trial(), 1: trial(peak=75.0), 2: trial(peak=79.0)}
    outlier, = find_outliers(trials).outliers
    assert (outlier.num, outlier.kinds) == (2, ("memory",))
    assert outlier.text == "#2: peak memory 79.0 of 80.0 GB (1.2% headroom): close to running out of memory"


def test_fewer_than_three_trials_measured_flags_nothing_against_the_median_and_says_so():
    found = find_outliers({0: trial(), 1: trial(mfu=0.01, util=1.0, data=90.0)})
    assert found.measure is None and found.outliers == []
    assert found.lines() == ["no outliers against the sweep's median: 2 trial(s) with a throughput measured "
                             "(at least 3 are needed)", "no efficiency outliers"]
    # Trials that measured nothing do not count towards the three.
    assert find_outliers({0: trial(), 1: trial(), 2: TrialEfficiency(), 3: TrialEfficiency()}).measure is None


def test_without_mfu_the_rule_compares_tokens_per_worker_and_says_so():
    cpu = {num: TrialEfficiency(tokens_per_device=rate) for num, rate in enumerate([1000.0, 1100.0, 900.0, 300.0])}
    found = find_outliers(cpu)
    assert found.measure == "tokens/s per worker"
    assert found.notes == ["outliers against the sweep's median; throughput compared by tokens/s per worker "
                           "(4 trials measured): too few trials have an MFU (null off GPU)"]
    assert [o.text for o in found.outliers] == ["#3: tokens/s per worker 300 (sweep median 950): "
                                                "no step-time breakdown recorded"]
    on_gpu = {num: TrialEfficiency(on_gpu=True, tokens_per_device=t.tokens_per_device) for num, t in cpu.items()}
    assert find_outliers(on_gpu).measure == "tokens/s per GPU"


# ----- the report -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def efficiency_sweep(tmp_path_factory):
    """Four trials with the new keys (one waiting on data), one old trial without them; heat-map events."""
    from torch.utils.tensorboard import SummaryWriter

    sweep_dir = tmp_path_factory.mktemp("efficiency")
    make_sweep(sweep_dir, [
        (["data.batch_size=4"], gpu_metrics(mfu=0.41, util=93.0, data_s=4.0)),
        (["data.batch_size=8"], gpu_metrics(mfu=0.42, util=95.0, data_s=5.0)),
        (["data.batch_size=16"], gpu_metrics(mfu=0.41, util=93.0, data_s=6.0)),
        (["data.batch_size=2"], gpu_metrics(mfu=0.09, util=40.0, data_s=60.0, compute_s=40.0)),
        (["data.batch_size=1"], metrics("completed")),
    ])
    start = 1_700_000_000.0
    for num in range(4):
        writer = SummaryWriter(str(sweep_dir / str(num) / "tb"))
        for i in range(40):
            writer.add_scalar("train/loss", 3.0, i, walltime=start + 10 * i)
            for index in range(2):
                util = 95.0 if num < 3 else (5.0 if i % 4 else 90.0)
                writer.add_scalar(f"sys/gpu{index}/util", util - 10 * index, i, walltime=start + 10 * i + 1)
        writer.close()
    writer = SummaryWriter(str(sweep_dir / "4" / "tb"))  # a CPU trial: only its CPU sampled
    for i in range(20):
        writer.add_scalar("sys/cpu/util", 50.0 + i, i, walltime=start + 5 * i)
    writer.close()
    return sweep_dir


def test_efficiency_table_and_outliers(efficiency_sweep, capsys):
    assert report.main([str(efficiency_sweep), "--efficiency"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # Trial 4 ran on CPU (an RSS peak): tokens/s is per GPU for some rows, per worker for it.
    # The swept parameter follows the trial's number, as in the results table.
    assert lines[0].split() == ["#", "data.batch_size", "status", "MFU", "tok/s/GPU|worker", "GPU-util%", "data%",
                                "GB(peak/GPU)", "GPU-h", "load(max/mean)"]
    rows = {line.split()[0]: line.split() for line in lines[1:6]}
    assert rows["0"] == ["0", "4", "completed", "0.410", "500", "93", "4.2", "40.0/80.0", "-", "-"]
    assert rows["3"][3:7] == ["0.090", "500", "40", "59.4"]
    assert rows["4"] == ["4", "1", "completed", "-", "500", "-", "-", "-", "-", "-"]  # an old trial: nothing new
    assert lines[6].startswith("GPU-hours:")
    assert lines[7] == "outliers against the sweep's median; throughput compared by MFU (4 trials measured)"
    assert lines[8] == ("#3: MFU 0.09 (sweep median 0.41), GPU util 40% (sweep median 93%): "
                        "59% of step time waits on data (sweep median 6%)")
    assert len(lines) == 9


def test_markdown_ends_with_the_efficiency_section(efficiency_sweep, capsys):
    assert report.main([str(efficiency_sweep), "--markdown"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("| # | data.batch_size | status |")  # the results table first
    section = text[text.index("## Efficiency"):].splitlines()
    assert section[2] == ("| # | data.batch_size | status | MFU | tok/s/GPU\\|worker | GPU-util% | data% | GB(peak/GPU) "
                          "| GPU-h | load(max/mean) |")
    assert "| 3 | 2 | completed | 0.090 | 500 | 40 | 59.4 | 40.0/80.0 | - | - |" in section
    assert section[-1].startswith("- #3: MFU 0.09 (sweep median 0.41)")
    assert report.main([str(efficiency_sweep), "--markdown", "--efficiency"]) == 0
    assert capsys.readouterr().out.startswith("## Efficiency\n")


def test_heatmap_cells_are_the_mean_over_gpus_binned_by_time_since_start():
    start = 100.0
    gpus = {f"sys/gpu{i}/util": ScalarSeries([0, 1, 2], [start + 1, start + 11, start + 21],
                                             [80.0 + 10 * i, 60.0 + 10 * i, 40.0 + 10 * i]) for i in range(2)}
    scalars = {
        2: {"train/loss": ScalarSeries([0], [start], [3.0]), **gpus},
        5: {"sys/cpu/util": ScalarSeries(list(range(7)), [10.0 * i for i in range(7)],
                                         [10.0 * (i + 1) for i in range(7)])},
        7: {"train/loss": ScalarSeries([0], [start], [3.0])},  # nothing sampled: no row
    }
    # 60 s in 4 columns of 15 s (1.5 sampling intervals of 10 s); trial 2 ended after 21 s.
    grid = utilisation_grid(scalars, bins=4)
    assert grid.nums == [2, 5] and grid.sources == ["gpu", "cpu"] and grid.span_s == 60.0
    np.testing.assert_allclose(grid.cells, [[75.0, 45.0, np.nan, np.nan], [15.0, 30.0, 45.0, 65.0]])
    # Sampled every 100 s, 60 columns would be mostly blank: columns widen to 150 s.
    sparse = utilisation_grid({5: {"sys/cpu/util": ScalarSeries([0, 1, 2], [0.0, 100.0, 200.0], [1.0, 2.0, 3.0])}})
    assert sparse.cells.shape == (1, 2) and sparse.span_s == 300.0
    np.testing.assert_allclose(sparse.cells, [[1.5, 3.0]])
    assert utilisation_grid({7: scalars[7]}) is None
    assert time_unit(300) == ("s", 1.0) and time_unit(3600) == ("min", 60.0) and time_unit(86_400) == ("h", 3600.0)


def test_report_plot_writes_the_heatmap_beside_the_plot(efficiency_sweep, tmp_path, capsys):
    import matplotlib.image

    plot = tmp_path / "sweep.png"
    assert report.main([str(efficiency_sweep), "--plot", str(plot)]) == 0
    heatmap = heatmap_path(plot)
    assert heatmap == tmp_path / "sweep-heatmap.png"
    assert f"utilisation heat map: {heatmap}" in capsys.readouterr().err
    pixels = matplotlib.image.imread(heatmap)
    rows = 5  # figsize (10, 1.6 + 0.28 a row) at 100 dpi
    assert pixels.shape[:2] == (int(100 * (1.6 + 0.28 * rows)), 1000)
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)
    assert len(colours) > 50  # not blank: the cells, the labels, the colour bar

    empty = tmp_path / "empty"
    make_sweep(empty, [(["model.lr=1e-3"], metrics("completed"))])
    assert report.main([str(empty), "--plot", str(tmp_path / "old.png")]) == 0
    assert "heat map" not in capsys.readouterr().err  # the results plot alone: no word of a heat map
    assert report.main([str(empty), "--efficiency", "--plot", str(tmp_path / "old.png")]) == 0
    assert "no utilisation heat map" in capsys.readouterr().err
    assert not (tmp_path / "old-heatmap.png").exists()


# ----- MoE routing ----------------------------------------------------------------------------------


# issue 38: a LoRA trial of an 8-expert top-2 DeepSeek-V3 folder routed one layer's tokens so, and the
# old rule (max/mean >= 4.0, or half the experts idle over every layer) said nothing at max/mean 3.99.
COLLAPSED = [0, 0, 1, 0, 2047, 0, 2047, 1]
BASE = [374, 546, 260, 329, 398, 452, 1212, 525]
"""The same layer in the base model."""


def router(*layers: list[int], top_k: int = 2) -> dict:
    """metrics.json's ``router`` of a window whose MoE layers 1, 2, ... got these tokens per expert."""
    return router_stats.window_stats(dict(enumerate(layers, start=1)), top_k=top_k, aux_loss=1.2,
                                     aux_loss_coef=0.0, bias_update_rate=0.0)


def without_loads(record: dict) -> dict:
    """``record`` as a trial from before the per-layer ``loads`` wrote it."""
    layers = {n: {k: v for k, v in layer.items() if k != "loads"} for n, layer in record["layers"].items()}
    return {**record, "layers": layers}


def overall_only(max_mean_load: float, idle_fraction: float) -> dict:
    """A record with no per-layer figures: its overall figures stand for one layer."""
    return {"max_mean_load": max_mean_load, "idle_fraction": idle_fraction, "experts": 8, "top_k": 2, "layers": {}}


ISSUE_38 = ("routing collapsed: layer 2: 6 of 8 experts got under 10% of the mean load, the most loaded expert "
            "got 4.00x the mean (ceiling 4)")


@pytest.mark.parametrize("record, flagged", [
    (router(BASE, COLLAPSED, BASE), ISSUE_38),
    (router(BASE, BASE, BASE), None),
    # Starving, not idle: 4 of 8 under a tenth of the mean, though each got tokens and max/mean is 1.95.
    (router([40, 40, 40, 40, 1000, 1000, 1000, 936]), "routing collapsed: layer 1: 4 of 8 experts got under "
                                                      "10% of the mean load"),
    (router([60, 60, 60, 800, 800, 800, 800, 716]), None),  # 3 of 8 starve: uneven, not collapsed
    # One expert chosen by 90% of the tokens (8 experts, top-2: max/mean 3.6 of a ceiling of 4), none starved.
    (router([1844, 300, 300, 300, 300, 300, 300, 452]), "routing collapsed: layer 1: the most loaded expert got "
                                                         "3.60x the mean (ceiling 4)"),
    (router([1800, 300, 300, 300, 300, 300, 300, 496]), None),
    # 4 experts, top-2 (the built-in model): a total collapse idles 2, half.
    (router([1024, 1024, 0, 0]), "routing collapsed: layer 1: 2 of 4 experts got under 10% of the mean load, "
                                 "the most loaded expert got 2.00x the mean (ceiling 2)"),
    # 4 experts, top-3: a total collapse idles 1; a busy expert is no sign (each token picks 3 of 4).
    (router([1024, 1024, 1024, 0], top_k=3), "routing collapsed: layer 1: 1 of 4 experts got under 10% of "
                                             "the mean load"),
    (router([1024, 1024, 700, 324], top_k=3), None),
    # Records from before the per-layer loads: an idle expert starves.
    (without_loads(router(BASE, [0, 0, 0, 0, 0, 0, 2048, 2048])), "routing collapsed: layer 2: 6 of 8 experts "
                                                                  "got under 10% of the mean load, the most loaded "
                                                                  "expert got 4.00x the mean (ceiling 4)"),
    (without_loads(router(BASE, COLLAPSED)), "routing collapsed: layer 2: 4 of 8 experts got under 10% of the "
                                             "mean load, the most loaded expert got 4.00x the mean (ceiling 4)"),
    (overall_only(4.0, 0.0), "routing collapsed: the most loaded expert got 4.00x the mean (ceiling 4)"),
    (overall_only(2.0, 0.5), "routing collapsed: 4 of 8 experts got under 10% of the mean load"),
    (overall_only(3.5, 0.25), None),
    (None, None),
])
def test_a_collapsed_router_is_flagged_on_the_trial_alone(record, flagged):
    extra = {} if record is None else {"router": record}
    trials = {n: efficiency_of(gpu_metrics(mfu=0.4, util=90.0, data_s=5.0), 1000.0) for n in range(3)}
    trials[3] = efficiency_of(gpu_metrics(mfu=0.4, util=90.0, data_s=5.0, **extra), 1000.0)
    found = find_outliers(trials).outliers
    if flagged is None:
        assert found == []
    else:
        assert [(o.num, o.kinds) for o in found] == [(3, ("routing",))]
        assert found[0].text.startswith(f"#3: {flagged}")


@pytest.mark.parametrize(("preference", "flagged"), [
    ({"logps_chosen_first": -150.0, "logps_chosen": -170.0},
     "logps/chosen -170.0, -13% from -150.0 at its first log window: the chosen answers are pushed down too"),
    ({"logps_chosen_first": -150.0, "logps_chosen": -160.0}, None),  # 7%: within the rule
    ({"logps_chosen_first": -150.0, "logps_chosen": -120.0}, None),  # rose
    ({"logps_chosen": -170.0}, None),  # a record without its first window
    (None, None),  # not a DPO trial
])
def test_a_dpo_trial_whose_chosen_answers_fall_is_flagged_on_the_trial_alone(preference, flagged):
    extra = {} if preference is None else {"preference": preference}
    trials = {n: efficiency_of(gpu_metrics(mfu=0.4, util=90.0, data_s=5.0), 1000.0) for n in range(3)}
    trials[3] = efficiency_of(gpu_metrics(mfu=0.4, util=90.0, data_s=5.0, **extra), 1000.0)
    found = find_outliers(trials).outliers
    if flagged is None:
        assert found == []
    else:
        assert [(o.num, o.kinds) for o in found] == [(3, ("logps",))]
        assert found[0].text.startswith(f"#3: {flagged}")
