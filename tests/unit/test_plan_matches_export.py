"""Issue #30: a LoRA trial's planned trainable parameters (metrics.json ``memory_plan.parameters.trainable``)
are the parameters of the adapter that ``python -m hpcsweep.export`` writes for it, on a MoE DeepSeek-V3
folder (whose routed experts get adapters, and whose checkpoint also holds the router's
``e_score_correction_bias``) and on a dense Llama folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hpcsweep.export import cli
from hpcsweep.files.sweep_record import SweepRecord, TrialRecord, now_iso, write_sweep_record
from hpcsweep.train import worker
from tests.model_folders import TINY_DEEPSEEK, make_model_folder

from .trial_dirs import make_trial_dir, read_metrics

torch.set_num_threads(1)

TRIAL = {
    "model.peft": "lora", "model.lora.r": 2, "data.batch_size": 2, "data.seq_len": 16,
    "data.synthetic_tokens": 4_000, "trainer.device": "cpu", "trainer.max_steps": 2, "trainer.warmup_steps": 0,
    "trainer.eval_every": 2, "trainer.eval_batches": 1, "trainer.log_every": 2, "trainer.ckpt_every": 2,
}


def llama_folder(folder: Path) -> Path:
    """A tiny dense Llama, as ``save_pretrained`` writes one."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )).save_pretrained(folder)
    return folder


def adapter_tensors(adapter: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(adapter / "adapter_model.safetensors", framework="pt") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}


@pytest.mark.parametrize("arch", ["deepseek_v3_moe", "llama"])
def test_the_planned_trainable_parameters_are_the_exported_adapters(tmp_path, arch):
    if arch == "llama":
        folder = llama_folder(tmp_path / "model")
    else:
        folder = make_model_folder(tmp_path / "model", tokenizer=False)
    sweep = tmp_path / "sweep"
    trial = make_trial_dir(sweep / "0", {**TRIAL, "model.path": str(folder)})
    assert worker.run_trial(trial) == worker.EXIT_OK
    write_sweep_record(SweepRecord(str(sweep), "local", now_iso(), [TrialRecord(0, ["model.peft=lora"], str(trial), None, now_iso())]))
    assert cli.main([str(sweep), "--trial", "0", "--checkpoint", "last", "--out", str(tmp_path / "adapter")]) == 0

    tensors = adapter_tensors(tmp_path / "adapter")
    exported = sum(torch.Size(shape).numel() for shape in tensors.values())
    plan = read_metrics(trial)["memory_plan"]
    assert plan["setup"]["peft"] == "lora"
    assert plan["parameters"]["trainable"] == exported > 0, sorted(tensors.items())
    # Only adapters are written: no base weight, no router buffer.
    assert all("lora_A" in name or "lora_B" in name for name in tensors), sorted(tensors)
    if arch == "deepseek_v3_moe":
        # The routed experts' adapters are in it: a lora_A and a lora_B for each fused expert parameter
        # (gate_up_proj: hidden -> 2 x moe_intermediate, down_proj: moe_intermediate -> hidden), rank r per
        # expert, so r x experts x (in + out) each.
        experts = {name: shape for name, shape in tensors.items() if ".mlp.experts." in name}
        assert len(experts) == 4, sorted(tensors)
        r, count = TRIAL["model.lora.r"], TINY_DEEPSEEK["n_routed_experts"]
        hidden, inner = TINY_DEEPSEEK["hidden_size"], TINY_DEEPSEEK["moe_intermediate_size"]
        assert sum(torch.Size(shape).numel() for shape in experts.values()) == r * count * (
            (hidden + 2 * inner) + (inner + hidden))
        # The checkpoint holds the router's bias beside the adapters; the export (and the plan) do not.
        assert not any("e_score_correction_bias" in name for name in tensors)
