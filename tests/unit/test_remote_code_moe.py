"""DeepSeek-MoE-16B as it runs: a folder whose own code (``auto_map``, ``trust_remote_code``) builds the model,
one ``nn.Linear`` triple per routed expert (``mlp.experts.N.gate_proj``, ``up_proj``, ``down_proj``).

The trainer's LoRA (``hpcsweep.train.lora.apply_lora``) on that model, built on the meta device from the
folder's config.json, against the memory plan of the same config.json, with ``model.lora.experts`` on and
off; and a tiny one that trains a step. The folder's code is the stand-in of ``tests/wrapped_models.py``
(DeepSeek-MoE's module tree), and where ``$HPCSWEEP_DEEPSEEK_MOE_CODE`` names a folder holding DeepSeek's
own ``modeling_deepseek.py`` that code as well, which the stand-in's tree is then checked against, name by
name and shape by shape.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hpcsweep.config import LoraConfig, ModelConfig
from hpcsweep.memory_plan import TrainingSetup, plan_memory
from hpcsweep.memory_plan.model_shape import largest_layer_parameters, shape_from_hf_config, total_parameters
from hpcsweep.model import lora_targets
from hpcsweep.train import lora
from tests.wrapped_models import (
    DEEPSEEK_MOE_CODE_ENV,
    MOE_16B,
    deepseek_moe_code_dirs,
    make_deepseek_moe_folder,
    remote_code_model,
)

# DeepSeek-MoE-16B's config.json says rope_scaling: null, a key transformers 5 has renamed.
pytestmark = pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")

CODES = deepseek_moe_code_dirs()
TINY = dict(
    MOE_16B, vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, bos_token_id=0,
    eos_token_id=1,
)
"""DeepSeek-MoE-16B's layout at a size that trains in milliseconds: a dense first layer, two MoE layers
of 4 routed experts (top-2) and 2 shared ones."""


def real_code(monkeypatch) -> Path:
    """DeepSeek's own code, importable under transformers 5; the test is skipped without it."""
    if CODES["real"] is None:
        pytest.skip(f"${DEEPSEEK_MOE_CODE_ENV} names no folder with DeepSeek-MoE's own modeling_deepseek.py")
    return CODES["real"]


@pytest.fixture(params=list(CODES))
def code(request, monkeypatch) -> Path | None:
    """The folder's model code: the stand-in (None), or DeepSeek's own."""
    return real_code(monkeypatch) if request.param == "real" else None


def test_the_stand_in_has_deepseeks_own_module_tree(tmp_path, monkeypatch):
    # What the stand-in is trusted for: the name and shape of every parameter, in order, at the 16B.
    trees = [[(name, tuple(p.shape)) for name, p in remote_code_model(
        make_deepseek_moe_folder(tmp_path / label, MOE_16B, code)).named_parameters()]
        for label, code in (("stand-in", None), ("real", real_code(monkeypatch)))]
    assert trees[0] == trees[1]


def trial_model(folder: Path, rank: int, experts: bool) -> ModelConfig:
    return ModelConfig(path=str(folder), trust_remote_code=True, peft="lora", lora=LoraConfig(r=rank, experts=experts))


def test_the_routed_experts_own_modules_are_told_apart_from_every_other():
    routed = ["model.layers.1.mlp.experts.0.gate_proj", "model.layers.27.mlp.experts.63.down_proj",
              "mlp.experts.7.up_proj", "base_model.model.model.layers.3.block_sparse_moe.experts.2.w1"]
    others = ["model.layers.1.mlp.shared_experts.gate_proj", "model.layers.0.mlp.gate_proj", "model.layers.1.mlp.gate",
              "model.layers.1.mlp.experts", "model.layers.1.mlp.experts.7", "model.layers.1.self_attn.q_proj",
              "mlp.experts.gate_up_proj", "lm_head"]
    assert [lora_targets.is_routed_expert_module(name) for name in routed] == [True] * len(routed)
    assert [lora_targets.is_routed_expert_module(name) for name in others] == [False] * len(others)


def test_only_model_lora_experts_false_on_a_model_with_expert_modules_excludes_anything():
    remote = ["model.layers.0.mlp.gate_proj", "model.layers.1.mlp.experts.0.gate_proj"]
    fused = ["model.layers.0.mlp.gate_proj", "model.layers.1.mlp.experts"]
    assert lora_targets.excluded_modules(remote, experts=True) is None
    assert lora_targets.excluded_modules(fused, experts=False) is None
    assert lora_targets.excluded_modules(iter(remote), experts=False) == lora_targets.ROUTED_EXPERT_MODULES


@pytest.mark.parametrize(("name", "targets", "experts", "adapted"), [
    ("model.layers.1.mlp.experts.5.gate_proj", ("gate_proj",), True, True),
    ("model.layers.1.mlp.experts.5.gate_proj", ("gate_proj",), False, False),
    ("model.layers.1.mlp.experts.5.gate_proj", lora_targets.ALL_LINEAR, False, False),
    ("model.layers.1.mlp.experts.5.gate_proj", ("q_proj",), True, False),
    ("model.layers.1.mlp.shared_experts.gate_proj", ("gate_proj",), False, True),
    ("model.layers.0.mlp.down_proj", ("mlp.down_proj",), False, True),
    ("model.layers.0.mlp.down_proj", ("p.down_proj",), True, False),  # peft matches whole names
    ("lm_head", lora_targets.ALL_LINEAR, True, False),
    ("lm_head", ("lm_head",), True, True),
])
def test_a_module_is_adapted_as_peft_adapts_the_trainers_targets(name, targets, experts, adapted):
    assert lora_targets.adapts_module(name, targets, experts=experts) is adapted


@pytest.mark.parametrize("experts", [True, False], ids=["experts", "no-experts"])
@pytest.mark.parametrize("rank", [8, 4])
def test_the_plans_adapters_are_the_trainable_parameters_of_the_wrapped_remote_code_16b(tmp_path, code, rank, experts):
    from peft.tuners.lora import LoraLayer

    folder = make_deepseek_moe_folder(tmp_path / "deepseek-moe-16b", MOE_16B, code)
    # Planned from the folder's config.json keys, as the login node plans it.
    shape = shape_from_hf_config(json.loads((folder / "config.json").read_text()))
    net = remote_code_model(folder)
    assert type(net).__module__.startswith("transformers_modules.")  # the folder's own code built it
    layers = [sum(p.numel() for p in layer.parameters()) for layer in net.model.layers]
    assert (total_parameters(shape), largest_layer_parameters(shape)) == (
        sum(p.numel() for p in net.parameters()), max(layers))
    linears = [name for name, module in net.named_modules() if isinstance(module, torch.nn.Linear)]

    wrapped = lora.apply_lora(net, trial_model(folder, rank, experts), seed=0)

    setup = TrainingSetup(precision="bf16", batch_size=1, seq_len=2048, peft="lora", lora_rank=rank,
                          lora_experts=experts)
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert plan_memory(shape, setup).trainable_parameters == trainable
    # Module by module, what peft wrapped is what the plan's rule adapts.
    targets = lora_targets.target_modules("deepseek", None)
    modules = dict(wrapped.base_model.model.named_modules())
    assert {name for name in linears if isinstance(modules[name], LoraLayer)} == {
        name for name in linears if lora_targets.adapts_module(name, targets, experts=experts)}
    routed = sum(isinstance(modules[name], LoraLayer) for name in linears if ".mlp.experts." in name)
    assert routed == (27 * 64 * 3 if experts else 0)  # MoE layers x routed experts x projections


def tiny_trained_step(folder: Path, experts: bool) -> tuple[torch.nn.Module, dict[str, torch.Tensor], float]:
    """The tiny model under the trainer's LoRA after one AdamW step, its trainable tensors before the step,
    and the step's loss."""
    torch.manual_seed(0)
    # DeepSeek's own code builds a cache it cannot make under transformers 5 unless told not to.
    net = remote_code_model(folder, meta=False, use_cache=False)
    wrapped = lora.apply_lora(net, trial_model(folder, 4, experts), seed=0)
    wrapped.train()
    trainable = {name: p for name, p in wrapped.named_parameters() if p.requires_grad}
    before = {name: p.detach().clone() for name, p in trainable.items()}
    optimizer = torch.optim.AdamW(trainable.values(), lr=1e-2)
    ids = torch.randint(0, TINY["vocab_size"], (4, 16), generator=torch.Generator().manual_seed(1))
    loss = wrapped(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    return wrapped, before, loss.item()


@pytest.mark.parametrize("experts", [True, False], ids=["experts", "no-experts"])
def test_a_tiny_remote_code_moe_trains_a_step_with_its_routed_experts_adapted_only_with_model_lora_experts(
        tmp_path, code, experts):
    from peft.tuners.lora import LoraLayer

    wrapped, before, loss = tiny_trained_step(make_deepseek_moe_folder(tmp_path / "tiny", TINY, code), experts)
    assert math.isfinite(loss)
    adapted = {name for name, module in wrapped.named_modules() if isinstance(module, LoraLayer)}
    routed = {name for name in adapted if lora_targets.is_routed_expert_module(name)}
    assert len(routed) == (2 * 4 * 3 if experts else 0)  # MoE layers x experts x projections
    for kind in ("self_attn.q_proj", "layers.0.mlp.gate_proj", "layers.1.mlp.shared_experts.down_proj"):
        assert any(name.endswith(kind) for name in adapted), kind
    # Every adapter was trained by the step: lora_B starts at zero, so its gradient is the first to arrive.
    moved = {name for name, p in wrapped.named_parameters() if p.requires_grad and not torch.equal(p, before[name])}
    assert {name.split(".lora_B")[0] for name in moved if ".lora_B." in name} >= adapted - routed
    assert any(".mlp.experts." in name for name in moved) is experts


def test_a_routed_experts_adapters_count_for_the_share_of_tokens_routed_to_it(tmp_path):
    from peft.tuners.lora import LoraLayer

    folder = make_deepseek_moe_folder(tmp_path / "tiny", TINY)
    wrapped = lora.apply_lora(remote_code_model(folder), trial_model(folder, 4, True), seed=0)
    dense = expert = 0
    for name, module in wrapped.named_modules():
        if isinstance(module, LoraLayer):
            size = sum(p.numel() for p in [*module.lora_A.parameters(), *module.lora_B.parameters()])
            if lora_targets.is_routed_expert_module(name):
                expert += size
            else:
                dense += size
    assert expert > 0
    assert lora.adapter_flops_per_token(wrapped) == 6 * (dense + expert * 2 / 4)  # top-2 of 4


def folder_with_weights(folder: Path, code: Path | None) -> Path:
    """A tiny DeepSeek-MoE folder as its authors publish one: its code, its config.json as written
    (``rope_scaling: null``, ``use_cache: true``) and its weights in one safetensors file."""
    make_deepseek_moe_folder(folder, TINY, code)
    published = (folder / "config.json").read_text()
    from safetensors.torch import save_file

    torch.manual_seed(0)
    # The weights file save_pretrained writes (DeepSeek's code declares its tied weights as transformers 4
    # did, a list, on which transformers 5's save_pretrained fails).
    state = {name: tensor.contiguous() for name, tensor in remote_code_model(folder, meta=False).state_dict().items()}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    assert json.loads((folder / "config.json").read_text()) == json.loads(published)
    return folder


@pytest.mark.parametrize("peft", ["lora", "none"])
def test_a_deepseek_moe_folder_with_its_own_code_trains_as_a_trial_under_transformers_5(tmp_path, code, peft):
    # DeepSeek-MoE's code, written for transformers 4, imports is_torch_fx_available, reads rope_scaling's
    # ["type"] and builds a DynamicCache from a legacy one: the trial's model build and first step would fail
    # on all three (hpcsweep.train.remote_code).
    from hpcsweep.train import worker
    from tests.unit.trial_dirs import make_trial_dir, read_metrics

    folder = folder_with_weights(tmp_path / "moe", code)
    trial = make_trial_dir(tmp_path / "trial", {
        "model.path": str(folder), "model.trust_remote_code": True, "model.peft": peft, "model.lora.r": 2,
        "data.batch_size": 2, "data.seq_len": 16, "data.synthetic_tokens": 4_000, "trainer.device": "cpu",
        "trainer.max_steps": 2, "trainer.warmup_steps": 0, "trainer.eval_every": 2, "trainer.eval_batches": 1,
        "trainer.log_every": 2, "trainer.ckpt_every": 2,
    })
    assert worker.run_trial(trial) == worker.EXIT_OK, read_metrics(trial).get("error")
    metrics = read_metrics(trial)
    assert metrics["status"] == "completed" and math.isfinite(metrics["val_loss"])
    assert metrics["mfu"] is None and metrics["tokens_per_s"] > 0
    # The plan counted what trained: the per-expert adapters (LoRA), or every parameter.
    planned = metrics["memory_plan"]["parameters"]["trainable"]
    net = remote_code_model(folder)
    expected = (wrapped_count(net, folder) if peft == "lora" else sum(p.numel() for p in net.parameters()))
    assert planned == expected
    # Its own gates route, and their choices are the router statistics: every token reaches top_k experts
    # in each MoE layer (layers 1 and 2), and the code's own balance loss is reported without its alpha.
    router = metrics["router"]
    tokens = 2 * 2 * 16 * TINY["num_experts_per_tok"]  # a window: 2 steps of 2 x 16 tokens
    assert {layer: stats["tokens"] for layer, stats in router["layers"].items()} == {"1": tokens, "2": tokens}
    assert (router["experts"], router["top_k"], router["bias_update_rate"]) == (4, 2, 0.0)
    assert router["aux_loss_coef"] == TINY.get("aux_loss_alpha", 0.001) and router["aux_loss"] > 0
    assert router["aux_loss"] == pytest.approx(sum(stats["aux_loss"] for stats in router["layers"].values()))
    assert 1.0 <= router["max_mean_load"] <= 4 / 2
    # The folder itself is left as published.
    assert json.loads((folder / "config.json").read_text())["use_cache"] is True

    # Exported whole (merged for LoRA), it is the base's code and config.json as published, and loads
    # back with the trained weights: the trial's logits.
    from hpcsweep.export import cli
    from hpcsweep.export.weights import load_trial_model, trial_config
    from hpcsweep.files.sweep_record import SweepRecord, TrialRecord, now_iso, write_sweep_record
    from hpcsweep.train import model as model_lib

    write_sweep_record(SweepRecord(str(tmp_path), "local", now_iso(), [
        TrialRecord(0, [f"model.peft={peft}"], str(trial), None, now_iso())]))
    out = tmp_path / "export"
    assert cli.main([str(tmp_path), "--trial", "0", "--checkpoint", "last", "--out", str(out),
                     *(["--merge"] if peft == "lora" else [])]) == 0
    assert {"modeling_deepseek.py", "configuration_deepseek.py", "model.safetensors"} <= {p.name for p in out.iterdir()}
    exported = json.loads((out / "config.json").read_text())
    assert (exported["rope_scaling"], exported["use_cache"], exported["torch_dtype"]) == (None, True, "float32")
    checkpoint = max((trial / "checkpoints").glob("step*"))
    ids = torch.randint(0, TINY["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(2))
    reloaded = model_lib.build_model(ModelConfig(path=str(out), trust_remote_code=True), seed=0).eval()
    with torch.no_grad():
        expected_logits = load_trial_model(trial_config(trial), checkpoint)(input_ids=ids).logits
        torch.testing.assert_close(reloaded(input_ids=ids).logits, expected_logits, rtol=1e-5, atol=1e-5)


def wrapped_count(net: torch.nn.Module, folder: Path) -> int:
    wrapped = lora.apply_lora(net, trial_model(folder, 2, True), seed=0)
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


def test_a_loaded_folder_with_its_own_code_has_the_buffers_its_code_computes(tmp_path, code):
    # transformers 5 loads on the meta device and leaves non-persistent buffers (the rotary inv_freq) to
    # _init_weights, which code written for transformers 4 does not compute them in: they were garbage.
    from hpcsweep.train import model as model_lib

    folder = folder_with_weights(tmp_path / "moe", code)
    built = model_lib.build_model(ModelConfig(path=str(folder), trust_remote_code=True), seed=0)
    constructed = dict(remote_code_model(folder, meta=False).named_buffers())  # __init__ on the CPU, in full
    loaded = {name: buffer for name, buffer in built.named_buffers() if name.endswith("inv_freq")}
    assert loaded and all(torch.equal(buffer, constructed[name]) for name, buffer in loaded.items())


def test_an_aux_loss_coefficient_for_a_folder_whose_code_routes_is_refused_naming_its_own(tmp_path):
    from hpcsweep.config import trial_config_from_dict
    from hpcsweep.model.folder import read_model_folder
    from hpcsweep.sweep.prepare import check_pretrained_model

    folder = folder_with_weights(tmp_path / "moe", None)
    (folder / "tokenizer.json").write_text("{}")  # what the folder check looks for; nothing loads it here
    def trial(**moe):
        return trial_config_from_dict({"model": {"path": str(folder), "trust_remote_code": True, "moe": moe},
                                       "data": {"seq_len": 16}})
    check_pretrained_model(trial(), read_model_folder(str(folder)))  # null: the code's own, accepted
    with pytest.raises(ValueError, match=r"^model\.moe\.aux_loss_coef=0\.01 is not allowed with model\.path=.*: it "
                                         r"runs its own model code, .* aux_loss_alpha \(0\.001\); leave the key null"):
        check_pretrained_model(trial(aux_loss_coef=0.01), read_model_folder(str(folder)))


def test_a_packed_row_reaches_the_models_own_code_as_a_mask_its_samples_kept_apart(tmp_path, code):
    """A folder's own code builds its mask itself (``_prepare_4d_causal_attention_mask``): hpcsweep gives it
    the 1/0 mask of the row's samples, and each sample's logits are its own run alone."""
    from hpcsweep.train.data import sample_attention

    net = remote_code_model(make_deepseek_moe_folder(tmp_path / "tiny", TINY, code), meta=False).eval()
    ids = torch.randint(2, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(2))
    position_ids = torch.tensor([list(range(5)) + list(range(7)), list(range(9)) + list(range(3))])
    kwargs = sample_attention.forward_kwargs(position_ids, "eager", own_code=True, dtype=torch.float32,
                                             device=torch.device("cpu"))
    with torch.no_grad():
        packed = net(input_ids=ids, position_ids=position_ids, **kwargs).logits
        for row, cut in ((0, 5), (1, 9)):
            for lo, hi in ((0, cut), (cut, 12)):
                alone = net(input_ids=ids[row : row + 1, lo:hi], use_cache=False).logits[0]
                torch.testing.assert_close(packed[row, lo:hi], alone, rtol=0, atol=1e-5)
        leaked = net(input_ids=ids, position_ids=position_ids, use_cache=False).logits
    assert (leaked - packed).abs().max() > 1e-4  # without the mask the second samples read the first
