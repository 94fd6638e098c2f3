"""``benchmarks/loss_chunk.py --quick`` runs, tiny, on CPU: a line per chunk, each with its ratio to the default."""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "loss_chunk.py"


def test_the_quick_run_prints_a_line_per_chunk_with_its_ratio_to_the_cpu_default(tmp_path, monkeypatch, capsys):
    out = tmp_path / "result.json"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--quick", "--json", str(out)])
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("toy: vocabulary 500, hidden 16, 512 tokens, fp32, one thread, 1 measured rounds; "
                               "ratio to chunk 256 (trainer.loss_chunk_tokens=null on CPU)"), lines
    rows = {}
    for line in lines[2:]:
        found = re.fullmatch(r"\s+(\S+(?: \(whole\)| \(\d+\))?)\s+(\d+\.\d{3})\s+(\d+\.\d\d)x\s+(\d+\.\d)\s+(\d+\.\d)  "
                             r"\d+\.\d{3}", line)
        assert found, line
        rows[found[1]] = {"ratio": float(found[3]), "logits_mb": float(found[4]), "plan_mb": float(found[5])}
    assert list(rows) == ["64", "256", "whole (512)"]
    assert rows["256"]["ratio"] == 1.00  # the default against itself
    assert rows["64"]["logits_mb"] == round(4 * 64 * 500 / 1e6, 1) and rows["whole (512)"]["plan_mb"] == 3.1
    result = json.loads(out.read_text())["shapes"][0]
    assert result["default"] == 256 and sorted(result["rows"]) == ["0", "256", "64"]
    assert all(len(row["seconds"]) == 1 for row in result["rows"].values())  # 2 rounds, the first left out
