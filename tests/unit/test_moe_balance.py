"""Router balance (hpcsweep.train.moe.load_balance): the losses as each family's authors define them, DeepSeek-V3's
bias update, the statistics, and tiny DeepSeek-V2/V3 MoEs pulled back from a router biased toward one expert."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hpcsweep.config import ModelConfig, MoeConfig, trial_config_from_dict
from hpcsweep.train import lora
from hpcsweep.train.moe import load_balance, router_stats
from hpcsweep.train.distributed import WorldInfo

from ..moe_models import skew_router, tiny_moe

torch.set_num_threads(1)

ONE = WorldInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend=None)


def batch(generator: torch.Generator, rows: int = 8, seq: int = 32) -> torch.Tensor:
    return torch.randint(0, 64, (rows, seq), generator=generator)


def forward_loss(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), inputs[:, 1:].flatten())


def train(model, balance, steps: int, *, lr: float = 1e-3, window: int = 20) -> list[dict]:
    """``steps`` AdamW steps as the trainer takes them; the router statistics of each ``window`` steps."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(1)
    model.train()
    reports = []
    for step in range(1, steps + 1):
        (forward_loss(model, batch(generator)) + balance.take_aux_loss()).backward()
        balance.after_optimizer_step(ONE)
        optimizer.step()
        optimizer.zero_grad()
        if step % window == 0:
            reports.append(balance.window_report(ONE))
    return reports


# ----- the acceptance: balance on at least halves max/mean load ------------------------------------------


@pytest.mark.parametrize("kind, moe", [
    # DeepSeek-V2: its sequence-wise aux loss, at 10x the folder's aux_loss_alpha (0.001) for a 100-step test.
    ("v2", MoeConfig(aux_loss_coef=0.01, bias_update_rate=0.0)),
    # DeepSeek-V3: the bias update at its default rate (the paper's 0.001), no aux loss.
    ("v3", MoeConfig(aux_loss_coef=0.0)),
])
def test_balance_halves_the_max_mean_load_of_a_router_biased_toward_one_expert(kind, moe, capsys):
    last = {}
    for on in (False, True):
        model = tiny_moe(kind)
        skew_router(model, kind)
        settings = moe if on else MoeConfig(aux_loss_coef=0.0, bias_update_rate=0.0)
        reports = train(model, load_balance.attach(model, ModelConfig(moe=settings)), steps=100)
        last[on] = reports[-1]["max_mean_load"]  # over steps 81-100
        assert reports[0]["max_mean_load"] > 4.0  # both start collapsed onto expert 0 (16 experts, top-2: ceiling 8)
    with capsys.disabled():
        print(f"\n{kind}: max/mean load over steps 81-100, balance off {last[False]:.2f}, on {last[True]:.2f}")
    assert last[True] <= 0.5 * last[False]


# ----- the losses ---------------------------------------------------------------------------------------


def deepseek_moegate_aux_loss(logits, chosen, *, sequences: int, top_k: int, seq_aux: bool) -> torch.Tensor:
    """DeepSeek-V2's ``MoEGate.forward`` loss (modeling_deepseek.py, alpha left out), transcribed."""
    n_routed_experts = logits.shape[-1]
    scores = logits.softmax(dim=-1)
    bsz = sequences
    seq_len = logits.shape[0] // bsz
    topk_idx_for_aux_loss = chosen.view(bsz, -1)
    if seq_aux:
        scores_for_seq_aux = scores.view(bsz, seq_len, -1)
        ce = torch.zeros(bsz, n_routed_experts)
        ce.scatter_add_(1, topk_idx_for_aux_loss, torch.ones(bsz, seq_len * top_k)).div_(
            seq_len * top_k / n_routed_experts)
        return (ce * scores_for_seq_aux.mean(dim=1)).sum(dim=1).mean()
    mask_ce = F.one_hot(topk_idx_for_aux_loss.view(-1), num_classes=n_routed_experts)
    ce = mask_ce.float().mean(0)
    return (scores.mean(0) * ce * n_routed_experts).sum()


@pytest.mark.parametrize("seq_aux", [True, False])
def test_deepseek_v2_loss_is_deepseeks_moegate_loss_summed_over_layers(seq_aux):
    model = tiny_moe("v2", num_hidden_layers=3, seq_aux=seq_aux)
    balance = load_balance.attach(model, ModelConfig(moe=MoeConfig(aux_loss_coef=0.5)))
    model.train()
    model(input_ids=batch(torch.Generator().manual_seed(0), rows=3, seq=8))
    expected = sum(deepseek_moegate_aux_loss(r.logits, r.chosen, sequences=3, top_k=2, seq_aux=seq_aux)
                   for r in balance.routers)
    layers = [deepseek_moegate_aux_loss(r.logits, r.chosen, sequences=3, top_k=2, seq_aux=seq_aux).item()
              for r in balance.routers]
    assert [r.layer for r in balance.routers] == [1, 2]
    torch.testing.assert_close(balance.take_aux_loss(), 0.5 * expected, rtol=1e-6, atol=0)
    # The window's record: each layer's own loss (one forward: its value), and their sum overall.
    report = balance.window_report(ONE)
    assert [report["layers"][str(n)]["aux_loss"] for n in (1, 2)] == pytest.approx(layers, rel=1e-6)
    assert report["aux_loss"] == pytest.approx(sum(layers), rel=1e-6)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_switch_family_loss_equals_the_models_own_aux_loss(kind):
    model = tiny_moe(kind)
    balance = load_balance.attach(model, ModelConfig(moe=MoeConfig()))
    assert balance.aux_loss_coef == model.config.router_aux_loss_coef == 0.001  # null: the folder's own
    model.train()
    out = model(input_ids=batch(torch.Generator().manual_seed(0), rows=2, seq=8), output_router_logits=True)
    torch.testing.assert_close(balance.take_aux_loss(), 0.001 * out.aux_loss, rtol=1e-6, atol=0)
    # Each layer's own: the same function of that layer's router logits alone.
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    layers = balance.window_report(ONE)["layers"]
    own = [load_balancing_loss_func((logits,), model.config.num_experts if kind == "qwen2_moe" else
                                    model.config.num_local_experts, model.config.num_experts_per_tok).item()
           for logits in out.router_logits]
    assert [layers[key]["aux_loss"] for key in sorted(layers, key=int)] == pytest.approx(own, rel=1e-6)


def test_the_coefficient_is_the_folders_own_unless_set_and_zero_switches_it_off():
    v2, v3 = tiny_moe("v2"), tiny_moe("v3")
    assert load_balance.effective_aux_loss_coef(ModelConfig(), v2.config) == 0.001  # aux_loss_alpha
    assert load_balance.effective_aux_loss_coef(ModelConfig(), v3.config) == 0.0  # V3 balances by its bias
    # A DeepSeek-V3 config.json with aux_loss_alpha (the released one has 0.001) adds its sequence-wise loss.
    assert load_balance.effective_aux_loss_coef(ModelConfig(), tiny_moe("v3", aux_loss_alpha=0.001).config) == 0.001
    assert load_balance.effective_aux_loss_coef(ModelConfig(moe=MoeConfig(aux_loss_coef=0.02)), v3.config) == 0.02
    balance = load_balance.attach(v2, ModelConfig(moe=MoeConfig(aux_loss_coef=0.0)))
    v2.train()
    v2(input_ids=batch(torch.Generator().manual_seed(0), rows=2, seq=8))
    assert balance.take_aux_loss() == 0.0
    assert balance.window_report(ONE)["aux_loss"] > 0  # still measured, not trained


def test_a_dense_model_has_nothing_to_balance():
    from transformers import LlamaConfig, LlamaForCausalLM

    dense = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    balance = load_balance.attach(dense, ModelConfig(arch="llama"))
    assert isinstance(balance, load_balance.NoBalance)
    assert (balance.take_aux_loss(), balance.window_report(ONE)) == (0.0, {})


def test_evaluation_forwards_are_not_counted():
    model = tiny_moe("v3")
    balance = load_balance.attach(model, ModelConfig())
    model.eval()
    with torch.no_grad():
        model(input_ids=batch(torch.Generator().manual_seed(0)))
    assert balance.take_aux_loss() == 0.0
    assert balance.window_counts.sum() == 0


# ----- DeepSeek-V3's bias -------------------------------------------------------------------------------


def test_the_v3_bias_moves_by_the_rate_toward_the_mean_load_each_step():
    model = tiny_moe("v3")
    skew_router(model, "v3")
    balance = load_balance.attach(model, ModelConfig(moe=MoeConfig(bias_update_rate=0.001)))
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias
    before = bias.clone()
    model.train()
    forward_loss(model, batch(torch.Generator().manual_seed(0))).backward()
    balance.take_aux_loss()
    load = balance.step_counts[0].float()
    balance.after_optimizer_step(ONE)
    expected = 0.001 * torch.sign(load.mean() - load)
    assert torch.equal(bias, before + expected)
    # Each expert moves by the rate, up when under the mean load, down when over it (0 exactly at it).
    moved = (bias - before).abs()
    assert ((moved - 0.001).abs() < 1e-7).logical_or(moved == 0).all()
    assert (bias - before)[0] < 0 and (load > load.mean()).sum() > 0 and (load < load.mean()).sum() > 0
    assert balance.step_counts.sum() == 0  # a fresh step


def test_under_lora_the_v3_bias_stays_and_the_aux_loss_reaches_the_adapters():
    cfg = trial_config_from_dict({"model": {"peft": "lora", "lora": {"r": 4}, "moe": {"aux_loss_coef": 1.0}}}).model
    model = lora.apply_lora(tiny_moe("v3"), cfg, seed=0)
    balance = load_balance.attach(model, cfg)
    assert balance.bias_update_rate == 0.0
    model.train()
    inputs = batch(torch.Generator().manual_seed(0))
    forward_loss(model, inputs).backward()
    balance.take_aux_loss()
    without = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    (forward_loss(model, inputs) + balance.take_aux_loss()).backward()
    changed = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p.grad, without[n])]
    assert any("layers.1.self_attn" in n for n in changed)  # the adapters before the router feel the loss
    bias_key = "base_model.model.model.layers.1.mlp.gate.e_score_correction_bias"
    assert bias_key in dict(model.named_buffers())
    from hpcsweep.train.checkpoint.trained_state import trained_state_dict
    assert any(k.endswith("mlp.gate.e_score_correction_bias") for k in trained_state_dict(model))


# ----- statistics and config ----------------------------------------------------------------------------


def test_window_statistics_per_layer_and_overall():
    stats = router_stats.window_stats({1: [30, 10, 0, 0], 3: [10, 10, 10, 10]}, top_k=2, aux_loss=1.5,
                                      aux_loss_coef=0.001, bias_update_rate=0.0, layer_aux_loss={1: 0.9, 3: 0.6})
    assert stats["layers"] == {
        "1": {"max_mean_load": 3.0, "idle_fraction": 0.5, "tokens": 40, "loads": [30, 10, 0, 0], "aux_loss": 0.9},
        "3": {"max_mean_load": 1.0, "idle_fraction": 0.0, "tokens": 40, "loads": [10, 10, 10, 10], "aux_loss": 0.6}}
    assert (stats["max_mean_load"], stats["idle_fraction"], stats["experts"]) == (3.0, 0.25, 4)
    assert router_stats.tensorboard_scalars(stats) == {
        "moe/max_mean_load": 3.0, "moe/idle_fraction": 0.25, "moe/aux_loss": 1.5,
        "moe/layer1/max_mean_load": 3.0, "moe/layer1/idle_fraction": 0.5, "moe/layer1/aux_loss": 0.9,
        "moe/layer3/max_mean_load": 1.0, "moe/layer3/idle_fraction": 0.0, "moe/layer3/aux_loss": 0.6}


@pytest.mark.parametrize("key, value", [("aux_loss_coef", -0.1), ("bias_update_rate", -0.001),
                                        ("bias_update_rate", float("nan"))])
def test_negative_balance_settings_are_refused_naming_the_key(key, value):
    with pytest.raises(ValueError, match=rf"^model\.moe\.{key}=.* is not allowed"):
        trial_config_from_dict({"model": {"moe": {key: value}}})


# The trainer's spelling (hpcsweep.train.trainer), which transformers 5 calls deprecated.
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning")
def test_gradient_checkpointing_recomputes_forwards_without_counting_them_twice():
    counts = {}
    for checkpointing in (False, True):
        model = tiny_moe("v3")
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        balance = load_balance.attach(model, ModelConfig(moe=MoeConfig(aux_loss_coef=0.1, bias_update_rate=0.0)))
        reports = train(model, balance, steps=2, window=2)
        counts[checkpointing] = reports[0]
    assert counts[True] == counts[False]
    assert counts[True]["layers"]["1"]["tokens"] == 2 * 8 * 32 * 2
