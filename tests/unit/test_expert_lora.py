"""Expert LoRA (``hpcsweep.train.expert_lora``): peft's adapters on fused routed experts, run per expert beside
the frozen weight. Same outputs and gradients as peft's own ``ParamWrapper`` forward, no fold, no expert weight
gradient, peft's format on disk, dropout."""

import json

import peft
import pytest
import torch
from peft.tuners.lora import LoraLayer, ParamWrapper
from torch.utils._python_dispatch import TorchDispatchMode

from hpcsweep.config import trial_config_from_dict
from hpcsweep.model import lora_targets
from hpcsweep.train import expert_lora, lora, model

from tests.model_folders import TINY_DEEPSEEK

torch.set_num_threads(1)

VOCAB = 96
TINY_QWEN_MOE = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32,
    decoder_sparse_step=1, mlp_only_layers=[0], tie_word_embeddings=False,
)
"""A Qwen2-MoE with a dense first layer, then routed experts beside a shared expert (whose linears peft's
transformers-5 conversion would move onto the experts, as for DeepSeek)."""


def base_model(arch: str, seed: int = 0) -> torch.nn.Module:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(seed)
    if arch == "deepseek_v3":
        return DeepseekV3ForCausalLM(DeepseekV3Config(vocab_size=VOCAB, **TINY_DEEPSEEK)).eval()
    return Qwen2MoeForCausalLM(Qwen2MoeConfig(vocab_size=VOCAB, **TINY_QWEN_MOE)).eval()


def model_cfg(**lora_settings):
    return trial_config_from_dict({"model": {"peft": "lora", "lora": {"r": 4, **lora_settings}}}).model


def with_random_adapters(net: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """``lora_B`` starts at zero; every adapter drawn instead, so that every gradient is non-zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return net


def lora_net(arch: str, **lora_settings) -> torch.nn.Module:
    return with_random_adapters(lora.apply_lora(base_model(arch), model_cfg(**lora_settings), seed=0))


def batch(seed: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(seed))


def forward_backward(net: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    net.zero_grad(set_to_none=True)
    logits = net(input_ids=ids).logits
    logits.square().mean().backward()
    return logits.detach(), {n: p.grad for n, p in net.named_parameters() if p.requires_grad}


def as_peft_forward(net: torch.nn.Module) -> None:
    """Give the wrappers back peft's own forward (its fold of ``W + s·B·A``)."""
    for module in net.modules():
        if isinstance(module, expert_lora.GroupedLoraParamWrapper):
            module.__class__ = ParamWrapper


def expert_wrappers(net: torch.nn.Module) -> list[ParamWrapper]:
    return [m for m in net.modules() if isinstance(m, ParamWrapper) and m.num_experts > 1]


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen2_moe"])
def test_forward_and_adapter_gradients_equal_peft_own_forward(arch):
    net = lora_net(arch)
    assert len(expert_wrappers(net)) == 2  # gate_up_proj and down_proj of the one MoE layer
    grouped_logits, grouped_grads = forward_backward(net, batch())
    as_peft_forward(net)
    peft_logits, peft_grads = forward_backward(net, batch())
    torch.testing.assert_close(grouped_logits, peft_logits, rtol=0, atol=1e-5)
    assert grouped_grads.keys() == peft_grads.keys()
    for name, grad in peft_grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grouped_grads[name], grad, rtol=0, atol=1e-5, msg=name)


class OutputShapes(TorchDispatchMode):
    """Records the shape of every tensor any operation creates, forward and backward."""

    def __init__(self):
        super().__init__()
        self.shapes: set[tuple[int, ...]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.shapes.add(tuple(tensor.shape))
        return out


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen2_moe"])
def test_neither_the_fold_nor_the_expert_weight_gradient_is_ever_built(arch):
    net = lora_net(arch)
    expert_shapes = {tuple(w.get_param().shape) for w in expert_wrappers(net)}
    frozen = [p for p in net.parameters() if not p.requires_grad]
    with OutputShapes() as grouped:
        forward_backward(net, batch())
    assert not expert_shapes & grouped.shapes
    assert all(p.grad is None for p in frozen)
    as_peft_forward(net)  # the detector sees peft's fold (and its gradient) when they are built
    with OutputShapes() as folded:
        forward_backward(net, batch())
    assert expert_shapes <= folded.shapes


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen2_moe"])
def test_every_linear_and_each_routed_expert_gets_an_adapter_of_rank_r(arch):
    net = lora.apply_lora(base_model(arch), model_cfg(), seed=0)
    # Every linear but the head and a gate (Qwen-MoE's shared_expert_gate, one output: a router, not a projection).
    linears = {name for name, m in base_model(arch).named_modules()
               if isinstance(m, torch.nn.Linear) and name != "lm_head" and not name.endswith("_gate")}
    wrapped = {name.removeprefix("base_model.model.") for name, m in net.named_modules()
               if isinstance(m, LoraLayer) and ".base_layer" not in name}
    experts = {w.get_param().shape for w in expert_wrappers(net)}
    # Its defaults (hpcsweep.model.lora_targets) name each of those linears.
    assert set(lora_targets.DEFAULT_LORA_TARGETS[arch]) >= {n.rpartition(".")[2] for n in linears}
    assert wrapped - {"model.layers.1.mlp.experts"} == linears
    expected = sum(4 * (m.in_features + m.out_features) for n, m in base_model(arch).named_modules() if n in linears)
    expected += sum(4 * e * (o + i) for e, o, i in experts)
    assert sum(p.numel() for p in net.parameters() if p.requires_grad) == expected
    without = lora.apply_lora(base_model(arch), model_cfg(experts=False), seed=0)
    assert not expert_wrappers(without)
    assert sum(p.numel() for p in without.parameters() if p.requires_grad) == expected - sum(
        4 * e * (o + i) for e, o, i in experts)


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen2_moe"])
def test_peft_loads_the_saved_adapter_onto_a_fresh_base_and_merges_it_exactly(arch, tmp_path):
    net = lora_net(arch)
    ids = batch()
    with torch.no_grad():
        trained = net(input_ids=ids).logits
    net.save_pretrained(tmp_path / "adapter", save_embedding_layers=False)  # hpcsweep.export.writer's call
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert set(lora_targets.EXPERT_PARAMETERS) <= set(config["target_parameters"])
    loaded = peft.PeftModel.from_pretrained(base_model(arch), tmp_path / "adapter").eval()
    assert {n: p.shape for n, p in loaded.named_parameters() if "lora_" in n} == {
        n: p.shape for n, p in net.named_parameters() if p.requires_grad}
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, trained, rtol=0, atol=1e-5)
        merged = loaded.merge_and_unload()
        assert not any(isinstance(m, LoraLayer) for m in merged.modules())
        torch.testing.assert_close(merged(input_ids=ids).logits, trained, rtol=0, atol=1e-5)


def test_dropout_applies_to_the_experts_adapters_in_training_only():
    net = lora_net("deepseek_v3", dropout=0.5)
    assert all(isinstance(w.lora_dropout["default"], torch.nn.Dropout) for w in expert_wrappers(net))
    experts = next(m for m in net.modules() if isinstance(m, expert_lora.GroupedLoraParamWrapper) and m.num_experts > 1)
    hidden = torch.randn(12, TINY_DEEPSEEK["hidden_size"], generator=torch.Generator().manual_seed(3))
    top_k = torch.tensor([[e % 4, (e + 1) % 4] for e in range(12)])
    weights = torch.full((12, 2), 0.5)
    experts.eval()
    evaluated = experts(hidden, top_k, weights)
    as_peft_forward(net)  # no dropout in eval: peft's own forward gives the same
    torch.testing.assert_close(experts(hidden, top_k, weights), evaluated, rtol=0, atol=1e-5)
    experts.__class__ = expert_lora.GroupedLoraParamWrapper
    experts.train()
    torch.manual_seed(0)
    first = experts(hidden, top_k, weights)
    torch.manual_seed(0)
    assert torch.equal(experts(hidden, top_k, weights), first)  # from the seeded stream
    assert not torch.allclose(first, evaluated, atol=1e-3)


def test_lora_mfu_counts_the_adapters_and_no_frozen_weight_gradient():
    net = lora.apply_lora(base_model("deepseek_v3"), model_cfg(), seed=0)
    config = net.config
    experts_off = lora.apply_lora(base_model("deepseek_v3"), model_cfg(experts=False), seed=0)
    expert_adapters = sum(p.numel() for w in expert_wrappers(net) for p in [*w.lora_A.parameters(), *w.lora_B.parameters()])
    linear_adapters = sum(p.numel() for p in experts_off.parameters() if p.requires_grad)
    share = config.num_experts_per_tok / config.n_routed_experts  # a token goes through top-k of the experts
    assert lora.adapter_flops_per_token(net) == pytest.approx(6 * (linear_adapters + share * expert_adapters))
    frozen_forward_backward = model.flops_per_token(config, 64) - model.flops_per_token(config, 0) / 3
    assert lora.training_flops_per_token(config, "lora", 64, net) == pytest.approx(
        frozen_forward_backward + lora.adapter_flops_per_token(net))
    assert lora.training_flops_per_token(config, "none", 64, net) == model.flops_per_token(config, 64)


def test_a_lora_trial_with_dropout_trains_on_a_moe_folder(tmp_path):
    from hpcsweep.train import worker

    from tests.model_folders import make_model_folder
    from .trial_dirs import make_trial_dir, read_metrics

    folder = make_model_folder(tmp_path / "folder")
    trial = make_trial_dir(tmp_path / "trial", {
        "model.path": str(folder), "model.peft": "lora", "model.lora.r": 2, "model.lora.dropout": 0.1,
        "data.batch_size": 2, "data.seq_len": 32, "data.synthetic_tokens": 20_000, "trainer.device": "cpu",
        "trainer.max_steps": 4, "trainer.warmup_steps": 1, "trainer.eval_every": 4, "trainer.eval_batches": 1,
        "trainer.log_every": 2, "trainer.ckpt_every": 0,
    })
    assert worker.run_trial(trial) == worker.EXIT_OK
    metrics = read_metrics(trial)
    assert metrics["status"] == "completed" and metrics["step"] == 4
    assert torch.isfinite(torch.tensor(metrics["train_loss"]))
