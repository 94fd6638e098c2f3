"""Expert LoRA (``hpcsweep.train.moe.expert_lora``): peft's adapters on fused routed experts, run as grouped GEMMs over
the tokens sorted by expert beside the frozen weight's. Same outputs and gradients as peft's own ``ParamWrapper``
forward at 4 to 256 experts, no fold, no expert weight gradient, no host sync, peft's format on disk, dropout, and
the padded ``bmm`` fallback equal to the grouped GEMM."""

import json

import peft
import pytest
import torch
from peft.tuners.lora import LoraLayer, ParamWrapper
from torch.utils._python_dispatch import TorchDispatchMode

from hpcsweep.config import trial_config_from_dict
from hpcsweep.model import lora_targets
from hpcsweep.train import lora, model
from hpcsweep.train.moe import expert_lora

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


def base_model(arch: str, seed: int = 0, **sizes) -> torch.nn.Module:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(seed)
    if arch == "deepseek_v3":
        return DeepseekV3ForCausalLM(DeepseekV3Config(vocab_size=VOCAB, **{**TINY_DEEPSEEK, **sizes})).eval()
    return Qwen2MoeForCausalLM(Qwen2MoeConfig(vocab_size=VOCAB, **{**TINY_QWEN_MOE, **sizes})).eval()


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


def lora_net(arch: str, sizes: dict | None = None, **lora_settings) -> torch.nn.Module:
    net = lora.apply_lora(base_model(arch, **(sizes or {})), model_cfg(**lora_settings), seed=0)
    return with_random_adapters(net)


def batch(seed: int = 2, length: int = 24) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))


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


EXPERT_COUNTS = {
    "deepseek_v3": {},
    "qwen2_moe": {},
    # DeepSeek-V3's router at the expert counts of the real models: Mixtral's 8, V2-Lite's 64 (top-6), V3's
    # 256 (top-8 within 4 of 8 groups); 128 tokens leave some of the 64 and 256 experts without a token.
    "deepseek_v3-8": dict(n_routed_experts=8, num_experts_per_tok=2),
    "deepseek_v3-64": dict(n_routed_experts=64, num_experts_per_tok=6),
    "deepseek_v3-256": dict(n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4),
}


@pytest.mark.parametrize("case", list(EXPERT_COUNTS))
def test_forward_and_adapter_gradients_equal_peft_own_forward(case):
    arch, sizes = case.partition("-")[0], EXPERT_COUNTS[case]
    net = lora_net(arch, sizes)
    assert len(expert_wrappers(net)) == 2  # gate_up_proj and down_proj of the one MoE layer
    ids = batch(length=64 if sizes else 24)
    grouped_logits, grouped_grads = forward_backward(net, ids)
    as_peft_forward(net)
    peft_logits, peft_grads = forward_backward(net, ids)
    torch.testing.assert_close(grouped_logits, peft_logits, rtol=0, atol=1e-5)
    assert grouped_grads.keys() == peft_grads.keys()
    for name, grad in peft_grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grouped_grads[name], grad, rtol=0, atol=1e-5, msg=name)


def routed_experts_wrapper(net: torch.nn.Module) -> expert_lora.GroupedLoraParamWrapper:
    """The outermost wrapper of the MoE layer's experts: called as the experts module is."""
    return next(m for m in net.modules() if isinstance(m, expert_lora.GroupedLoraParamWrapper) and m.num_experts > 1)


def routed_inputs(experts: int, tokens: int = 40, top_k: int = 2, dtype=torch.float32, device="cpu"):
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(tokens, TINY_DEEPSEEK["hidden_size"], generator=generator).to(device, dtype)
    top_k_index = torch.stack([torch.randperm(experts, generator=generator)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=generator).to(device, dtype)
    return hidden.requires_grad_(), top_k_index.to(device), weights.requires_grad_()


def experts_forward_backward(wrapper: torch.nn.Module, inputs) -> list[torch.Tensor]:
    """The experts' output, then the gradients of the hidden states, the routing weights and the adapters."""
    wrapper.zero_grad(set_to_none=True)
    hidden, top_k_index, weights = inputs
    hidden.grad = weights.grad = None
    out = wrapper(hidden, top_k_index, weights)
    out.square().mean().backward()
    adapters = [p.grad for p in wrapper.parameters() if p.requires_grad]
    return [out.detach(), hidden.grad, weights.grad, *adapters]


@pytest.mark.parametrize("rank", [4, 2])
def test_the_grouped_gemm_runs_without_the_fallback_and_the_padded_bmm_fallback_gives_the_same(rank, monkeypatch):
    # Rank 2 is half of what the grouped GEMM's 16-byte strides take in fp32: padded with zero rows.
    net = lora_net("deepseek_v3", dict(n_routed_experts=16), r=rank)
    wrapper, inputs = routed_experts_wrapper(net), routed_inputs(16)
    padded = []
    plain_padded_bmm = expert_lora._padded_bmm
    monkeypatch.setattr(expert_lora, "_padded_bmm", lambda *a: padded.append(1) or plain_padded_bmm(*a))
    grouped = experts_forward_backward(wrapper, inputs)
    assert not padded  # every product went through torch._grouped_mm
    monkeypatch.setattr(expert_lora, "_grouped_mm_fits", lambda x, weight: False)
    fallback = experts_forward_backward(wrapper, inputs)
    assert len(padded) == 6  # both frozen products and both adapters' two
    for a, b in zip(grouped, fallback, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    as_peft_forward(net)
    for a, b in zip(experts_forward_backward(wrapper, inputs), fallback, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_in_float64_which_the_grouped_gemm_lacks_the_fallback_equals_peft_own_forward():
    assert not expert_lora._grouped_mm_runs(torch.device("cpu"), torch.float64)
    net = lora_net("deepseek_v3", dict(n_routed_experts=16)).double()
    wrapper, inputs = routed_experts_wrapper(net), routed_inputs(16, dtype=torch.float64)
    ours = experts_forward_backward(wrapper, inputs)
    as_peft_forward(net)
    net.config._experts_implementation = "eager"  # transformers' grouped_mm experts cannot run float64 either
    for a, b in zip(experts_forward_backward(wrapper, inputs), ours, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_under_bf16_autocast_the_adapters_compute_in_bf16_as_close_to_fp32_as_peft_own_forward():
    """``torch._grouped_mm`` is not an autocast op: the adapters are cast to autocast's dtype, as autocast casts
    peft's ``F.linear``; the frozen base is held in bf16, as the trainer holds it under LoRA. Output and
    gradients stay as close to the fp32 ones as peft's fold does (each within 3% of the largest value)."""
    net = lora_net("deepseek_v3", dict(n_routed_experts=16))
    wrapper, inputs = routed_experts_wrapper(net), routed_inputs(16)
    fp32 = experts_forward_backward(wrapper, inputs)
    for param in net.parameters():
        if not param.requires_grad:
            param.data = param.data.bfloat16()
    gate_up = next(w for w in expert_wrappers(net) if w.parameter_name == "gate_up_proj")
    sorted_rows = expert_lora.Groups.of(torch.zeros(40, dtype=torch.long), 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert expert_lora.ExpertFactors(gate_up, "default")(inputs[0], sorted_rows).dtype == torch.bfloat16
        ours = experts_forward_backward(wrapper, inputs)
        as_peft_forward(net)
        theirs = experts_forward_backward(wrapper, inputs)
    for reference, a, b in zip(fp32, ours, theirs, strict=True):
        largest = reference.abs().max()
        assert (a.float() - reference).abs().max() <= 0.03 * largest
        assert (b.float() - reference).abs().max() <= 0.03 * largest


def test_forward_and_backward_need_no_host_sync():
    """On the meta device any read of a value on the host (``.item()``, ``.tolist()``, ``int()``) raises: the
    grouped forward and its backward run there (bf16: the only dtype of ``torch._grouped_mm``'s meta kernel)."""
    net = lora_net("deepseek_v3", dict(n_routed_experts=64), dropout=0.1).train()
    wrapper = routed_experts_wrapper(net).to("meta", torch.bfloat16)
    out, hidden_grad, weights_grad, *adapters = experts_forward_backward(
        wrapper, routed_inputs(64, top_k=6, dtype=torch.bfloat16, device="meta"))
    assert out.device.type == "meta" and out.shape == hidden_grad.shape == (40, TINY_DEEPSEEK["hidden_size"])
    assert weights_grad.shape == (40, 6) and len(adapters) == 4
    with pytest.raises(RuntimeError, match="meta"):
        int(out[0, 0])  # the detector: a host read on meta raises


@pytest.mark.parametrize("rank", [4, 2])
def test_the_memory_plan_counts_what_the_grouped_gemms_keep_for_the_backward(rank, monkeypatch):
    """Per MoE layer autograd keeps, of the adapters' products (their inputs left out, which the frozen products
    keep too): each token-expert's ``x·A`` of both tensors (the plan's activations, 2r' a token-expert) and the
    adapter weights copied into the grouped GEMM's layout (``expert_lora_bytes`` beyond its transient product).
    Rank 2 is padded to 4 in fp32, so its ``A`` is copied as well."""
    from hpcsweep.memory_plan.model_shape import shape_from_hf_config
    from hpcsweep.memory_plan.plan import TrainingSetup, expert_lora_bytes

    net = lora_net("deepseek_v3", dict(n_routed_experts=16), r=rank)
    parameters = {p.untyped_storage().data_ptr() for p in net.parameters()}
    kept: dict[int, int] = {}
    plain = expert_lora.ExpertFactors.__call__

    def counted(self, x, groups):
        def pack(tensor):
            storage = tensor.untyped_storage()
            # The group offsets (E int32, shared by a layer's products) are left out too.
            if tensor.is_floating_point() and storage.data_ptr() not in parameters | {x.untyped_storage().data_ptr()}:
                kept[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            return plain(self, x, groups)

    monkeypatch.setattr(expert_lora.ExpertFactors, "__call__", counted)
    ids = batch()
    forward_backward(net, ids)
    shape = shape_from_hf_config(net.config.to_dict())
    setup = TrainingSetup(precision="fp32", batch_size=ids.shape[0], seq_len=ids.shape[1], peft="lora",
                          lora_rank=rank)
    token_experts = ids.numel() * shape.num_experts_per_tok
    product = token_experts * 2 * shape.moe_intermediate_size * 4
    assert sum(kept.values()) == token_experts * 2 * 4 * 4 + expert_lora_bytes(shape, setup) - product


class OutputShapes(TorchDispatchMode):
    """Records the shape of every tensor any operation creates, forward and backward (views of its inputs,
    such as the frozen weight transposed for the grouped GEMM, are not created: they are left out)."""

    def __init__(self):
        super().__init__()
        self.shapes: set[tuple[int, ...]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in inputs:
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


@pytest.mark.parametrize("case", ["deepseek_v3", "qwen2_moe", "deepseek_v3-64"])
def test_peft_loads_the_saved_adapter_onto_a_fresh_base_and_merges_it_exactly(case, tmp_path):
    arch, sizes = case.partition("-")[0], EXPERT_COUNTS[case]
    net = lora_net(arch, sizes)
    ids = batch(length=64 if sizes else 24)
    with torch.no_grad():
        trained = net(input_ids=ids).logits
    net.save_pretrained(tmp_path / "adapter", save_embedding_layers=False)  # hpcsweep.export.writer's call
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert set(lora_targets.EXPERT_PARAMETERS) <= set(config["target_parameters"])
    loaded = peft.PeftModel.from_pretrained(base_model(arch, **sizes), tmp_path / "adapter").eval()
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
