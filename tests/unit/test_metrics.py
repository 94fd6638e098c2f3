"""MFU reference peaks: a pure function of the device name and precision; none on CPU or unknown GPUs."""

from __future__ import annotations

import pytest

from hpcsweep.results.table import mean_tokens_per_s
from hpcsweep.train.trackers.metrics import mfu, peak_flops


@pytest.mark.parametrize(
    ("name", "precision", "tf32", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", "bf16", False, 312e12),
        ("NVIDIA A100-SXM4-40GB", "fp16", False, 312e12),
        ("NVIDIA A100 80GB PCIe", "bf16", False, 312e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", False, 19.5e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", True, 156e12),
        ("NVIDIA H100 80GB HBM3", "bf16", False, 989e12),
        ("NVIDIA H100 80GB HBM3", "fp32", False, 67e12),
        ("NVIDIA H100 PCIe", "bf16", False, 756e12),
        ("NVIDIA H200", "bf16", False, 989e12),
        ("NVIDIA H200", "fp32", True, 494.5e12),
    ],
)
def test_known_gpu_peaks(name, precision, tf32, expected):
    assert peak_flops(name, precision, tf32) == expected


@pytest.mark.parametrize("name", [None, "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-32GB", "NVIDIA H100 NVL",
                                  "NVIDIA GH200 480GB", "NVIDIA A1000"])
def test_cpu_and_unknown_gpus_have_no_peak(name):
    assert peak_flops(name, "bf16") is None


def test_mfu_is_none_without_a_peak():
    assert mfu(1000.0, 6e6, 2, None) is None
    assert mfu(1000.0, 6e6, 2, 312e12) == pytest.approx(1000.0 * 6e6 / (2 * 312e12))


def test_mean_throughput_is_tokens_over_time_of_the_logged_windows():
    # Two windows of the same tokens: 1 s at 1000 tok/s and 10 s at 100 tok/s -> 2000 tokens / 11 s.
    assert mean_tokens_per_s([1000.0, 100.0]) == pytest.approx(2000 / 11)
    assert mean_tokens_per_s([250.0, 250.0, 250.0]) == pytest.approx(250.0)
    assert mean_tokens_per_s([0.0, float("nan"), float("inf"), 300.0]) == pytest.approx(300.0)
    assert mean_tokens_per_s([]) is None
