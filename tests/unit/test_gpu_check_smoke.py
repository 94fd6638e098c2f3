"""``benchmarks/gpu_check.py --smoke`` runs its whole plan, tiny, on CPU: the GPU check cannot rot."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_gpu_check_smoke_passes_on_cpu(tmp_path, monkeypatch, capsys):
    torch.set_num_threads(1)
    out = tmp_path / "result.json"
    # The script as ``python benchmarks/gpu_check.py`` runs it, in this process (torch is imported once).
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--smoke", "--workdir", str(tmp_path / "work"), "--json", str(out)])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    printed = capsys.readouterr()
    assert done.value.code == 0, printed.err[-3000:]
    assert "FAIL" not in printed.err
    assert "exact stop and resume (deterministic=true, stop at 3 of 6): weights sha256 equal" in printed.out
    assert "fast path (deterministic=false)" in printed.out
    assert "memory small-fast: plan " in printed.out and "(CPU: the resident set counts the whole process" in printed.out
    assert "FSDP (tiny-x2, trainer.parallel=fsdp over one rank):" in printed.out
    assert "LoRA fine-tuning of a saved tiny folder" in printed.out
    assert "step time (fast path, last window of 3 steps" in printed.out and "(rss) OK" in printed.out
    assert "step time, slow data (data.read_delay_ms=100): SKIPPED on CPU: it proves the CUDA events" in printed.out
    assert "telemetry of the large trial: source cpu (the trial trains on CPU: no GPU to read)" in printed.out
    assert "NVML samples during a matmul loop: skipped: no GPU (--smoke)" in printed.out
    assert ("loss at the head (cpu, 96 tokens, vocabulary 500, chunk 32; trainer.loss_kernel=auto picks torch"
            in printed.out), printed.out
    result = json.loads(out.read_text())
    assert set(result["loss"]["rows"]) == {"logits", "torch"} and not result["loss"]["failed"]
    assert "profile of steps 2-3 (trainer.profile_steps, profile_memory): trace " in printed.out
    # On CPU: a trace of the two steps, no CUDA kernels in it and no CUDA memory snapshot.
    assert ({k: result["profile"][k] for k in ("steps", "kernels", "memory_snapshot_mb")}
            == {"steps": [2, 3], "kernels": 0, "memory_snapshot_mb": None})
    assert [row["size"] for row in result["sizes"]] == ["tiny", "tiny-x2"]
    assert all(row["tokens_per_s"] > 0 and row["save_s"] > 0 and row["resume_s"] > 0 for row in result["sizes"])
    assert result["exact_resume"]["straight"] == result["exact_resume"]["resumed"]
    assert result["fsdp"]["tokens_per_s"] > 0
    assert result["step_time"]["fast"]["peak_memory_source"] == "rss" and result["step_time"]["slow_data"] is None
    assert json.loads((tmp_path / "work" / "large-fsdp" / "metrics.json").read_text())["parallel"] == "fsdp"
    assert result["telemetry"]["trial"]["source"] == "cpu" and result["telemetry"]["trial"]["gpus"] == []
    lora = result["lora"]
    assert lora["tokens_per_s"] > 0 and (lora["mfu"], lora["peak_memory_gib"]) == (None, None)
    # It trained LoRA over the folder's architecture (the tokenizer's vocabulary, not the preset's 256).
    lora_trial = json.loads((tmp_path / "work" / "lora-fast" / "metrics.json").read_text())
    assert lora_trial["status"] == "completed"
    config = (tmp_path / "work" / "lora-fast" / "config.yaml").read_text()
    assert "peft: lora" in config and "vocab_size: 384" in config
    # What the fast path was: metrics.json of each trial says so.
    fast = json.loads((tmp_path / "work" / "small-fast" / "metrics.json").read_text())
    exact = json.loads((tmp_path / "work" / "small-deterministic" / "metrics.json").read_text())
    assert (fast["deterministic"], exact["deterministic"]) == (False, True)
    assert (fast["precision"], fast["attn_implementation"], fast["tf32"], fast["mfu"]) == ("fp32", "eager", False, None)
    # The memory plan as the trial ran (fp32, eager, one CPU worker) and the peak beside it.
    assert (fast["memory_plan"]["setup"]["precision"], fast["memory_plan"]["setup"]["fused_attention"]) == ("fp32", False)
    assert fast["memory_plan"]["verdict"] == "not compared" and fast["memory_peak"]["source"] == "VmHWM"
    # Every run's plan beside its peak, each trial by its dir (no slow-data trial on CPU).
    assert [row["size"] for row in result["memory"]] == [
        "small-deterministic", "small-deterministic-resumed", "small-fast", "large-fast", "large-fsdp", "lora-fast",
        "full-finetune", "small-profiled"]
    assert result["failed"] == []
    # Full fine-tuning of the LoRA check's MoE folder, beside LoRA's speed; both kept router statistics.
    full = result["full_finetune"]
    assert full["tokens_per_s"] > 0 and full["lora_speedup"] == pytest.approx(lora["tokens_per_s"] / full["tokens_per_s"])
    assert full["router"]["experts"] == 4 and lora["router"]["experts"] == 4
    assert "full fine-tuning of the same tiny folder: " in printed.out
    assert all(0 < row["plan_bytes"] < row["peak_bytes"] for row in result["memory"])


def test_gpu_check_fails_a_memory_plan_off_the_measured_peak():
    check = runpy.run_path(str(SCRIPT))
    size = check["Size"]("~125M", {}, {})
    def metrics(plan_gb, peak_gb):
        return {"memory_plan": {"tensors_bytes": plan_gb * 2**30, "total_bytes": (plan_gb + 2) * 2**30, "bytes": {}},
                "memory_peak": {"bytes": peak_gb * 2**30, "source": "torch.cuda.max_memory_allocated"}}
    gpu = check["GPU_PLAN"]
    (row,) = check["memory_plan_checks"](gpu, [(size, metrics(12, 10))])
    assert row["ratio"] == pytest.approx(1.2) and "x1.20 OK" in check["memory_lines"]([row])[0]
    for plan_gb in (9, 16):
        with pytest.raises(check["CheckFailed"], match=r"^~125M: memory plan .* the measured peak 10.00 GB"):
            check["memory_plan_checks"](gpu, [(size, metrics(plan_gb, 10))])


def test_gpu_check_fails_a_gpu_trial_whose_telemetry_has_no_utilisation():
    check = runpy.run_path(str(SCRIPT))
    gpu = {"index": 0, "util_pct": {"mean": 80.0, "p5": 10.0, "max": 100.0}, "reasons": {}, "lost": None}
    telemetry = {"source": "nvml", "reason": None, "gpus": [gpu, {**gpu, "index": 1, "util_pct": None,
                                                                   "reasons": {"util_pct": "NVML gave no value"}}]}
    with pytest.raises(check["CheckFailed"], match=r"^large: GPU utilisation is null .*\(1, 'NVML gave no value', None\)"):
        check["trial_telemetry_check"](check["GPU_PLAN"], "large", {"telemetry": telemetry})
    cpu = {"source": "cpu", "reason": "NVML did not start: x", "gpus": []}
    with pytest.raises(check["CheckFailed"], match=r"^large: telemetry source 'cpu' with 0 GPUs, not NVML: NVML did not"):
        check["trial_telemetry_check"](check["GPU_PLAN"], "large", {"telemetry": cpu})
    assert check["trial_telemetry_check"](check["GPU_PLAN"], "large", {"telemetry": {**telemetry, "gpus": [gpu]}})


def test_gpu_check_fails_loudly_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT)])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert done.value.code == 1
    assert capsys.readouterr().err.startswith("FAIL: no CUDA device visible")


def test_a_failed_part_of_the_gpu_check_is_named_and_the_rest_still_run(capsys):
    # One GPU run must show everything it can: a part that fails (a check, or any error) prints FAIL and is
    # listed, and the parts after it run and print.
    check = runpy.run_path(str(SCRIPT))
    sections = check["Sections"](0.0)

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access")

    def refused():
        raise check["CheckFailed"]("MFU 1.3 on 'NVIDIA H200'")

    assert sections.run("broken", broken) is None
    assert sections.run("refused", refused, lambda v: ["never printed"]) is None
    assert sections.run("fine", lambda: {"x": 1}, lambda v: [f"fine {v['x']} OK"]) == {"x": 1}
    printed = capsys.readouterr()
    assert sections.failed == ["broken", "refused"] and sections.result == {"fine": {"x": 1}}
    assert "FAIL broken: RuntimeError: CUDA error: an illegal memory access" in printed.err
    assert "FAIL refused: MFU 1.3 on 'NVIDIA H200'" in printed.err
    assert printed.out == "fine 1 OK\n"
