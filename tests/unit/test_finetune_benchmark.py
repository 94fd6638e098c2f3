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
