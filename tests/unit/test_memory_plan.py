"""The memory plan against models of published sizes, counted on the meta device, and its refusals."""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, LlamaConfig, LlamaForCausalLM

from hpcsweep.config import ModelConfig, trial_config_from_dict
from hpcsweep.model.lora_targets import DEFAULT_LORA_TARGETS
from hpcsweep.memory_plan.gpu_memory import GIB, GpuMemory, gpu_memory, gres_gpu_types
from hpcsweep.memory_plan.loss_chunk import loss_chunk_tokens
from hpcsweep.memory_plan.plan import AUTO, resolved_loss_chunk
from hpcsweep.memory_plan import (
    TrainingSetup,
    activation_bytes_per_token,
    cheapest_fixes,
    plan_memory,
    refusal_line,
    resolve_parallel,
    setup_of_trial,
    shape_of_trial,
)
from hpcsweep.memory_plan.model_shape import (
    active_parameters,
    largest_layer_parameters,
    lora_parameters,
    shape_from_hf_config,
    shape_from_model_config,
    total_parameters,
)
from hpcsweep.sweep.hooks import Allocation, SweepTrial
from hpcsweep.sweep.memory_check import check_memory_plans
from hpcsweep.train.model import build_model, hf_config
from tests.model_folders import make_model_folder
from tests.unit.trial_dirs import make_trial_dir, read_metrics
from tests.wrapped_models import (
    LLAMA_7B,
    MIXTRAL,
    MOE_16B,
    QWEN_MOE,
    V2_LITE,
    V3,
    meta_model,
    wrapped_trainable_parameters,
)

REPO = Path(__file__).resolve().parents[2]
A100 = GpuMemory(80 * GIB, "A100", "test")


def meta_count(model_cls, config) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in model_cls(config).parameters())


def preset(name: str) -> ModelConfig:
    values = yaml.safe_load((REPO / "configs" / "model" / f"{name}.yaml").read_text()) or {}
    return trial_config_from_dict({"model": values}).model


def hf_kwargs(values: dict) -> dict:
    return {k: v for k, v in values.items() if k != "model_type"}


def test_deepseek_v2_lite_counts_as_published_and_as_built():
    shape = shape_from_hf_config(V2_LITE)
    built = meta_count(DeepseekV2ForCausalLM, DeepseekV2Config(**hf_kwargs(V2_LITE)))
    assert total_parameters(shape) == pytest.approx(built, rel=0.01)
    assert total_parameters(shape) == pytest.approx(15.7e9, rel=0.01)
    # The model card's 2.4B activated leaves out the input embedding (a lookup).
    embedding = V2_LITE["vocab_size"] * V2_LITE["hidden_size"]
    assert active_parameters(shape) - embedding == pytest.approx(2.4e9, rel=0.03)


def test_llama_7b_counts_as_published_and_as_built():
    shape = shape_from_hf_config(LLAMA_7B)
    built = meta_count(LlamaForCausalLM, LlamaConfig(**hf_kwargs(LLAMA_7B)))
    assert total_parameters(shape) == pytest.approx(built, rel=0.01)
    assert total_parameters(shape) == pytest.approx(6.74e9, rel=0.01)
    assert active_parameters(shape) == total_parameters(shape)


@pytest.mark.parametrize("name", ["deepseek_125m", "deepseek_1b", "deepseek_tiny", "llama_small"])
def test_presets_count_as_built_on_the_meta_device(name):
    cfg = preset(name)
    with torch.device("meta"):
        built = build_model(cfg, seed=0)
    params = dict(built.named_parameters())
    shape = shape_from_model_config(cfg)
    assert total_parameters(shape) == pytest.approx(sum(p.numel() for p in params.values()), rel=0.01)
    # The same model through its config.json form (what model.path gives).
    assert total_parameters(shape_from_hf_config(hf_config(cfg).to_dict())) == total_parameters(shape)
    share = cfg.num_experts_per_tok / cfg.n_routed_experts
    active = sum(p.numel() * (share if ".mlp.experts." in n else 1) for n, p in params.items())
    assert active_parameters(shape) == pytest.approx(active, rel=0.01)


@pytest.mark.parametrize("arch,targets", [
    ("llama", DEFAULT_LORA_TARGETS["llama"]),
    # peft also adapts transformers' 3D expert tensors when a target names them (down_proj): the
    # plan counts adapters on nn.Linear modules only, so the MoE model is checked on attention.
    ("deepseek_v3", ("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")),
])
def test_lora_parameters_are_what_peft_adds(arch, targets):
    import peft

    cfg = ModelConfig(arch=arch)
    model = build_model(cfg, seed=0)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=list(targets)))
    adapters = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert lora_parameters(shape_from_model_config(cfg), 4, targets) == adapters


def saved_activation_bytes(cfg: ModelConfig, precision: str, batch: int, seq: int) -> int:
    """Bytes autograd saves in one forward (the loss aside), the weights and autocast's copies of them left out."""
    model = build_model(cfg, seed=0, attn_implementation="eager")
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        transposed_weight = tensor.grad_fn is not None and type(tensor.grad_fn).__name__ == "TBackward0"
        weight_copy = tuple(tensor.shape) in shapes and tensor.dtype == torch.bfloat16
        if storage.data_ptr() not in weights and not transposed_weight and not weight_copy:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            model(input_ids=ids)
    return sum(saved.values())


@pytest.mark.parametrize("arch", ["deepseek_v3", "llama"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_activation_formula_matches_what_autograd_saves(arch, precision):
    # 150 tokens: no activation shares a weight's shape, which tells autocast's weight copies apart.
    batch, seq = 3, 50
    cfg = ModelConfig(arch=arch, hidden_size=256, intermediate_size=512, num_layers=3, num_heads=4,
                      num_kv_heads=4 if arch == "deepseek_v3" else 2, vocab_size=512, moe_intermediate_size=128,
                      q_lora_rank=96 if arch == "deepseek_v3" else None, kv_lora_rank=64, qk_rope_head_dim=16,
                      qk_nope_head_dim=32, v_head_dim=32)
    shape = shape_from_model_config(cfg)
    setup = TrainingSetup(precision=precision, batch_size=batch, seq_len=seq, fused_attention=False, device="cpu")
    per = activation_bytes_per_token(shape, setup)
    layers = sum(per["attention"] + per["moe_mlp" if shape.is_moe_layer(i) else "dense_mlp"] for i in range(3))
    # What the model saves: every layer, then the final norm and lm_head's input (the logits are
    # the loss's, which the trainer computes outside the model).
    estimate = batch * seq * (layers + per["head"])
    assert estimate == pytest.approx(saved_activation_bytes(cfg, precision, batch, seq), rel=0.1)


def test_fsdp_divides_states_and_lora_freezes_the_base():
    shape = shape_from_hf_config(LLAMA_7B)
    ddp = plan_memory(shape, TrainingSetup(precision="bf16", batch_size=1, seq_len=2048, world_size=8))
    assert ddp.weights == pytest.approx(6 * total_parameters(shape))  # fp32 master + bf16 autocast copy
    assert ddp.gradients == 8 * total_parameters(shape)  # and DDP's buckets
    assert ddp.optimizer == 8 * total_parameters(shape)  # AdamW's moments
    assert ddp.temporaries == 4 * total_parameters(shape)  # the foreach step's temporary
    fsdp = plan_memory(shape, TrainingSetup(precision="bf16", batch_size=1, seq_len=2048, world_size=8, parallel="fsdp"))
    assert fsdp.optimizer == pytest.approx(ddp.optimizer / 8, rel=1e-6)
    assert fsdp.activations == ddp.activations and fsdp.total < ddp.total / 3
    lora = plan_memory(shape, TrainingSetup(precision="bf16", batch_size=1, seq_len=2048, peft="lora"))
    assert lora.trainable_parameters == lora_parameters(shape, 8, DEFAULT_LORA_TARGETS["llama"]) < total_parameters(shape) / 100
    assert lora.weights == 2 * total_parameters(shape) + 4 * lora.trainable_parameters
    sgd = plan_memory(shape, TrainingSetup(precision="bf16", batch_size=1, seq_len=2048, optimizer="sgd", momentum=0.0))
    assert sgd.optimizer == 0
    checkpointed = plan_memory(shape, TrainingSetup(precision="bf16", batch_size=1, seq_len=2048, grad_checkpointing=True))
    assert checkpointed.activations < ddp.activations / 5


def test_auto_picks_ddp_when_it_fits_else_fsdp():
    small = shape_from_model_config(preset("deepseek_125m"))
    setup = TrainingSetup(precision="bf16", batch_size=8, seq_len=2048, world_size=8)
    assert resolve_parallel(small, setup, A100) == "ddp"
    assert resolve_parallel(shape_from_hf_config(LLAMA_7B), setup, A100) == "fsdp"
    assert resolve_parallel(shape_from_hf_config(LLAMA_7B), setup, None) == "ddp"


def test_refusal_of_a_moe_full_fine_tuning_names_lora_and_fsdp():
    shape = shape_from_hf_config(V2_LITE)
    setup = TrainingSetup(precision="bf16", batch_size=1, seq_len=2048, world_size=8)
    plan = plan_memory(shape, setup)
    line = refusal_line(3, shape, setup, plan, A100, 8)
    assert line == (
        "trial #3: ~402 GB/GPU (full fine-tuning, DDP) > 80 GB per A100: use model.peft=lora (~48 GB), "
        "or trainer.parallel=fsdp over >= 6 GPUs"
    )
    # Each named change fits, and the GPU count is the smallest that does.
    assert plan_memory(shape, replace(setup, peft="lora")).total <= A100.bytes
    assert plan_memory(shape, replace(setup, parallel="fsdp", world_size=6)).total <= A100.bytes
    assert plan_memory(shape, replace(setup, parallel="fsdp", world_size=5)).total > A100.bytes


def test_refusal_of_fsdp_over_too_few_gpus_asks_for_more_nodes():
    shape = shape_from_hf_config({**LLAMA_7B, "hidden_size": 8192, "intermediate_size": 28672,
                                  "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8})
    setup = TrainingSetup(precision="bf16", batch_size=1, seq_len=4096, world_size=8, parallel="fsdp")
    line = refusal_line(0, shape, setup, plan_memory(shape, setup), A100, 8)
    # A 70B base does not fit in bf16 on one A100 even frozen, so LoRA is not offered.
    assert line.startswith("trial #0: ~") and "(full fine-tuning, FSDP over 8 GPUs) > 80 GB per A100: " in line
    assert "model.peft=lora" not in line
    # Its activations alone pass 80 GB at 4096 tokens: sharding needs checkpointing beside it.
    fix = line.split(": ", 2)[2]
    assert re.fullmatch(r"trainer\.parallel=fsdp and trainer\.grad_checkpointing=true over >= (\d+) GPUs "
                        r"\(trainer\.nodes=(\d+)\)", fix), fix
    world = int(re.search(r">= (\d+)", fix).group(1))
    fitting = replace(setup, world_size=world, grad_checkpointing=True)
    assert plan_memory(shape, fitting).total <= A100.bytes < plan_memory(shape, replace(fitting, world_size=world - 8)).total


def test_refusal_of_activations_offers_checkpointing_and_a_smaller_batch():
    shape = shape_from_model_config(preset("deepseek_1b"))
    setup = TrainingSetup(precision="bf16", batch_size=32, seq_len=2048, world_size=1, peft="lora")
    fixes = cheapest_fixes(shape, setup, A100, 8)
    # Sharding saves nothing of a LoRA trial's activations: checkpointing first, then a smaller batch.
    assert len(fixes) == 2 and fixes[0].startswith("trainer.grad_checkpointing=true (~")
    assert fixes[-1] == "data.batch_size=8 (raise trainer.grad_accum to keep the tokens per step)"


def test_a_trial_from_scratch_is_never_offered_lora():
    shape = shape_from_hf_config(LLAMA_7B)
    setup = TrainingSetup(precision="bf16", batch_size=1, seq_len=2048)
    assert cheapest_fixes(shape, setup, A100, 8)[0].startswith("use model.peft=lora (~")
    from_scratch = cheapest_fixes(shape, replace(setup, from_scratch=True), A100, 8)
    assert from_scratch and not any("lora" in fix for fix in from_scratch)


def test_refusal_when_nothing_fits():
    shape = shape_from_hf_config(LLAMA_7B)
    tiny_gpu = GpuMemory(GIB, "GPU", "hydra.launcher.gpu_mem_gb")
    setup = TrainingSetup(precision="bf16", batch_size=1, seq_len=2048)
    line = refusal_line(1, shape, setup, plan_memory(shape, setup), tiny_gpu, 8)
    assert line.endswith("> 1 GB per GPU: no change tried fits (LoRA, FSDP, checkpointing, a smaller batch)")


def test_gpu_memory_from_the_launcher_or_the_partition():
    assert gres_gpu_types("gpu:a100:8(S:0-1),gpu:v100:2,shard:4") == ["a100", "v100"]
    assert gres_gpu_types("gpu:4") == [""] and gres_gpu_types("(null)") == []
    assert gpu_memory({}, ["gpu:a100:8(S:0-1)"]).gb == 80
    assert gpu_memory({}, ["gpu:h200:8"]).label == "H200" and gpu_memory({}, ["gpu:h200:8"]).gb == 141
    assert gpu_memory({}, ["gpu:A100-40GB:4"]).gb == 40
    assert gpu_memory({"gres": "gpu:h100:8"}, ["gpu:a100:8"]).gb == 80
    mixed = gpu_memory({}, ["gpu:h100:8", "gpu:a100_40g:8"])
    assert (mixed.label, mixed.gb) == ("A100 40GB", 40)  # the smallest: a trial may land on either
    assert gpu_memory({"gpu_mem_gb": 24}, ["gpu:8"]).bytes == 24 * GIB
    assert gpu_memory({}, ["gpu:8"]) == "the partition's GPU GRES names no type"
    assert "GRES type 'tesla'" in gpu_memory({}, ["gpu:tesla:8"])
    with pytest.raises(ValueError, match=r"^hydra.launcher.gpu_mem_gb=0 is not allowed: the memory of one GPU in GB, > 0$"):
        gpu_memory({"gpu_mem_gb": 0}, [])


def sweep_trial(num: int, overrides: dict, nodes: int = 1, gpus: int | None = None) -> SweepTrial:
    trial = trial_config_from_dict(overrides)
    return SweepTrial(num, [], Path("unused"), Allocation(nodes=nodes, gpus_per_node=gpus), (trial, None))


BIG = {"model": {"hidden_size": 4096, "intermediate_size": 11008, "num_layers": 32, "num_heads": 32, "num_kv_heads": 32,
                 "vocab_size": 32000, "arch": "llama", "max_position_embeddings": 2048},
       "data": {"seq_len": 2048, "batch_size": 1, "synthetic_tokens": 100_000}}


def test_the_sweep_check_refuses_in_one_line_naming_how_many(caplog):
    # One GPU per node: trainer.parallel=auto has no GPUs to shard over, and two GPUs are too few.
    trials = [sweep_trial(0, {}), sweep_trial(1, BIG), sweep_trial(2, BIG, nodes=2)]
    params = {"gpus_per_node": 1}
    with pytest.raises(ValueError) as refused:
        check_memory_plans(trials, params, ["gpu:a100:8(S:0-1)"])
    line = str(refused.value)
    # One rank: no second copy of the gradients in DDP's buckets (~155 GB, not the ~180 GB of 8 ranks).
    # Trained from scratch: no LoRA offered (adapters over random weights).
    assert line.startswith("trial #1: ~155 GB/GPU (training from scratch, DDP) > 80 GB per A100: "
                           "trainer.parallel=fsdp over >= 3 GPUs (trainer.nodes=3)"), line
    assert "lora" not in line and "\n" not in line
    assert line.endswith(" (1 more of the 3 trials do not fit either)")
    check_memory_plans(trials, {**params, "check_memory": False}, ["gpu:a100:8"])
    check_memory_plans(trials, {"gpus_per_node": 0}, ["gpu:a100:8"])  # a CPU partition: nothing to check
    with caplog.at_level(logging.DEBUG, logger="hpcsweep.sweep.memory_check"):
        check_memory_plans(trials, params, ["gpu:8"])
        check_memory_plans(trials[:1], params, ["gpu:h200:8"])
    assert "memory plans not checked: the partition's GPU GRES names no type; set hydra.launcher.gpu_mem_gb" in caplog.text
    assert "memory plan: trial #0: ~2.0 GB/GPU of 141 per H200 (training from scratch, DDP): fits" in caplog.text
    with pytest.raises(ValueError, match=r"^hydra.launcher.check_memory='no' is not allowed: true or false$"):
        check_memory_plans(trials, {**params, "check_memory": "no"}, ["gpu:a100:8"])


def test_a_trials_setup_reads_its_precision_peft_and_parallel_keys():
    trial = trial_config_from_dict({"trainer": {"grad_checkpointing": True, "optimizer": "sgd"}})
    setup = setup_of_trial(trial, world_size=16, device="cuda")
    assert (setup.precision, setup.peft, setup.parallel, setup.fused_attention) == ("bf16", "none", "auto", True)
    assert setup.grad_checkpointing and setup.optimizer == "sgd" and setup.world_size == 16
    assert setup_of_trial(trial, world_size=1, device="cuda", bf16=False).precision == "fp32"
    assert setup_of_trial(trial, world_size=1, device="cpu").fused_attention is False
    later = trial_config_from_dict({"model": {"peft": "lora", "lora": {"r": 16, "target_modules": ["q_proj"]}},
                                    "trainer": {"parallel": "fsdp"}})
    setup = setup_of_trial(later, world_size=4, device="cuda")
    assert (setup.peft, setup.lora_rank, setup.lora_targets, setup.parallel) == ("lora", 16, ("q_proj",), "fsdp")
    # null: the architecture's own targets, resolved by the plan from the model's type.
    assert setup_of_trial(trial_config_from_dict({"model": {"peft": "lora"}}), world_size=1, device="cuda").lora_targets \
        is None
    # trainer.loss_chunk_tokens=null: auto, resolved by the plan with the model's shape; a number as it is.
    assert setup.loss_chunk_tokens == AUTO
    chunked = trial_config_from_dict({"trainer": {"loss_chunk_tokens": 64}})
    assert setup_of_trial(chunked, world_size=1, device="cuda").loss_chunk_tokens == 64


def test_a_pretrained_folder_is_planned_from_its_config_json(tmp_path):
    folder = make_model_folder(tmp_path / "model", weights=False, tokenizer=False)
    config = json.loads((folder / "config.json").read_text())
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder, local_files_only=True))
    model = SimpleNamespace(**{**vars(ModelConfig()), "path": str(folder)})
    assert total_parameters(shape_of_trial(model)) == sum(p.numel() for p in built.parameters())
    assert shape_of_trial(model).vocab_size == config["vocab_size"]


def test_an_architecture_without_a_plan_is_named_and_not_refused(tmp_path, caplog):
    with pytest.raises(ValueError, match=r"^config.json model_type='gpt2' has no memory plan: one of llama, "):
        shape_from_hf_config({"model_type": "gpt2", "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 8,
                              "intermediate_size": 8, "num_hidden_layers": 1})
    with pytest.raises(ValueError, match=r"^config.json has no kv_lora_rank, which the memory plan needs$"):
        shape_from_hf_config({k: v for k, v in V2_LITE.items() if k != "kv_lora_rank"})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    trial = sweep_trial(0, {})
    model = SimpleNamespace(**{**vars(trial.app_config[0].model), "path": str(tmp_path)})
    odd = replace(trial, app_config=(SimpleNamespace(model=model, trainer=trial.app_config[0].trainer,
                                                       data=trial.app_config[0].data), None))
    with caplog.at_level(logging.WARNING, logger="hpcsweep.sweep.memory_check"):
        check_memory_plans([odd], {"gpus_per_node": 8}, ["gpu:a100:8"])
    assert "trial #0: memory plan not checked: config.json model_type='gpt2' has no memory plan" in caplog.text


# The remote-code DeepSeek-MoE-16B, built by its folder's own code: tests/unit/test_remote_code_moe.py.
@pytest.mark.parametrize("config_json", [V2_LITE, LLAMA_7B, MIXTRAL, QWEN_MOE],
                         ids=["deepseek-v2-lite", "llama-2-7b", "mixtral-8x7b", "qwen1.5-moe-a2.7b"])
def test_the_plans_adapters_are_the_trainable_parameters_of_the_wrapped_model(config_json):
    check_adapters_and_layers(config_json)


def test_the_plans_adapters_are_the_trainable_parameters_of_the_wrapped_deepseek_v3():
    # Its own test: 61 layers of 256 experts take peft most of a minute to wrap, even on the meta device.
    check_adapters_and_layers(V3)


def check_adapters_and_layers(config_json: dict) -> None:
    """Parameters, the largest layer and the LoRA adapters as planned from ``config_json``, against
    its transformers model built and wrapped on the meta device."""
    shape = shape_from_hf_config(config_json)
    net = meta_model(config_json)
    layers = [sum(p.numel() for p in layer.parameters()) for layer in net.model.layers]
    assert total_parameters(shape) == sum(p.numel() for p in net.parameters())
    assert largest_layer_parameters(shape) == max(layers)
    setup = TrainingSetup(precision="bf16", batch_size=1, seq_len=2048, peft="lora", lora_rank=8)
    assert plan_memory(shape, setup).trainable_parameters == wrapped_trainable_parameters(net, 8)


def test_the_plan_counts_expert_adapters_only_with_model_lora_experts():
    shape = shape_from_hf_config(V2_LITE)
    setup = TrainingSetup(precision="bf16", batch_size=1, seq_len=2048, peft="lora", lora_rank=8)
    with_experts = plan_memory(shape, setup)
    without = plan_memory(shape, replace(setup, lora_experts=False))
    assert without.trainable_parameters == wrapped_trainable_parameters(meta_model(V2_LITE), 8, experts=False)
    # r x E x ((h + 2I) + (I + h)) a MoE layer: 26 of 27 layers, 64 experts.
    assert with_experts.trainable_parameters - without.trainable_parameters == 26 * 8 * 64 * (2 * 2048 + 3 * 1408)
    # The expert LoRA's transient: every token-expert's x·A·B on gate_up (2I wide) in bf16, no W + s·BA; and
    # each MoE layer's A and B copied in bf16 for the grouped GEMMs, kept for the backward.
    tokens = 2048
    assert with_experts.temporaries - without.temporaries == tokens * 6 * 2 * 1408 * 2 + 26 * 64 * 8 * (
        (2 * 1408 + 2048) + (2048 + 1408)) * 2 + 4 * (with_experts.trainable_parameters - without.trainable_parameters)


def test_the_largest_fsdp_layer_of_a_dense_model_counts_its_whole_mlp():
    shape = shape_from_hf_config(LLAMA_7B)
    h, inter = 4096, 11008
    assert largest_layer_parameters(shape) == 4 * h * h + 3 * h * inter + 2 * h


def test_fsdp_without_resharding_after_forward_holds_every_layer_gathered():
    shape = shape_from_hf_config(LLAMA_7B)
    setup = TrainingSetup(precision="bf16", batch_size=1, seq_len=2048, world_size=8, parallel="fsdp")
    resharded = plan_memory(shape, setup)
    kept = plan_memory(shape, replace(setup, reshard_after_forward=False))
    gathered_anyway = 2 * largest_layer_parameters(shape) + (32000 * 4096 * 2 + 4096)  # two layers and the root
    assert kept.temporaries - resharded.temporaries == 2 * (total_parameters(shape) - gathered_anyway)
    trial = trial_config_from_dict({"trainer": {"fsdp_reshard_after_forward": False}})
    assert setup_of_trial(trial, world_size=8, device="cuda").reshard_after_forward is False


def test_the_loss_at_the_head_holds_one_chunk_and_the_chunked_logits_the_whole_batchs_in_the_compute_dtype():
    shape = shape_from_hf_config(V3)
    setup = TrainingSetup(precision="bf16", batch_size=8, seq_len=4096)
    tokens, vocab = 8 * 4096, 129280
    assert plan_memory(shape, setup).loss == 12 * tokens * vocab  # logits, fp32 copy, log-softmax, gradient
    at_the_head = plan_memory(shape, replace(setup, loss_chunk_tokens=1024))
    assert at_the_head.loss == 16 * 1024 * vocab  # one chunk's logits twice, its upcast, log-softmax, gradient
    assert plan_memory(shape, replace(setup, loss_chunk_tokens=1024, precision="fp32")).loss == 12 * 1024 * vocab
    # A LoRA adapter on lm_head: the head is no longer a plain linear layer, the loss takes the logits.
    on_logits = replace(setup, loss_chunk_tokens=1024, peft="lora", lora_targets=("q_proj", "lm_head"))
    assert plan_memory(shape, on_logits).loss == 2 * tokens * vocab + 12 * 1024 * vocab
    assert plan_memory(shape, replace(on_logits, loss_chunk_tokens=0)).loss == 14 * tokens * vocab  # one chunk


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("config", [LLAMA_7B, V3, MOE_16B], ids=["llama-7b", "deepseek-v3", "deepseek-moe-16b"])
def test_the_plan_counts_the_chunk_the_loss_will_run(config, device):
    """``trainer.loss_chunk_tokens=null``: the plan and the trainer resolve it through one function."""
    from hpcsweep.train.head_loss import HeadLoss

    shape = shape_from_hf_config(config)
    setup = TrainingSetup(precision="bf16", batch_size=8, seq_len=4096, device=device, loss_chunk_tokens=AUTO)
    tokens, vocab = 8 * 4096, config["vocab_size"]
    head = HeadLoss(torch.nn.Linear(config["hidden_size"], vocab, bias=False, device="meta"), "torch", None, device)
    chunk = resolved_loss_chunk(shape, setup)
    assert head.chunk_for(tokens) == chunk == loss_chunk_tokens(None, device, vocab, config["hidden_size"], tokens)
    assert plan_memory(shape, setup).loss == 16 * chunk * vocab
    # On logits that exist (a LoRA adapter on lm_head), as hpcsweep.train.loss resolves it: no hidden size.
    on_logits = replace(setup, peft="lora", lora_targets=("q_proj", "lm_head"))
    assert resolved_loss_chunk(shape, on_logits) == loss_chunk_tokens(None, device, vocab, None, tokens)


def test_auto_plans_256_token_chunks_on_cpu_and_the_cuda_rule_on_a_gpu():
    shape = shape_from_hf_config(V3)
    setup = TrainingSetup(precision="bf16", batch_size=8, seq_len=4096, loss_chunk_tokens=AUTO)
    assert plan_memory(shape, setup).loss == 16 * 1024 * 129_280  # Liger's 2048 rows, within 512 MiB of fp32 logits
    assert plan_memory(shape, replace(setup, device="cpu", precision="fp32")).loss == 12 * 256 * 129_280


def test_a_remote_code_deepseek_moe_folder_is_planned_not_skipped(tmp_path, caplog):
    (tmp_path / "config.json").write_text(json.dumps({**MOE_16B, "auto_map": {"AutoModelForCausalLM": "m.M"}}))
    model = SimpleNamespace(**{**vars(ModelConfig()), "path": str(tmp_path)})
    shape = shape_of_trial(model)
    # Its model card: 16.4B parameters.
    assert (shape.moe_layers, total_parameters(shape)) == (27, pytest.approx(16.4e9, rel=0.01))
    trial = sweep_trial(0, {"model": {"peft": "lora"}})
    folder_trial = replace(trial, app_config=(SimpleNamespace(
        model=SimpleNamespace(**{**vars(trial.app_config[0].model), "path": str(tmp_path)}),
        trainer=trial.app_config[0].trainer, data=trial.app_config[0].data, tasks=trial.app_config[0].tasks,
        objective=trial.app_config[0].objective), None))
    with caplog.at_level(logging.INFO, logger="hpcsweep.sweep.memory_check"):
        check_memory_plans([folder_trial], {"gpus_per_node": 8}, ["gpu:a100:8"])
    assert "not checked" not in caplog.text
    assert re.search(r"trial #0: ~\d+ GB/GPU of 80 per A100 \(LoRA r=16, DDP\): fits", caplog.text), caplog.text


def write_folder(folder: Path, kind: str) -> Path:
    """A dense (Llama) or MoE (DeepSeek-V3) folder whose weights dominate a CPU worker's memory
    (a large vocabulary, many experts) while a step of a few tokens stays cheap."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    sizes = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                 max_position_embeddings=256)
    if kind == "dense":
        net = LlamaForCausalLM(LlamaConfig(vocab_size=32000, num_key_value_heads=2, **sizes))
    else:
        net = DeepseekV3ForCausalLM(DeepseekV3Config(
            vocab_size=16000, num_key_value_heads=4, moe_intermediate_size=512, n_routed_experts=16,
            num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=None,
            kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, n_group=1, topk_group=1,
            **sizes))
    net.save_pretrained(folder)
    return folder


def test_the_plan_of_a_cpu_trial_is_within_20_percent_of_its_measured_peak(tmp_path):
    import subprocess
    import sys

    from hpcsweep.train.checkpoint.store import read_metadata

    folders = {kind: write_folder(tmp_path / f"{kind}-model", kind) for kind in ("dense", "moe")}
    runs = {}
    # Full fine-tuning of a dense and a MoE folder, and LoRA over the dense one.
    for name, kind, peft in (("dense", "dense", "none"), ("moe", "moe", "none"), ("dense-lora", "dense", "lora")):
        trial_dir = make_trial_dir(tmp_path / name, {
            "model.path": str(folders[kind]), "model.peft": peft, "data.batch_size": 2,
            "data.seq_len": 32, "data.synthetic_tokens": 20_000, "trainer.device": "cpu", "trainer.precision": "fp32",
            "trainer.max_steps": 3, "trainer.warmup_steps": 0, "trainer.log_every": 3, "trainer.eval_every": 3,
            "trainer.eval_batches": 1, "trainer.ckpt_every": 0,
        })
        # A process of its own each: the resident-set peak is the process's.
        runs[name] = (trial_dir, subprocess.Popen([sys.executable, "-m", "hpcsweep.train", str(trial_dir)],
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for kind, (trial_dir, process) in runs.items():
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        metrics = read_metrics(trial_dir)
        plan, peak = metrics["memory_plan"], metrics["memory_peak"]
        assert plan["setup"]["precision"] == "fp32" and peak["source"] == "VmHWM"
        assert plan["total_bytes"] == pytest.approx(peak["bytes"], rel=0.2), (kind, plan["bytes"], peak)
        if plan["setup"]["peft"] == "none":
            # The model's own tensors are most of it, not the interpreter: the check can fail.
            assert plan["total_bytes"] - plan["bytes"]["overhead"] > plan["bytes"]["overhead"]
        if plan["setup"]["peft"] == "lora":
            # The adapters, as the checkpoint (and so the export) holds them, are what the plan counted.
            (checkpoint,) = (trial_dir / "checkpoints").glob("step*")
            saved = read_metadata(checkpoint / "model").state_dict_metadata
            assert plan["parameters"]["trainable"] == sum(math.prod(meta.size) for meta in saved.values()) > 0


LLAMA_7B_OVERRIDES = [
    "model=llama_small", "model.hidden_size=4096", "model.intermediate_size=11008", "model.num_layers=32",
    "model.num_heads=32", "model.num_kv_heads=32", "model.vocab_size=32000", "model.max_position_embeddings=2048",
    "data.seq_len=2048", "data.batch_size=1", "data.synthetic_tokens=100000", "trainer.parallel=ddp",
]


def test_python_m_hpcsweep_plan_prints_each_plan_part_by_part_on_the_login_node():
    import subprocess
    import sys

    args = ["-m", *LLAMA_7B_OVERRIDES, "model.peft=none,lora", "hydra.launcher.gres=gpu:a100:8"]
    code = ("import sys; from hpcsweep import plan; rc = plan.main(sys.argv[1:]); "
            "print('torch imported:', 'torch' in sys.modules); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "torch imported: False"
    full_at = lines.index("trial #0: training from scratch, DDP, bf16, 8 GPU(s), data.batch_size=1 x data.seq_len=2048")
    lora_at = lines.index("trial #1: LoRA r=16, DDP, bf16, 8 GPU(s), data.batch_size=1 x data.seq_len=2048")
    full = {line.split()[0]: line for line in lines[full_at + 1:lora_at]}
    # The breakdown is the plan's, part by part, with its bytes a parameter.
    shape = shape_from_hf_config(LLAMA_7B)
    # The trainer's own loss setting: trainer.loss_chunk_tokens=null, resolved for CUDA and the model's sizes.
    assert trial_config_from_dict({}).trainer.loss_chunk_tokens is None
    plan = plan_memory(shape, TrainingSetup(precision="bf16", batch_size=1, seq_len=2048, world_size=8,
                                            loss_chunk_tokens=AUTO))
    assert list(full) == ["parameters", *plan.parts, "total"]
    for part, nbytes in plan.parts.items():
        assert f" {nbytes / GIB:.2f} GB" in full[part]
    assert "6.0 B/param" in full["weights"] and "8.0 B/param" in full["gradients"] and "8.0 B/param" in full["optimizer"]
    assert full["total"].endswith("~180 GB/GPU of 80 per A100 (training from scratch, DDP): does not fit")
    assert lines[lora_at + 9].endswith("GB/GPU of 80 per A100 (LoRA r=16, DDP): fits")
    refused = subprocess.run([sys.executable, "-m", "hpcsweep.plan", "data.batch_size=0"], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and refused.stderr.startswith("error: trial #0 (data.batch_size=0): ")


def test_report_and_status_show_the_plan_against_the_peak_it_compares_with(tmp_path, capsys):
    from hpcsweep import report, status
    from tests.unit.sweep_fixtures import make_sweep, metrics

    gib = 2**30
    cuda = {**metrics("completed"), "memory_plan": {"tensors_bytes": int(18.5 * gib), "total_bytes": int(20.5 * gib)},
            "memory_peak": {"bytes": int(16.2 * gib), "source": "torch.cuda.max_memory_allocated"}}
    # On CPU the peak is the process's resident set: the plan's total (interpreter included) is what compares.
    cpu = {**metrics("completed"), "memory_plan": {"tensors_bytes": int(0.5 * gib), "total_bytes": int(0.9 * gib)},
           "memory_peak": {"bytes": int(1.0 * gib), "source": "ru_maxrss"}}
    unplanned = {**metrics("completed"), "memory_plan": {"verdict": "not planned", "error": "..."},
                 "memory_peak": {"bytes": int(3.0 * gib), "source": "torch.cuda.max_memory_allocated"}}
    make_sweep(tmp_path, [(["model.lr=1e-4"], cuda), (["model.lr=1e-3"], cpu), (["model.lr=1e-2"], unplanned)])
    assert report.main([str(tmp_path)]) == 0
    header, *rows = capsys.readouterr().out.splitlines()[:4]
    assert header.split()[-1] == "GB(plan/peak)"
    assert [row.split()[-1] for row in rows] == ["18.5/16.2", "0.9/1.0", "-/3.0"]
    status.main([str(tmp_path)])
    shown = capsys.readouterr().out
    assert "GB(plan/peak) 18.5/16.2" in shown and "GB(plan/peak) 0.9/1.0" in shown and "GB(plan/peak) -/3.0" in shown


def test_trials_with_the_same_plan_share_one_line_in_the_order_first_met():
    from hpcsweep.sweep.memory_check import grouped_plan_lines, trial_numbers

    assert trial_numbers([5, 0, 2, 1]) == "trials #0-2,5" and trial_numbers([3]) == "trial #3"
    planned = [(0, "~31 GB/GPU … LoRA"), (1, "~180 GB/GPU … full"), (2, "~31 GB/GPU … LoRA"), (3, "~31 GB/GPU … LoRA")]
    assert grouped_plan_lines(planned) == ["trials #0,2-3: ~31 GB/GPU … LoRA", "trial #1: ~180 GB/GPU … full"]


@pytest.mark.parametrize(("arch", "experts"), [("deepseek_v3", True), ("deepseek_v3", False), ("llama", True)])
def test_the_plans_trainable_count_is_what_the_trainers_lora_trains(arch, experts):
    """The trainer's own wrapping (``hpcsweep.train.lora.apply_lora``, expert LoRA included) against the
    plan of the same config: one list of targets, one count."""
    from hpcsweep.memory_plan import trial_setup
    from hpcsweep.train import lora, model

    cfg = trial_config_from_dict({"model": {"arch": arch, "peft": "lora", "lora": {"experts": experts}}})
    net = lora.apply_lora(model.build_model(cfg.model, 0, "eager"), cfg.model, seed=0)
    trains = sum(p.numel() for p in net.parameters() if p.requires_grad)
    planned = plan_memory(trial_setup.shape_of_trial(cfg.model),
                          trial_setup.setup_of_trial(cfg, world_size=1, device="cpu")).trainable_parameters
    assert trains == planned


@pytest.mark.parametrize(
    ("setup_changes", "entry_bytes"),
    [
        ({}, 0),  # SDPA on whole rows: its causal flag, no mask
        ({"packed_rows": True}, 1),  # SDPA on packed rows: a boolean B x T x T mask
        ({"packed_rows": True, "flash_attention": True}, 0),  # flash: variable-length sequences
        ({"fused_attention": False}, 4),  # eager's own float mask
        ({"fused_attention": False, "packed_rows": True}, 4),  # hpcsweep's float mask in its place
        ({"fused_attention": False, "packed_rows": True, "own_code": True}, 8),  # a 1/0 mask and its additive copy
    ],
)
def test_the_plan_counts_the_attention_mask_a_forward_holds(setup_changes, entry_bytes):
    shape = shape_from_model_config(ModelConfig(arch="llama"))
    base = TrainingSetup(precision="bf16", batch_size=16, seq_len=4096)
    plain = plan_memory(shape, replace(base, fused_attention=setup_changes.get("fused_attention", True)))
    planned = plan_memory(shape, replace(base, **setup_changes))
    eager_mask = 0 if setup_changes.get("fused_attention", True) else 4 * 16 * 4096**2
    assert planned.activations - (plain.activations - eager_mask) == entry_bytes * 16 * 4096**2
