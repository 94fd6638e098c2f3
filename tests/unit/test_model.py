"""Models are built locally from the config groups, deterministically, with every parameter trained."""

from pathlib import Path

import pytest
import torch
import yaml

from hpcsweep.config import ModelConfig, build_group
from hpcsweep.train.trackers.metrics import weights_sha256
from hpcsweep.train.model import build_model, flops_per_token, hf_config

torch.set_num_threads(1)
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "model"


def group(name: str) -> ModelConfig:
    return build_group(ModelConfig, "model", yaml.safe_load((CONFIGS / f"{name}.yaml").read_text()) or {})


@pytest.mark.parametrize("name,cls", [("deepseek_tiny", "DeepseekV3ForCausalLM"), ("llama_small", "LlamaForCausalLM")])
def test_config_groups_build_offline_and_every_parameter_gets_a_gradient(monkeypatch, name, cls):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = group(name)
    model = build_model(cfg, seed=0)
    assert type(model).__name__ == cls
    inputs = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = model(input_ids=inputs).logits
    assert logits.shape == (2, 16, cfg.vocab_size)
    logits.float().logsumexp(-1).mean().backward()
    # DDP runs without find_unused_parameters: this is what makes that correct.
    assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0] == []


def test_deepseek_tiny_has_mla_and_moe():
    config = hf_config(group("deepseek_tiny"))
    model = build_model(group("deepseek_tiny"), seed=0)
    names = dict(model.named_parameters())
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in names  # MLA latent projection
    assert names["model.layers.1.mlp.experts.gate_up_proj"].shape[0] == config.n_routed_experts
    assert "model.layers.0.mlp.gate_proj.weight" in names  # first_k_dense_replace=1: dense first layer


def test_same_seed_same_weights_and_forward_is_deterministic():
    cfg = group("deepseek_tiny")
    a, b = build_model(cfg, seed=3), build_model(cfg, seed=3)
    assert weights_sha256(a.state_dict()) == weights_sha256(b.state_dict())
    assert weights_sha256(a.state_dict()) != weights_sha256(build_model(cfg, seed=4).state_dict())
    inputs = torch.randint(0, cfg.vocab_size, (4, 32), generator=torch.Generator().manual_seed(1))
    assert torch.equal(a(input_ids=inputs).logits, b(input_ids=inputs).logits)


def test_flops_per_token_counts_active_experts_and_attention():
    dense = ModelConfig(arch="llama", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=4)
    params = sum(p.numel() for n, p in build_model(dense, 0).named_parameters() if "embed_tokens" not in n)
    assert flops_per_token(hf_config(dense), seq_len=32) == 6 * params + 6 * 2 * 4 * (16 + 16) * 32

    moe = group("deepseek_tiny")
    more_experts = ModelConfig(**{**moe.__dict__, "n_routed_experts": 8})
    # Doubling the routed experts doubles the expert parameters but not the active ones: only
    # the router (experts x hidden, in the one MoE layer) grows.
    router_growth = 6 * (8 - 4) * moe.hidden_size * (moe.num_layers - moe.first_k_dense_replace)
    assert flops_per_token(hf_config(more_experts), 64) == flops_per_token(hf_config(moe), 64) + router_growth
    assert flops_per_token(hf_config(moe), 128) > flops_per_token(hf_config(moe), 64)
