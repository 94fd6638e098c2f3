"""``benchmarks/finetune.py`` runs, tiny, on CPU: its alternating measurement and its closing line cannot rot."""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "finetune.py"


def test_the_tiny_shape_alternates_the_contenders_and_ends_with_both_ratios(tmp_path, monkeypatch, capsys):
    out = tmp_path / "result.json"
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as ``python benchmarks/finetune.py`` has it
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--shape", "tiny", "--steps", "3", "--workdir", str(tmp_path),
                                      "--json", str(out)])
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr()
    assert done.value.code == 0, printed.err[-3000:]
    last = printed.out.strip().splitlines()[-1]
    assert re.fullmatch(r"LoRA/full tokens/s \d+\.\d\d, training-state memory \d+\.\d\d", last), last
    row = json.loads(out.read_text())[0]
    for name in ("LoRA", "full", "LoRA, peft's fold"):
        assert len(row[name]["step_s"]) == 2  # 3 steps, the first left out
    lora, full = row["LoRA"]["memory"], row["full"]["memory"]
    assert lora["gradients"] == lora["parameters"] and full["gradients"] == full["parameters"]
    assert full["optimizer"] >= 2 * full["parameters"] and full["expert_lora_temporaries"] == 0
    assert lora["expert_lora_temporaries"] > 0
    assert full["parameters"] == row["parameters"] * 4  # every fp32 parameter trains


def load_script(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    return runpy.run_path(str(SCRIPT))


# The published models' expert counts and widths (their config.json), which the shrunk shapes keep.
PUBLISHED = {
    "moe64": dict(n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, n_group=1, topk_group=1,
                  hidden_size=2048, moe_intermediate_size=1408, intermediate_size=10944),  # DeepSeek-V2-Lite
    "moe256": dict(n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4,
                   hidden_size=7168, moe_intermediate_size=2048, intermediate_size=18432),  # DeepSeek-V3
}


@pytest.mark.parametrize("shape", list(PUBLISHED))
def test_the_real_expert_count_shapes_keep_counts_groups_and_width_ratios_and_change_only_sizes(shape, monkeypatch):
    from tests.model_folders import SIZE_KEYS

    overrides = load_script(monkeypatch)["SHAPES"][shape]
    published = PUBLISHED[shape]
    assert set(overrides) <= SIZE_KEYS  # make_model_folder keeps every other key at DeepseekV3Config's default
    for key in ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "n_group", "topk_group"):
        assert overrides[key] == published[key], key
    scale = overrides["hidden_size"] / published["hidden_size"]
    for key in ("moe_intermediate_size", "intermediate_size"):
        assert overrides[key] == published[key] * scale, key
    assert overrides["first_k_dense_replace"] >= 1 and overrides["num_hidden_layers"] > overrides["first_k_dense_replace"]


def test_the_experts_micro_benchmark_alternates_and_prints_each_ratio(monkeypatch, capsys):
    script = load_script(monkeypatch)
    shapes = script["EXPERT_SHAPES"]
    assert {s["n_routed_experts"] for s in shapes.values()} == {8, 64, 256}
    monkeypatch.setitem(script["measure_experts"].__globals__, "MICRO_TOKENS", 16)
    threads = torch.get_num_threads()
    try:
        row = script["measure_experts"]("64", 3, 4)
    finally:
        torch.set_num_threads(threads)
    for name in ("full", "LoRA", "LoRA, peft's fold"):
        assert len(row[name]["step_s"]) == 2  # 3 steps, the first left out
    script["report_experts"]([row])
    assert re.search(r"^\s+64\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\d+\.\d\d\s+\d+\.\d\d$", capsys.readouterr().out, re.M)
